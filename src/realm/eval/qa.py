"""Open-QA evaluation: exact match and recall@k of an answerer on QA pairs, and a predictions file."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from realm.common.io import write_atomic
from realm.data.qa_examples import QAExample, is_exact_match
from realm.eval.answerer import Answer, Answerer
from realm.eval.intervals import bootstrap_interval
from realm.eval.retrieval import recall_at_k


def evaluate_qa(
    answerer: Answerer, examples: Sequence[QAExample], recall_ks: Sequence[int], predictions: Path | None = None
) -> dict:
    """Exact match and recall@k on `examples` (one search serves both); optionally a predictions JSONL with
    each question's answer, score and evidence. Returns the summary (percentages rounded to 0.01), with the 95%
    bootstrap interval of the exact match over questions."""
    from realm.index.search import search_all

    ks = sorted(set(recall_ks) | {answerer.k})
    started = time.monotonic()
    hits = search_all(answerer.searcher, [e.question for e in examples], max(ks), batch_size=answerer.batch_size)
    answers: list[Answer] = []
    for start in range(0, len(examples), answerer.batch_size):
        part = examples[start : start + answerer.batch_size]
        answers += answerer.read(
            [e.question for e in part], [row[: answerer.k] for row in hits[start : start + len(part)]]
        )
    correct = [is_exact_match(a.answer, e) for a, e in zip(answers, examples)]
    if predictions is not None:
        lines = [
            json.dumps(
                {
                    "question": e.question,
                    "references": list(e.answers),
                    "prediction": a.answer,
                    "score": a.score,
                    "exact_match": ok,
                    "evidence": [asdict(v) for v in a.evidence],
                },
                ensure_ascii=False,
            )
            + "\n"
            for e, a, ok in zip(examples, answers, correct)
        ]
        write_atomic(Path(predictions), lambda tmp: tmp.write_text("".join(lines)))
    low, high = bootstrap_interval([100.0 * ok for ok in correct])
    return {
        "exact_match": round(100.0 * sum(correct) / len(examples), 2),
        "exact_match_95ci": [round(low, 2), round(high, 2)],
        **{name: round(value, 2) for name, value in recall_at_k(examples, hits, ks).items()},
        "questions": len(examples),
        "reader_top_k": answerer.k,
        "seconds": round(time.monotonic() - started, 1),
    }
