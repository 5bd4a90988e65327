"""docs/results.md, generated from `realm pipeline` run records: what today's commands give.

One table per command (pyserini's reproduction pages), a row per run: the machine it ran on, when, how long its
stages took, and its figures, every one read from the run's `plan.json` and stage records. The records themselves
are copied beside the page (`<page folder>/runs/<run name>/`: plan.json, stages/*.json, results.md), so the page
links to them and regenerates from the repository alone: `realm results docs/runs/* --out docs/results.md`.
"""

from __future__ import annotations

import json
import shlex
import shutil
import time
from collections.abc import Sequence
from pathlib import Path

from realm.common.io import write_atomic
from realm.common.provenance import describe_commit
from realm.pipeline.ablations import ABLATION_COLUMNS, MEASURE_COLUMNS, AblationRow, MeasureRow, table2
from realm.pipeline.document import ReportDocument
from realm.pipeline.records import EvalRecord, ExamplesRecord
from realm.pipeline.stages import STAGES

SEEDS_SUMMARY = "seeds.json"  # pipeline/seeds.py writes it beside the seeds' runs
RECORDS = ("plan.json", "results.md")  # with stages/*.json: all a row reads, and the run's own numbers page
# options that name where a run went, not what it computed, and the seeds of a recipe's replicates (with their values)
PER_RUN_OPTIONS = {"--run-dir": True, "--quiet": False, "--seed": True, "--seeds": True}


def load_records(run_dir: Path) -> tuple[dict, dict[str, dict]]:
    """A run's plan and its finished stages' records (name -> record)."""
    plan_path = run_dir / "plan.json"
    if not plan_path.is_file():
        raise FileNotFoundError(f"{run_dir}: no plan.json (not a `realm pipeline` run, or one cut before its plan)")
    stages = {p.stem: json.loads(p.read_text()) for p in sorted((run_dir / STAGES).glob("*.json"))}
    return json.loads(plan_path.read_text()), {name: r for name, r in stages.items() if not name.endswith(".started")}


def command_of(plan: dict) -> str:
    """The command with the options that only say where the run went (and which seed it was) left out: runs of one
    command share a table, and a seed's run is a replicate of its recipe."""
    words, kept = shlex.split(plan["options"]["command"]), []
    skip = False
    for word in words:
        if skip:
            skip = False
        elif word in PER_RUN_OPTIONS:
            skip = PER_RUN_OPTIONS[word]
        else:
            kept.append(word)
    return shlex.join(kept)


def machine_of(plan: dict) -> str:
    machine = plan.get("machine")
    if machine is None:
        return f"not recorded ({plan['compute_dtype']})"
    cpu = f"{machine['cores']}-core {machine['cpu']}, {'bf16 matmul' if machine['cpu_bf16_matmul'] else 'no bf16'}"
    device = machine["gpu"] or cpu
    return f"{device}; computed in {plan['compute_dtype']}"


def _interval(value: float, ci: Sequence[float] | None, digits: int = 1, sign: str = "") -> str:
    shown = f"{value:{sign}.{digits}f}"
    return f"{shown} [{ci[0]:{sign}.{digits}f}, {ci[1]:{sign}.{digits}f}]" if ci else shown


def run_row(run_dir: Path, link: str) -> tuple[str, list[str], list[object]]:
    """(the command, the columns, the row) of one run."""
    plan, stages = load_records(run_dir)
    r = {name: record["result"] for name, record in stages.items()}
    finished = max((record["finished"] for record in stages.values()), default=None)
    minutes = sum(record["seconds"] for record in stages.values()) / 60
    budget = plan["budget_minutes"]
    if finished and plan.get("began") and budget:  # the whole run, to its last stage's end, against its budget
        minutes = (finished - plan["began"]) / 60
        took = f"{minutes:.1f} min of a budget of {budget:g} ({minutes / budget:.2f})"
    else:  # a run recorded before runs kept their beginning and end: its stages' minutes
        took = f"{minutes:.1f} min" + (f" (budget {budget:g})" if budget else "")
    columns = ["machine", "code", "date", "took", "REALM steps"]
    row: list[object] = [
        machine_of(plan),
        describe_commit(plan.get("code")),
        time.strftime("%Y-%m-%d", time.gmtime(finished)) if finished else "unfinished",
        took,
        r.get("realm", {}).get("steps"),
    ]
    if "eval" in r:
        ev = EvalRecord.from_dict(r["eval"])
        questions = ev.answered
        columns += ["QA steps", "dev questions scored", "EM hybrid [95%]", "EM dense", "EM BM25", "zero-shot R@5"]
        row += [
            r["qa"]["train"]["steps"],
            f"{questions.evaluated:,} of {questions.dev:,} (seed {questions.seed})",
            _interval(ev.hybrid.exact_match, ev.hybrid.interval),
            f"{ev.dense.exact_match:.1f}",
            f"{ev.bm25.exact_match:.1f}",
            ", ".join(f"{label} {recall[5]:.1f}" for label, recall in ev.zero_shot.items()),
        ]
    if "examples" in r:
        examples = ExamplesRecord.from_dict(r["examples"])
        scored = examples.with_retrieval
        columns += ["held-out masked-LM gain [95%]", "sentences scored"]
        row += [
            _interval(scored.retrieval_gain, scored.interval, 2, "+"),
            f"{examples.scored_sentences:,} of {examples.held_out_sentences:,}",
        ]
    return command_of(plan), [*columns, "record"], [*row, link]


def archive(run_dir: Path, target: Path) -> None:
    """Copy a run's records to `target` (the page's own copy), its machine paths made relative to the run."""
    if run_dir.resolve() == target.resolve():
        return
    here = str(run_dir.resolve()) + "/"
    tmp = target.with_name(f".{target.name}.tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    (tmp / STAGES).mkdir(parents=True)
    sources = [run_dir / name for name in RECORDS] + sorted((run_dir / STAGES).glob("*.json"))
    for source in sources:
        if source.is_file() and not source.name.endswith(".started.json"):
            text = source.read_text(encoding="utf-8").replace(here, "")
            (tmp / source.relative_to(run_dir)).write_text(text, encoding="utf-8")
    shutil.rmtree(target, ignore_errors=True)
    tmp.rename(target)


def seed_runs(run_dir: Path) -> list[Path]:
    """A `realm pipeline --seeds N` folder's runs (seed-0, seed-1, ...); [] for a run of one seed."""
    if not (run_dir / SEEDS_SUMMARY).is_file():
        return []
    return sorted((d for d in run_dir.glob("seed-*") if (d / "plan.json").is_file()), key=lambda d: int(d.name[5:]))


def _write_text(path: Path, text: str) -> None:
    write_atomic(path, lambda tmp: tmp.write_text(text, encoding="utf-8"))


def archive_seeds(run_dir: Path, target: Path) -> list[Path]:
    """Copy a seeds folder's summary and each seed's records to `target`; the copies of the seeds' runs."""
    if run_dir.resolve() == target.resolve():
        return seed_runs(target)
    target.mkdir(parents=True, exist_ok=True)
    for name in (SEEDS_SUMMARY, "seeds.md"):
        source = run_dir / name
        if source.is_file():
            _write_text(target / name, source.read_text(encoding="utf-8").replace(str(run_dir.resolve()) + "/", ""))
    copies = []
    for seed in seed_runs(run_dir):
        archive(seed, target / seed.name)
        copies.append(target / seed.name)
    return copies


def seeds_rows(summary: dict) -> list[list[object]]:
    """A seeds summary's figures: values by seed, mean, the mean's 95% t-interval, one more run's 95% interval."""
    rows: list[list[object]] = []
    for name, f in summary["figures"].items():
        if f.get("budget") is not None:
            continue  # the minutes: each seed's row says them
        rows.append(
            [
                name,
                ", ".join(f"{v:.2f}" for v in f["values"]),
                "{:.2f} [{:.2f}, {:.2f}]".format(f["mean"], *f["mean_95ci"]),
                "[{:.2f}, {:.2f}]".format(*f["next_run_95ci"]),
            ]
        )
    return rows


def write_results_page(run_dirs: list[Path], out: Path) -> Path:
    """Archive each run's records beside `out` and write the page: one table per command, a row per run (a seeds
    folder: a row per seed, and its figures over the seeds)."""
    tables: dict[str, tuple[list[str], list[list[object]]]] = {}
    over_seeds: list[tuple[str, Path, dict]] = []
    ablated: dict[str, dict[str, tuple[list[MeasureRow], list[AblationRow]]]] = {}  # command -> run -> Table 2
    for run_dir in run_dirs:
        record = out.parent / "runs" / run_dir.name
        seeds = archive_seeds(run_dir, record) if seed_runs(run_dir) else []
        if not seeds:
            archive(run_dir, record)
        for one in seeds or [record]:
            name = one.relative_to(out.parent / "runs").as_posix()
            link = f"[{name}]({one.relative_to(out.parent).as_posix()}/results.md)"
            command, columns, row = run_row(one, link)
            if command in tables and tables[command][0] != columns:
                raise ValueError(f"{run_dir}: its stages differ from another run of `{command}`")
            tables.setdefault(command, (columns, []))[1].append(row)
            plan, stages = load_records(one)
            arms = table2(plan, {s: record["result"] for s, record in stages.items()})
            if arms is not None:
                ablated.setdefault(command, {})[name] = arms
        if seeds:
            over_seeds.append((command, record, json.loads((record / SEEDS_SUMMARY).read_text())))
    regenerate = " ".join((out.parent / "runs" / d.name).as_posix() for d in run_dirs)
    doc = ReportDocument()
    doc.heading("What today's commands give", 1)
    doc.paragraph(
        f"Generated from each run's plan and stage records, copied under `runs/` beside this page, from which "
        f"`realm results {regenerate} --out {out.as_posix()}` writes it again. Exact match: ORQA's normaliser, on a seeded sample of the dev questions, with its 95% bootstrap "
        "interval; the held-out masked-LM gain: REALM's masked-token accuracy with retrieval minus without, on the "
        "test half of the held-out sentences, paired. Nothing in these tables chose a setting (README: 'Nothing is "
        "chosen on what is reported'). Dated findings, and the measurements behind each default: docs/log/."
    )
    for command, (columns, rows) in tables.items():
        doc.heading(f"`{command}`")
        doc.table(columns, rows)
        for name, (measured, compared) in ablated.get(command, {}).items():
            doc.paragraph(
                f"**Table 2 in miniature** ({name}): each arm against the system it is compared with, paired; "
                "before fine-tuning, zero-shot recall@5 on every dev question and the held-out masked-LM gain:"
            )
            doc.table(MEASURE_COLUMNS, [row.cells() for row in measured])
            doc.paragraph(f"After fine-tuning ({name}), dense exact match on the dev questions both answered:")
            doc.table(ABLATION_COLUMNS, [row.cells() for row in compared])
        for seeds_command, record, summary in over_seeds:
            if seeds_command == command:
                doc.paragraph(
                    f"**Over seeds** ([{record.name}]({record.relative_to(out.parent).as_posix()}/seeds.md), "
                    f"`{summary['command']}`: the rows {', '.join(summary['runs'])} above, each its own run with "
                    "every trainer seeded with k): each figure per seed, their mean with its 95% t-interval "
                    "(training's spread as well as the questions'), and where one more run should fall (95%; what "
                    "`realm results --check` holds a rerun to)."
                )
                columns = ["figure", "per seed", "mean [95% t-interval]", "one more run, 95%"]
                doc.table(columns, seeds_rows(summary))
    timed = [
        d.name
        for d in run_dirs
        if not seed_runs(d) and load_records(out.parent / "runs" / d.name)[0].get("stage_timings")
    ]
    if timed:
        doc.heading("Where each run's minutes went")
        doc.paragraph(
            "Runs whose stages were each allotted what was left of the budget as they began (the budget as a "
            "deadline): each stage's estimate at the plan, its allotment and the minutes it took; each trainer's "
            "steps planned / trained and seconds a step estimated / measured are in the run's record (its results.md)."
        )
        for name in timed:
            doc.paragraph(f"**{name}**")
            doc.table(["stage", "estimated min", "allotted min", "took min"], stage_rows(out.parent / "runs" / name))
    write_atomic(out, lambda tmp: tmp.write_text(doc.markdown(out.parent), encoding="utf-8"))
    return out


def stage_rows(run_dir: Path) -> list[list[object]]:
    """A run's stages in the order they finished: estimated (at the plan), allotted (as each began), took."""
    plan, stages = load_records(run_dir)
    estimated = {s["name"]: s["seconds"] for s in plan["stages"]}
    timings = plan.get("stage_timings", {})
    rows: list[list[object]] = []
    for record in sorted(stages.values(), key=lambda record: record["finished"]):
        name = record["name"]
        allotted = timings.get(name, {}).get("allotted")
        rows.append(
            [
                name,
                f"{estimated[name] / 60:.2f}" if name in estimated else "before the plan",
                f"{allotted / 60:.2f}" if allotted is not None else None,
                f"{record['seconds'] / 60:.2f}",
            ]
        )
    return rows
