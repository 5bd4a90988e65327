"""The report's open-QA sections: where fine-tuning started, how the reader was trained, exact match and recall by
retriever with where the errors are (pipeline/report.py assembles them)."""

from __future__ import annotations

from realm.eval.qa import QAScore
from realm.pipeline.ablations import start_retriever
from realm.pipeline.document import ReportDocument
from realm.pipeline.plan import PipelinePlan
from realm.pipeline.records import DevQuestions, EvalRecord, QAStart
from realm.pipeline.stage_table import ARMS_EVAL

SYSTEM_LABELS = {
    "dense": "{retriever} retriever ({tower}) + reader",
    "hybrid": "hybrid: dense + w · BM25 + the same reader",
    "bm25": "BM25 + the same reader",
}
READER_REASONS = {
    "warm start": "the pipeline's default, not measured in this run: with the retriever fixed, REALM's masked-LM "
    "reader was no better a start "
    "(docs/log/2026-11-28-results-honest-numbers-the-choices-re-measured-on-a-tuning-split-nineteenth.md: "
    "-1.04 EM [-2.77, +0.75] after 300 "
    "QA steps, on the tuning split's 1,732 questions; earlier, on dev, -7.09 [-8.89, -5.35])",
    "REALM": "the ablations measure REALM pretraining, its reader included",
}


def qa_start_section(doc: ReportDocument, r: dict) -> None:
    """Where QA fine-tuning started, and which query tower it kept (work.py: keep_query_tower)."""
    start, query_tower = QAStart.from_dict(r["qa_start"]), r.get("qa", {}).get("query_tower")
    doc.heading("Where QA fine-tuning started")
    recall = ", ".join(f"{label} {value:.2f}" for label, value in start.recall.items())
    why = "fixed by --ablations, which compare REALM pretraining" if start.fixed else "the highest"
    doc.paragraph(
        f"Retriever: **{start.retriever}** ({why}; zero-shot recall@5 on {_selection(start)}: {recall}). "
        f"Reader: **{start.reader}**: {READER_REASONS[start.reader]}."
    )
    if query_tower:
        held_out = query_tower["recall@5"]
        kept = "the fine-tuned one" if query_tower["kept"] == "fine-tuned" else "the start's, fine-tuning's set aside"
        doc.paragraph(
            f"Query tower after fine-tuning: **{kept}**: recall@5 on the same {query_tower['questions']} held-out "
            f"questions, fine-tuned {held_out['fine-tuned']:.2f} vs start {held_out['start']:.2f}; the fine-tuned tower "
            "is kept only when it is higher."
        )


def reader_training_section(doc: ReportDocument, records: dict) -> None:
    """How the reader that answers was trained: the reading stage (recipes/reading.py) where the preset has one, then
    ORQA's fine-tuning; questions, passes and minutes of each."""
    parts = []
    if "read" in records:
        read = records["read"].result
        found = read["found"]
        skipped = found["no_answer_block"] + found["no_answer_span"]
        parts.append(
            f"the reading stage: {read['steps']:,} steps over {read['read_questions']:,} training questions "
            f"({read['passes']:.2f} passes; {found['from_context']:,} read in their gold paragraph at the answer's "
            f"offset, {found['from_retrieval']:,} in the best-ranked retrieved block holding the answer; {skipped:,} "
            f"skipped: no answer-bearing block among the top retrieved, or no span of at most the reader's width "
            f"reads as the answer; {found['offsets_not_matching']:,} offsets that did not match their context), one "
            f"such block and {read.get('negatives', 1)} retrieved without the answer a question, in "
            f"{records['read'].seconds / 60:.1f} min"
        )
    if "qa" in records:
        qa = records["qa"].result
        steps = (qa.get("steps_trained") or {}).get("trained", {}).get("steps")
        if steps is not None:
            parts.append(
                f"ORQA's fine-tuning (the top 5 retrieved blocks a question, joint with the query tower): {steps:,} "
                f"steps, in {records['qa'].seconds / 60:.1f} min"
            )
    if parts:
        doc.paragraph("How the reader was trained: " + "; then ".join(parts) + ".")


def _selection(start: QAStart) -> str:
    """Which training questions chose the QA start: a sample of the tuning split's, whose articles fine-tuning
    never sees."""
    of = f"of {start.articles} articles " if start.articles else "(the file names no articles) "
    return f"{start.questions} training questions {of}held out of fine-tuning (the tuning split)"


def _query_tower_label(r: dict) -> str:
    """The query tower the fine-tuned system kept (work.py: keep_query_tower)."""
    kept = r.get("qa", {}).get("query_tower", {}).get("kept", "fine-tuned")
    return "fine-tuned query tower" if kept == "fine-tuned" else "query tower kept from the start"


def qa_tables(doc: ReportDocument, r: dict, plan: PipelinePlan) -> None:
    ev = EvalRecord.from_dict(r["eval"])
    chosen = QAStart.from_dict(r["qa_start"]).retriever if "qa_start" in r else "REALM"
    doc.heading("Retrieval recall on the dev questions")
    questions = ev.answered
    evaluated = (
        f"the {questions.dev:,} dev questions"
        if questions.all_answered
        else f"the dev questions (zero-shot rows: all {questions.dev:,}; the rest: the {questions.evaluated:,} "
        "the evaluation answered)"
    )
    doc.paragraph(
        f"Percent of {evaluated} with an answer-bearing block in the top k. The dev questions choose nothing: "
        "fine-tuning keeps its best checkpoint, and the run its retrievers, by training questions of articles "
        "held out of fine-tuning (the tuning split)."
    )
    ks = (1, 5, 20)
    rows: list[list[object]] = [["BM25", *(ev.bm25.recall.get(k) for k in ks)]]
    rows += [[f"{label} (zero-shot)", *(recall.get(k) for k in ks)] for label, recall in ev.zero_shot.items()]
    tower = _query_tower_label(r)
    rows += [[f"{chosen}, {tower}", *(ev.dense.recall.get(k) for k in ks)]]
    rows += [[f"hybrid ({tower} + w · BM25)", *(ev.hybrid.recall.get(k) for k in ks)]]
    doc.table(["retriever", *(f"recall@{k}" for k in ks)], rows)
    doc.heading("Open-QA exact match")
    doc.paragraph(
        f"Fine-tuned with {plan.preset.qa.retriever} retrieval. {_evaluated(ev)} Exact match with its 95% bootstrap "
        "interval over the questions, and where the errors are: the answer not in the reader's blocks, in them but "
        "the prediction shares no word with it, or shares a word but is not exact (percent of all questions)."
    )
    systems = {label.format(retriever=chosen, tower=tower): ev.systems[kind] for kind, label in SYSTEM_LABELS.items()}
    retriever_ablation = r.get(ARMS_EVAL, {}).get("dense", {}).get("qa_ict")
    if retriever_ablation is not None:
        start = start_retriever(bool(plan.preset.ict.steps))
        label = f"{start} + REALM's reader, fine-tuned (the retriever ablation)"
        systems[label] = QAScore.from_dict(retriever_ablation)
    rows = []
    for label, score in systems.items():
        rows.append(
            [
                label,
                score.exact_match,
                "[{:.1f}, {:.1f}]".format(*score.interval) if score.interval else None,
                score.recall.get(5),
                *(score.outcomes.get(o) for o in ("not_retrieved", "retrieved_not_read", "read_not_exact")),
            ]
        )
    doc.table(
        [
            "system",
            "exact match",
            "95% interval",
            "recall@5",
            "not retrieved",
            "retrieved, not read",
            "read, not exact",
        ],
        rows,
    )
    doc.paragraph("Paired differences in exact match (the same questions; an interval excluding 0 is a real one):")
    doc.table(
        ["comparison", "difference", "95% interval"],
        [[name, d.difference, "[{:+.1f}, {:+.1f}]".format(*d.interval)] for name, d in ev.paired.items()],
    )


def _evaluated(ev: EvalRecord) -> str:
    """Which dev questions the systems answered: all, or the plan's seeded sample, with the interval it implies."""
    questions = ev.answered
    if questions.all_answered:
        return f"All {questions.dev:,} dev questions answered."
    interval = ev.hybrid.interval
    width = f", ±{(interval[1] - interval[0]) / 2:.1f} points (the hybrid's 95% interval)" if interval else ""
    return (
        f"EM over {questions.evaluated:,} of {questions.dev:,} dev questions (a sample drawn with seed "
        f"{questions.seed}, {sized_by(questions)}){width}."
    )


def sized_by(questions: DevQuestions) -> str:
    """What sized a dev sample: the clock (the questions answered in a seeded order until the stage's end), or the
    plan (a run without a budget, or one recorded before the evaluation watched the clock)."""
    if questions.until is not None:
        return "answered in its seeded order until the evaluation's allotment ended"
    return "sized by the plan to what the budget left after training"
