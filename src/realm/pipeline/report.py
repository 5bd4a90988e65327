"""The run report: `report.md` and `report.html` (plots inline), written only from the run's own records.

Every number comes from a stage record (`<run>/stages/<stage>.json`), a trainer's `metrics.jsonl` or `plan.json`;
the only constants are the paper's published numbers, shown beside ours and labelled as the paper's.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from pathlib import Path

from realm.common.io import write_atomic
from realm.common.provenance import describe_commit
from realm.config import PretrainConfig, StageCosts, read_run_config
from realm.pipeline.ablations import (
    ablation_curves,
    ablation_rows,
    ablation_table,
    ablations,
    measure_rows,
    measure_table,
)
from realm.pipeline.curves import CURVES, plot_curves
from realm.pipeline.document import ReportDocument
from realm.pipeline.estimate import WARMUP_FINDING, reader_warmup_steps, retrieval_step_seconds
from realm.pipeline.headline import headline
from realm.pipeline.plan import PipelinePlan
from realm.pipeline.records import ExamplesRecord
from realm.pipeline.report_qa import qa_start_section, qa_tables, reader_training_section
from realm.pipeline.stage_table import MAIN_QA, kind_of
from realm.pipeline.stages import step_seconds
from realm.recipes.warmup import OWN_BLOCK_READINGS
from realm.training.metrics import read_metrics


def _configuration(doc: ReportDocument, r: dict, plan: PipelinePlan, code: dict | None) -> None:
    preset = plan.preset
    doc.heading("Configuration")
    corpus = r.get("corpus", {})
    doc.table(
        ["setting", "value"],
        [
            ["code", describe_commit(code)],
            ["preset", preset.name],
            [
                "budget",
                f"{plan.budget_minutes:g} min (training steps x{plan.scale:.3f} of the preset)"
                if plan.budget_minutes
                else "none (the preset's step counts)",
            ],
            ["estimated time", f"{plan.estimated_minutes:.1f} min"],
            [
                "corpus",
                f"{corpus.get('documents')} documents -> {corpus.get('blocks')} blocks of <= "
                f"{preset.corpus.max_block_tokens} wordpieces (fingerprint {corpus.get('fingerprint')})",
            ],
            ["warm start", r.get("warm_start", {}).get("model")],
            [
                "ICT",
                f"{preset.ict.steps} steps, batch {preset.ict.batch_size}, lr {preset.ict.lr:g}"
                if preset.ict.steps
                else "none: REALM starts from the warm start",
            ],
            ["REALM pretraining", pretraining_setting(_trained(preset.pretrain, r.get("realm")), plan.reading_minutes)],
            ["pretraining sentences", _sentence_usage(r.get("realm", {}).get("sentences"))],
            [
                "QA fine-tuning",
                f"{r['qa']['train']['steps']} steps, batch {preset.qa.batch_size}, lr {preset.qa.lr:g}, "
                f"top-{preset.qa.top_k} blocks, beam {preset.qa.beam}"
                if "qa" in r
                else "not run (no --qa-train / --qa-dev)",
            ],
        ],
    )


def _trained(cfg: PretrainConfig, realm: dict | None) -> PretrainConfig:
    """REALM's config with the steps it trained (its deadline settled them), once it has trained."""
    steps = (realm or {}).get("steps_trained")
    if not steps:
        return cfg
    trained = steps["trained"]
    return dataclasses.replace(cfg, steps=trained["steps"], null_warmup_steps=trained["null_warmup_steps"])


def pretraining_setting(cfg: PretrainConfig, reading_minutes: float | None = None) -> str:
    """The REALM pretraining row of the configuration table: what a reader of the report needs to rerun it.
    `reading_minutes`: the plan's budget that would give a warm-up cut short its full length."""
    window = f", {cfg.reader_warmup_window} words each side of the sentence" if cfg.reader_warmup_window else ""
    warmup = (
        "the null document alone"
        if cfg.reader_warmup == "null"
        else f"the null document and a block ({cfg.reader_warmup} warm-up{window})"
    )
    if cfg.reader_warmup in OWN_BLOCK_READINGS and cfg.null_warmup_steps < (needed := reader_warmup_steps(cfg)):
        needs = f": a budget of about {math.ceil(reading_minutes)} min gives it them" if reading_minutes else ""
        warmup += f" (fewer than the {needed:,} the held-out gain needed in {WARMUP_FINDING}{needs})"
    return (
        f"{cfg.steps} steps, batch {cfg.batch_size}, lr {cfg.lr:g}, {cfg.num_candidates} candidates incl. null, "
        f"{cfg.masking} masking, "
        + (
            "document tower fixed (the first index stays exact), "
            if cfg.doc_tower == "fixed"
            else f"refresh every {cfg.refresh_every} steps, "
        )
        + f"first {cfg.null_warmup_steps} on {warmup}, "
        + ("query tower" if cfg.doc_tower == "fixed" else "towers")
        + f" frozen for {cfg.towers_start_step} steps, reader loss {cfg.reader_loss}"
    )


def _sentence_usage(usage: dict | None) -> str | None:
    """Which training sentences the masking scheme used, and where every mask came from."""
    if usage is None:
        return None
    share = f"{usage['used']:,} of {usage['sentences']:,} training sentences ({100 * usage['share_used']:.1f}%)"
    if usage["masking"] == "salient":
        return f"{share} have a maskable salient span and were used; every mask is a salient span (no random fallback)"
    return f"{share}, every mask drawn by {usage['masking']} masking"


BUDGET_BAND = (0.90, 1.05)  # a run ends within these shares of its budget, or its report says it did not


def budget_line(plan: PipelinePlan, ended: float, complete: bool) -> tuple[str, str | None]:
    """The report's first words: how long the run took against its budget (from its beginning to `ended`: its last
    stage's end, or now while it runs), and a warning where a finished run ended outside BUDGET_BAND of it (None:
    inside, or no budget)."""
    if plan.budget_minutes is None or plan.began is None:
        return f"No budget: the preset's step counts ({plan.estimated_minutes:.0f} min estimated).", None
    took, budget = (ended - plan.began) / 60, plan.budget_minutes
    if not complete:
        ends = time.strftime("%H:%M", time.localtime(plan.began + 60 * budget))
        return f"**{took:.1f} min of a {budget:g}-minute budget so far** (the run ends by {ends}).", None
    share = took / budget
    line = f"**Took {took:.1f} min of a {budget:g}-minute budget ({share:.2f} of it).**"
    low, high = BUDGET_BAND
    if low <= share <= high:
        return line, None
    side = "over" if share > high else "under"
    return line, (
        f"**Warning:** the run ended {side} its budget, outside {low:.2f}-{high:.2f} of it; the Stages table shows "
        "which stage took more or less than it was allotted."
    )


def _phase_rows(name: str, steps: dict | None, rows: list[dict], costs: StageCosts, cfg: PretrainConfig) -> list:
    """A training stage's phases: steps planned and trained, seconds a step estimated and measured (REALM: its
    reader warm-up and its retrieval steps apart)."""
    if steps is None:
        return []
    planned, trained = steps["planned"], steps["trained"]

    def row(phase: str, planned_steps: int, trained_steps: int, estimate: float, first: int, last: int) -> list:
        measured = step_seconds(rows, first, last)
        per_step = f"{estimate:.2f} / {measured:.2f}" if measured is not None else f"{estimate:.2f} / -"
        return [f"{name}: {phase}", None, None, None, f"{planned_steps:,} / {trained_steps:,}", per_step]

    kind = kind_of(name)
    if kind == "realm" and trained["null_warmup_steps"]:
        warm, total = trained["null_warmup_steps"], trained["steps"]
        return [
            row("reader warm-up", planned["null_warmup_steps"], warm, costs.null_pretrain_step, 0, warm),
            row(
                "retrieval steps",
                planned["steps"] - planned["null_warmup_steps"],
                total - warm,
                retrieval_step_seconds(cfg, costs),
                warm,
                total,
            ),
        ]
    estimate = {
        "realm": retrieval_step_seconds(cfg, costs),
        "read": costs.read_step,
        "qa": costs.qa_step,
        "ict": costs.ict_step,
    }[kind or "qa"]
    return [row("steps", planned["steps"], trained["steps"], estimate, 0, trained["steps"])]


def _stages(doc: ReportDocument, records: dict, plan: PipelinePlan, run_dir: Path) -> None:
    doc.heading("Stages")
    if plan.budget_minutes:
        doc.paragraph(
            f"Training first: the plan gave training steps {plan.training_minutes:.1f} of the "
            f"{plan.budget_minutes:g} budgeted minutes ({100 * plan.training_minutes / plan.budget_minutes:.0f}%; the "
            f"rule: {plan.to_dict()['training_share_rule']}). The stages before the plan (the corpus, the warm "
            "start, the off-the-shelf index, the calibration) ran before anything could be estimated: their minutes "
            "count against the budget as they took. Each stage after the plan was allotted, as it began, what was "
            "left of the budget less the stages after it at the run's pace; a trainer ends its steps by its "
            "deadline (its reader warm-up by time, the steps whose rate decays sized to the time left, then once "
            "more from their own first steps), an evaluation scores in a seeded order until its allotment ends. Steps: planned / "
            "trained; seconds a step: estimated / measured."
        )
    timings = _stage_timings(run_dir)
    estimated = {s.name: s.seconds for s in plan.stages}
    table = []
    for name, record in records.items():
        allotted = timings.get(name, {}).get("allotted")
        table.append(
            [
                name,
                f"{estimated[name] / 60:.2f}" if name in estimated else "before the plan",
                f"{allotted / 60:.2f}" if allotted is not None else None,
                f"{record.seconds / 60:.2f}" + (" (resumed: after the cut)" if record.resumed else ""),
                None,
                None,
            ]
        )
        steps = record.result.get("steps_trained") if isinstance(record.result, dict) else None
        rows = read_metrics(run_dir / name) if steps else []
        table += _phase_rows(name, steps, rows, plan.preset.costs, plan.preset.pretrain)
    table += [
        [name, f"{seconds / 60:.2f}", None, "pending", None, None]
        for name, seconds in estimated.items()
        if name not in records
    ]
    doc.table(["stage", "estimated min", "allotted min", "took min", "steps", "s a step"], table)


def _stage_timings(run_dir: Path) -> dict[str, dict]:
    path = run_dir / "plan.json"
    return json.loads(path.read_text()).get("stage_timings", {}) if path.is_file() else {}


def _curves(doc: ReportDocument, run_dir: Path, records: dict) -> None:
    doc.heading("Training curves")
    for stage in CURVES:
        if stage in records:
            png = plot_curves(stage, read_metrics(run_dir / stage), run_dir / "plots" / f"{stage}.png")
            if png is not None:
                doc.paragraph(f"{stage}: " + ", ".join(CURVES[stage]) + " against the training step.")
                doc.image(png, f"{stage} training curves")


def _scored_sample(examples: ExamplesRecord) -> str:
    """Whether the held-out sentences scored are all of them or the plan's seeded sample."""
    if examples.all_scored:
        return ""
    return (
        f"; a sample, drawn with a fixed seed, of the {examples.held_out_sentences:,} held-out sentences with a "
        "salient span, sized by "
        "the plan to what the budget left after training (with a budget: scored until the stage's allotment ended)"
    )


def _held_out_part(examples: ExamplesRecord) -> str:
    """Which held-out sentences a run scored: the test half of the held-out documents (a run before the split: all)."""
    if examples.held_out_part != "test":
        return ""
    return " in the test half of the held-out documents (the tuning half is for comparing settings)"


def _examples(doc: ReportDocument, r: dict, plan: PipelinePlan) -> None:
    """Masked-token accuracy on held-out sentences with and without retrieval, by where the span is; then the
    worked examples."""
    ex = ExamplesRecord.from_dict(r["examples"])
    scored = ex.with_retrieval
    doc.heading("Does retrieval help the language model? (held-out sentences)")
    doc.table(
        ["reader input", "masked-token accuracy", "whole-span accuracy", "retrieval utility (nats/mask)"],
        [
            ["null document only", scored.null_token_accuracy, scored.null_span_accuracy, None],
            [
                f"{plan.preset.pretrain.num_candidates} candidates incl. null (marginal)",
                scored.token_accuracy,
                scored.span_accuracy,
                scored.utility,
            ],
        ],
    )
    low, high = scored.interval
    spans = f"{scored.spans:,} " if scored.spans is not None else ""
    doc.paragraph(
        f"Retrieval gain in masked-token accuracy, paired over the same masks: {scored.retrieval_gain:+.2f} points, "
        f"95% bootstrap interval [{low:+.2f}, {high:+.2f}] over {scored.sentences} sentences (their "
        f"{spans}salient spans, each masked in turn{_scored_sample(ex)})"
        + (" (excludes 0)." if low > 0 or high < 0 else " (includes 0: no clear gain).")
    )
    split = scored.by_recoverability
    if split:
        doc.paragraph(
            f"Recoverable masked spans (a block of another document holds the span's words): "
            f"{scored.recoverable_share:.1f}%, the ceiling of what retrieval can give; held by a "
            f"candidate given to the reader: {scored.retrieved_share:.1f}%. The gain by where the "
            "span is (token accuracy points, 95% bootstrap interval over spans):"
        )
        doc.table(
            ["masked span", "spans", "retrieval gain", "95% interval"],
            [
                [name.replace("_", " "), g.spans, g.retrieval_gain, "[{:+.2f}, {:+.2f}]".format(*g.interval)]
                for name, g in split.items()
            ],
        )
    if ex.held_out_sentences_tagged is not None:
        doc.paragraph(
            f"Held-out sentences with a maskable salient span: {ex.held_out_sentences:,} of "
            f"{ex.held_out_sentences_tagged:,}{_held_out_part(ex)}; the others have nothing to mask and are left out."
        )
    _worked_examples(doc, ex)


def _worked_examples(doc: ReportDocument, ex: ExamplesRecord) -> None:
    """The paper's Table 3: held-out sentences, the block retrieval chose and what it did to the masked span."""
    doc.heading("Worked examples (like the paper's Table 3)")
    doc.paragraph(
        f"The {len(ex.examples)} of the first {ex.pool} held-out sentences where the top retrieved block "
        "raised the probability of the masked span the most over no retrieval (p with it minus p without); span "
        "probabilities are products over its wordpieces."
    )
    doc.table(
        [
            "masked sentence",
            "answer",
            "p without retrieval",
            "top retrieved block",
            "p(z|x)",
            "block holds the span",
            "p with that block",
            "marginal p",
        ],
        [
            [
                e.masked_sentence,
                e.answer,
                f"{e.p_without_retrieval:.2e}",
                f"{e.top_block_title}: {e.top_block_text[:240]}",
                e.p_top_block,
                None if e.top_block_holds_span is None else ("yes" if e.top_block_holds_span else "no"),
                f"{e.p_with_top_block:.2e}",
                f"{e.p_marginal:.2e}",
            ]
            for e in ex.examples
        ],
    )


def _use_this_run(doc: ReportDocument, run_dir: Path, r: dict, plan: PipelinePlan) -> None:
    """The exact `realm ask` / `realm serve` lines for this run's own model and index folders: the fine-tuned QA
    model over its start's index, or without QA data REALM's retriever over its own index (search only)."""
    doc.heading("Use this run")
    qa_config = read_run_config(run_dir / "qa") if "qa" in r else None
    if qa_config is not None:
        model, index = run_dir / "qa" / "best", qa_config["config"]["index"]  # the index fine-tuning read
        retriever = plan.preset.qa.retriever
        doc.paragraph(
            f"The fine-tuned model `{model}` reads blocks from the index of the retriever it started from, `{index}` "
            f"(fine-tuning changes only the query tower; retrieval: {retriever}, as it was trained):"
        )
        doc.code(
            f'realm ask --model {model} --index {index} --retriever {retriever} "Who wrote Hamlet?"\n'
            f"realm serve --model {model} --index {index} --retriever {retriever} --port 8000"
        )
    else:
        model, index = run_dir / "realm", run_dir / "realm" / "index"
        doc.paragraph(
            "Without QA data the run trains no answer reader (`realm ask` would answer with noise); REALM's retriever "
            "searches its own index:"
        )
        doc.code(f'realm search --model {model} --index {index} "Who wrote Hamlet?" -k 5')


def write_report(
    run_dir: Path, records: dict, plan: PipelinePlan, seconds: float, command: str, complete: bool = True
) -> Path:
    """Write `report.md` and `report.html` (everything) and `results.md` (the numbers and the command only)
    in `run_dir`, from the stage records of this run. The pipeline writes them after every stage
    (`complete=False`), so a long run has a report of what has finished so far."""
    run_dir = Path(run_dir)
    r = {name: record.result for name, record in records.items()}
    planned = {s.name for s in plan.stages}
    pretrain, ict = plan.preset.pretrain, plan.preset.ict.steps > 0
    has_ablations = MAIN_QA in r and any(a.other_stage in planned for a in ablations(pretrain, ict))
    compared = ablation_rows(r, pretrain, ict) if has_ablations else []  # read once, shown twice
    measured = measure_rows(r, pretrain, ict) if has_ablations else []
    status = (
        "" if complete else f" **In progress:** {len(records)} stages done; the Stages table lists those still pending."
    )
    code = json.loads((run_dir / "plan.json").read_text()).get("code") if (run_dir / "plan.json").is_file() else None
    doc = ReportDocument()
    doc.heading(f"REALM pipeline report: {run_dir.name}", 1)
    ended = max(record.finished for record in records.values()) if complete and records else time.time()
    budget, warning = budget_line(plan, ended, complete)
    doc.paragraph(budget + (f" {warning}" if warning else ""))
    headline(doc, r, plan, compared)
    doc.paragraph(
        f"Written {time.strftime('%Y-%m-%d %H:%M:%S %Z')} by `{command}`; this invocation took "
        f"{seconds / 60:.1f} min (stages reused from earlier invocations are not counted). "
        "Every number below comes from this run's stage records, metrics logs and plan." + status
    )
    _configuration(doc, r, plan, code)
    _stages(doc, records, plan, run_dir)
    _curves(doc, run_dir, records)
    if "qa_start" in r:
        qa_start_section(doc, r)
        reader_training_section(doc, records)
    if "eval" in r:
        qa_tables(doc, r, plan)
    if has_ablations:
        measure_table(doc, measured)
        ablation_table(doc, compared)
        ablation_curves(doc, run_dir, records)
    if "examples" in r:
        _examples(doc, r, plan)
    if complete:
        _use_this_run(doc, run_dir, r, plan)

    results = ReportDocument()
    results.heading(f"Results of `realm pipeline` ({run_dir.name})", 1)
    results.paragraph(f"Command: `{command}`. Written {time.strftime('%Y-%m-%d')} from the run's own records." + status)
    results.paragraph(budget + (f" {warning}" if warning else ""))
    headline(results, r, plan, compared)
    _configuration(results, r, plan, code)
    _stages(results, records, plan, run_dir)
    if "qa_start" in r:
        qa_start_section(results, r)
        reader_training_section(results, records)
    if "eval" in r:
        qa_tables(results, r, plan)
    if has_ablations:
        measure_table(results, measured)
        ablation_table(results, compared)

    report = run_dir / "report.md"
    write_atomic(report, lambda tmp: tmp.write_text(doc.markdown(run_dir), encoding="utf-8"))
    write_atomic(
        run_dir / "report.html",
        lambda tmp: tmp.write_text(doc.html(f"REALM pipeline report: {run_dir.name}"), encoding="utf-8"),
    )
    write_atomic(run_dir / "results.md", lambda tmp: tmp.write_text(results.markdown(run_dir), encoding="utf-8"))
    return report
