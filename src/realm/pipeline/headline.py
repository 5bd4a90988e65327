"""The report's headline, after its budget line: the run's exact match, what REALM pretraining added over the
retriever it started from (each figure paired over the same questions, with its 95% interval), and, on a question
set the paper reports, the paper's Table 1 rows beside ours with the share of questions the corpus can answer."""

from __future__ import annotations

from collections.abc import Sequence

from realm.data.question_sets import PAPER_ROWS, QUESTION_SETS, QuestionSet
from realm.eval.qa import QAScore
from realm.pipeline.ablations import AblationRow
from realm.pipeline.document import ReportDocument
from realm.pipeline.plan import PipelinePlan
from realm.pipeline.records import EvalRecord, ExamplesRecord, QAStart


def _interval(bounds: Sequence[float], signed: bool = True) -> str:
    low, high = bounds
    return f"[{low:+.2f}, {high:+.2f}]" if signed else f"[{low:.1f}, {high:.1f}]"


def _verdict(low: float, high: float) -> str:
    return "excludes 0" if low > 0 or high < 0 else "includes 0: no clear change"


def realm_added(r: dict, compared: list[AblationRow]) -> list[str]:
    """Sentences, each a paired figure of REALM against its start: exact match (where --ablations fine-tuned both),
    zero-shot recall over the dev questions, and masked-token accuracy on held-out sentences."""
    lines = []
    em = next((row.em for row in compared if row.ablation.what == "retriever" and row.em), None)
    if em is not None:
        lines.append(
            f"REALM's retriever changed dev EM by {em.difference:+.2f} {_interval(em.interval)} points: the same "
            f"fine-tuning from REALM's reader, with REALM's retriever ({em.ours:.2f}) and with its start's "
            f"({em.other:.2f}), dense retrieval, over the {em.items:,} dev questions both answered."
        )
    elif "eval" in r:
        chosen = QAStart.from_dict(r["qa_start"]).retriever if "qa_start" in r else "REALM"
        lines.append(
            "REALM's effect on exact match is not measured in this run (`--ablations` fine-tunes its start too); "
            + (
                "fine-tuning started from REALM's retriever."
                if chosen == "REALM"
                else f"fine-tuning started from the {chosen} retriever, which had the better zero-shot recall on the "
                "tuning split: REALM's retriever is not in the exact match figures."
            )
        )
    paired = EvalRecord.from_dict(r["eval"]).realm_vs_start if "eval" in r else None
    if paired is not None:
        at5, at20 = paired.recall[5], paired.recall[20]
        low, high = at5.interval
        lines.append(
            f"Zero-shot recall@5 on the dev questions, REALM's retriever minus its start ({paired.start}): "
            f"{at5.difference:+.2f} {_interval((low, high))} points ({_verdict(low, high)}; recall@20: "
            f"{at20.difference:+.2f} {_interval(at20.interval)})."
        )
    if "examples" in r:
        scored = ExamplesRecord.from_dict(r["examples"]).with_retrieval
        low, high = scored.interval
        lines.append(
            f"Held-out masked-token accuracy with REALM's retrieval minus without: {scored.retrieval_gain:+.2f} "
            f"{_interval((low, high))} points over {scored.sentences} sentences ({_verdict(low, high)})."
        )
    return lines


def headline(doc: ReportDocument, r: dict, plan: PipelinePlan, compared: list[AblationRow]) -> None:
    """The run's answer in a few lines: EM, what REALM added, and the paper's rows where they apply."""
    ev = EvalRecord.from_dict(r["eval"]) if "eval" in r else None
    if ev is not None:
        chosen = QUESTION_SETS.get(ev.question_set or "")
        asked = f"{ev.hybrid.questions or ev.answered.evaluated:,} {chosen.name if chosen else 'dev'} questions"
        systems = ", ".join(f"{kind} {_em(ev.systems[kind])}" for kind in ("dense", "bm25"))
        doc.paragraph(
            f"**Open-QA exact match** on {asked}: hybrid retrieval {_em(ev.hybrid)}; {systems} (95% intervals)."
        )
    added = realm_added(r, compared)
    if added:
        doc.paragraph("**What REALM added** over the retriever it started from: " + " ".join(added))
    if ev is not None:
        paper_rows(doc, ev, plan, chosen)


def _em(score: QAScore) -> str:
    return f"{score.exact_match:.1f}" + (f" {_interval(score.interval, signed=False)}" if score.interval else "")


def paper_rows(doc: ReportDocument, ev: EvalRecord, plan: PipelinePlan, chosen: QuestionSet | None) -> None:
    """The paper's Table 1 column for the evaluated set (`chosen`: the named set evaluated, None for a user's
    file), beside this run's row, and the answer coverage."""
    coverage = ev.coverage
    covered = (
        f"{coverage.percent:.1f}% {_interval(coverage.interval, signed=False)} of these questions have an "
        "answer string in some block of this run's corpus (the ceiling of recall at any depth)"
        if coverage
        else None
    )
    if chosen is None or chosen.paper is None:
        if covered:
            doc.paragraph(covered[0].upper() + covered[1:] + ".")
        return
    doc.paragraph(
        f"The paper's Table 1 on {chosen.name} ({chosen.questions:,} questions; test EM; their corpus: Wikipedia's 13M blocks of 288 wordpieces, "
        "BERT-base towers and reader) beside this run"
        + (f": {covered}." if covered else ".")
        + " The paper's systems could answer from all of Wikipedia; compare within a corpus, not across."
    )
    ours = (
        "this run: hybrid retrieval, MiniLM-L6 towers and reader",
        ev.hybrid.exact_match,
        "68M (three MiniLM-L6 of 22.7M: query tower, document tower, reader)",
        f"this run's corpus, {plan.work.blocks:,} blocks of {plan.preset.corpus.max_block_tokens} wordpieces",
    )
    rows = [[system, scores[chosen.paper], size, corpus] for system, scores, size, corpus in PAPER_ROWS]
    doc.table(["system", "test EM", "parameters", "retrieval corpus"], [*rows, list(ours)])
