"""Open-QA evaluation: exact match and recall@k of an answerer on QA pairs, where its errors are, and a
predictions file.

Every question falls in one of four outcomes: exact match; the answer not retrieved (no block given to the
reader holds a reference answer); retrieved but not read (the prediction shares no word with a reference);
read but not exact (it shares a word: the right place, wrong boundaries or form)."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

from realm.common.io import write_atomic
from realm.data.qa_examples import QAExample, has_answer, is_exact_match, normalize_answer
from realm.eval.answerer import Answer, Answerer
from realm.eval.intervals import bootstrap_interval, paired_difference
from realm.eval.retrieval import first_answer_ranks, recall_from_ranks

OUTCOMES = ("exact_match", "not_retrieved", "retrieved_not_read", "read_not_exact")


def outcome(prediction: str, example: QAExample, retrieved: bool, rule: str = "orqa") -> str:
    """Which of OUTCOMES a prediction is (`retrieved`: a block given to the reader holds a reference answer;
    `rule`: the exact-match normaliser, qa_examples.EXACT_MATCH_RULES)."""
    if is_exact_match(prediction, example, rule):
        return "exact_match"
    if not retrieved:
        return "not_retrieved"
    if example.regex:
        overlaps = has_answer(prediction, example)
    else:
        words = set(normalize_answer(prediction, rule).split())
        overlaps = any(words & set(normalize_answer(answer, rule).split()) for answer in example.answers)
    return "read_not_exact" if overlaps else "retrieved_not_read"


def evaluate_qa(
    answerer: Answerer,
    examples: Sequence[QAExample],
    recall_ks: Sequence[int],
    predictions: Path | None = None,
    exact_match: str = "orqa",
) -> dict:
    """Exact match and recall@k on `examples` (one search serves both); optionally a predictions JSONL with
    each question's answer, score, outcome and evidence. Returns the summary (percentages rounded to 0.01), with
    the 95% bootstrap interval of the exact match over questions, the percentage of each outcome and the
    `exact_match` rule it scored with (ORQA's NFD normaliser, REALM's, or the official SQuAD script's)."""
    from realm.index.search import search_all

    ks = sorted(set(recall_ks) | {answerer.k})
    started = time.monotonic()
    questions = [e.question for e in examples]
    hits = search_all(answerer.searcher, questions, max(ks), batch_size=answerer.batch_size)
    # the reader reads exactly what `ask` would give it: the top k of the deep search where that is the same
    if max(ks) <= answerer.searcher.prefix_depth:
        read_hits = [row[: answerer.k] for row in hits]
    else:
        read_hits = search_all(answerer.searcher, questions, answerer.k, batch_size=answerer.batch_size)
    answers: list[Answer] = []
    for start in range(0, len(examples), answerer.batch_size):
        answers += answerer.read(
            questions[start : start + answerer.batch_size], read_hits[start : start + answerer.batch_size]
        )
    first_hit = first_answer_ranks(examples, hits)
    retrieved = [r is not None for r in first_answer_ranks(examples, read_hits)]
    outcomes = [outcome(a.answer, e, ok, exact_match) for a, e, ok in zip(answers, examples, retrieved)]
    correct = [o == "exact_match" for o in outcomes]
    if predictions is not None:
        lines = [
            json.dumps(
                {
                    "question": e.question,
                    "references": list(e.answers),
                    "prediction": a.answer,
                    "score": a.score,
                    "exact_match": ok,
                    "outcome": what,
                    "evidence": [asdict(v) for v in a.evidence],
                },
                ensure_ascii=False,
            )
            + "\n"
            for e, a, ok, what in zip(examples, answers, correct, outcomes)
        ]
        write_atomic(Path(predictions), lambda tmp: tmp.write_text("".join(lines)))
    low, high = bootstrap_interval([100.0 * ok for ok in correct])
    return {
        "exact_match": round(100.0 * sum(correct) / len(examples), 2),
        "exact_match_95ci": [round(low, 2), round(high, 2)],
        "exact_match_rule": exact_match,
        **{name: round(value, 2) for name, value in recall_from_ranks(first_hit, ks).items()},
        "outcomes": {name: round(100.0 * outcomes.count(name) / len(examples), 2) for name in OUTCOMES},
        "questions": len(examples),
        "reader_top_k": answerer.k,
        "seconds": round(time.monotonic() - started, 1),
    }


def compare_predictions(a: Path, b: Path) -> dict:
    """Exact match of two predictions files over the same questions, and their paired difference a - b with its
    95% bootstrap interval (an interval that excludes 0: a real difference at that level)."""
    rows = []
    for path in (a, b):
        scores = []
        for lineno, line in enumerate(Path(path).read_text().splitlines(), start=1):
            try:
                record = json.loads(line)
                scores.append((record["question"], 100.0 * bool(record["exact_match"])))
            except (json.JSONDecodeError, KeyError, TypeError) as err:
                raise ValueError(f"{path}:{lineno}: not a predictions line of `realm eval qa`: {err!r}") from err
        rows.append(scores)
    if [q for q, _ in rows[0]] != [q for q, _ in rows[1]]:
        raise ValueError(f"{a} and {b} do not hold the same questions in the same order")
    (em_a, em_b) = ([v for _, v in r] for r in rows)
    difference, (low, high) = paired_difference(em_a, em_b)
    return {
        "exact_match_a": round(sum(em_a) / len(em_a), 2),
        "exact_match_b": round(sum(em_b) / len(em_b), 2),
        "difference": round(difference, 2),
        "difference_95ci": [round(low, 2), round(high, 2)],
        "questions": len(em_a),
    }
