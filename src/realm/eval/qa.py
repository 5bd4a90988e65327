"""Open-QA evaluation: exact match and recall@k of an answerer on QA pairs, where its errors are, and a
predictions file.

Every question falls in one of four outcomes: exact match; the answer not retrieved (no block given to the
reader holds a reference answer); retrieved but not read (the prediction shares no word with a reference);
read but not exact (it shares a word: the right place, wrong boundaries or form)."""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
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


def _interval(values: Sequence[float] | None) -> tuple[float, float] | None:
    return (values[0], values[1]) if values else None


@dataclass(frozen=True)
class QAScore:
    """One system's open-QA figures on the questions it answered, in the one JSON form `summarise` writes
    (`to_dict`) and every reader of a record reads (`from_dict`; what a record written before a field lacks is None
    or empty)."""

    exact_match: float  # percent
    interval: tuple[float, float] | None = None  # its 95% bootstrap interval over the questions
    rule: str | None = None  # the exact-match normaliser (qa_examples.EXACT_MATCH_RULES)
    recall: dict[int, float] = field(default_factory=dict)  # k -> percent with an answer-bearing block in the top k
    outcomes: dict[str, float] = field(default_factory=dict)  # each of OUTCOMES -> percent of the questions
    questions: int | None = None
    reader_top_k: int | None = None
    seconds: float | None = None

    def to_dict(self) -> dict:
        data: dict = {"exact_match": self.exact_match}
        if self.interval is not None:
            data["exact_match_95ci"] = list(self.interval)
        if self.rule is not None:
            data["exact_match_rule"] = self.rule
        data |= {f"recall@{k}": value for k, value in self.recall.items()}
        if self.outcomes:
            data["outcomes"] = dict(self.outcomes)
        for name in ("questions", "reader_top_k", "seconds"):
            if getattr(self, name) is not None:
                data[name] = getattr(self, name)
        return data

    @classmethod
    def from_dict(cls, data: dict) -> QAScore:
        return cls(
            data["exact_match"],
            _interval(data.get("exact_match_95ci")),
            data.get("exact_match_rule"),
            {int(key.removeprefix("recall@")): value for key, value in data.items() if key.startswith("recall@")},
            dict(data.get("outcomes", {})),
            data.get("questions"),
            data.get("reader_top_k"),
            data.get("seconds"),
        )


@dataclass(frozen=True)
class PairedScore:
    """Exact match of two systems over the same questions and their paired difference a - b with its 95% bootstrap
    interval (an interval that excludes 0: a real difference at that level), in `compare_predictions`' JSON form."""

    exact_match_a: float
    exact_match_b: float
    difference: float
    interval: tuple[float, float]
    questions: int

    def to_dict(self) -> dict:
        return {
            "exact_match_a": self.exact_match_a,
            "exact_match_b": self.exact_match_b,
            "difference": self.difference,
            "difference_95ci": list(self.interval),
            "questions": self.questions,
        }

    @classmethod
    def from_dict(cls, data: dict) -> PairedScore:
        low, high = data["difference_95ci"]
        return cls(data["exact_match_a"], data["exact_match_b"], data["difference"], (low, high), data["questions"])


@dataclass(frozen=True)
class AnsweredQuestion:
    """One question answered: the answer with its evidence, the rank of the first retrieved block holding a
    reference answer (None: none of the blocks searched) and which of OUTCOMES it is."""

    example: QAExample
    answer: Answer
    first_hit: int | None
    outcome: str

    def prediction_line(self) -> str:
        """Its line of a predictions file."""
        e, a = self.example, self.answer
        record = {
            "question": e.question,
            "references": list(e.answers),
            "prediction": a.answer,
            "score": a.score,
            "exact_match": self.outcome == "exact_match",
            "outcome": self.outcome,
            "evidence": [asdict(v) for v in a.evidence],
        }
        return json.dumps(record, ensure_ascii=False) + "\n"


def answer_questions(
    answerer: Answerer, examples: Sequence[QAExample], depth: int, exact_match: str = "orqa"
) -> list[AnsweredQuestion]:
    """`examples` answered, each searched `depth` deep (for recall@k up to it; one search serves the reader too)."""
    from realm.index.search import search_all

    depth = max(depth, answerer.k)
    questions = [e.question for e in examples]
    hits = search_all(answerer.searcher, questions, depth, batch_size=answerer.batch_size)
    # the reader reads exactly what `ask` would give it: the top k of the deep search where that is the same
    if depth <= answerer.searcher.prefix_depth:
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
    return [
        AnsweredQuestion(e, a, rank, outcome(a.answer, e, ok, exact_match))
        for e, a, rank, ok in zip(examples, answers, first_hit, retrieved)
    ]


def summarise(
    answered: Sequence[AnsweredQuestion], recall_ks: Sequence[int], reader_top_k: int, exact_match: str, seconds: float
) -> QAScore:
    """Exact match with its 95% bootstrap interval over questions, recall@k, the share of each outcome (percentages
    rounded to 0.01), the `exact_match` rule and the `seconds` answering took."""
    ks = sorted(set(recall_ks) | {reader_top_k})
    outcomes = [a.outcome for a in answered]
    correct = [o == "exact_match" for o in outcomes]
    low, high = bootstrap_interval([100.0 * ok for ok in correct])
    recall = recall_from_ranks([a.first_hit for a in answered], ks)  # in the order of ks
    return QAScore(
        round(100.0 * sum(correct) / len(answered), 2),
        (round(low, 2), round(high, 2)),
        exact_match,
        {k: round(value, 2) for k, value in zip(ks, recall.values(), strict=True)},
        {name: round(100.0 * outcomes.count(name) / len(answered), 2) for name in OUTCOMES},
        len(answered),
        reader_top_k,
        round(seconds, 1),
    )


def write_predictions(path: Path, answered: Sequence[AnsweredQuestion]) -> None:
    """A predictions JSONL: each question's answer, score, outcome and evidence (atomically)."""
    lines = "".join(a.prediction_line() for a in answered)
    write_atomic(Path(path), lambda tmp: tmp.write_text(lines))


def evaluate_qa(
    answerer: Answerer,
    examples: Sequence[QAExample],
    recall_ks: Sequence[int],
    predictions: Path | None = None,
    exact_match: str = "orqa",
) -> dict:
    """Exact match and recall@k on `examples` (one search serves both); optionally a predictions JSONL with
    each question's answer, score, outcome and evidence. Returns `summarise`'s summary: the 95% bootstrap interval
    of the exact match over questions, the percentage of each outcome and the `exact_match` rule it scored with
    (ORQA's NFD normaliser, REALM's, or the official SQuAD script's)."""
    started = time.monotonic()
    answered = answer_questions(answerer, examples, max(recall_ks, default=answerer.k), exact_match)
    if predictions is not None:
        write_predictions(predictions, answered)
    return summarise(answered, recall_ks, answerer.k, exact_match, time.monotonic() - started).to_dict()


def compare_predictions(a: Path, b: Path, shared: bool = False) -> dict:
    """Exact match of two predictions files over the same questions, and their paired difference a - b with its
    95% bootstrap interval (an interval that excludes 0: a real difference at that level). `shared`: pair the
    questions both files hold (a question: its text, references and occurrence), in `a`'s order, as when one run
    answered dev until its clock ran out and another a fixed sample of it; otherwise the files must hold the same
    questions in the same order. In PairedScore's JSON form."""
    rows = [_scored_questions(Path(path)) for path in (a, b)]
    if shared:
        in_b = dict(rows[1])
        rows = [[(q, v) for q, v in rows[0] if q in in_b], [(q, in_b[q]) for q, _ in rows[0] if q in in_b]]
        if not rows[0]:
            raise ValueError(f"{a} and {b} hold no question in common")
    elif [q for q, _ in rows[0]] != [q for q, _ in rows[1]]:
        raise ValueError(f"{a} and {b} do not hold the same questions in the same order")
    (em_a, em_b) = ([v for _, v in r] for r in rows)
    difference, (low, high) = paired_difference(em_a, em_b)
    return PairedScore(
        round(sum(em_a) / len(em_a), 2),
        round(sum(em_b) / len(em_b), 2),
        round(difference, 2),
        (round(low, 2), round(high, 2)),
        len(em_a),
    ).to_dict()


def _scored_questions(path: Path) -> list[tuple[tuple, float]]:
    """A predictions file's questions, each keyed by its text, its references and which occurrence of that pair it
    is, with 100 for an exact match and 0 otherwise."""
    scores: list[tuple[tuple, float]] = []
    seen: dict[tuple, int] = {}
    for lineno, line in enumerate(path.read_text().splitlines(), start=1):
        try:
            record = json.loads(line)
            key = (record["question"], tuple(record.get("references", ())))
            scores.append(((*key, seen.get(key, 0)), 100.0 * bool(record["exact_match"])))
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as err:
            raise ValueError(f"{path}:{lineno}: not a predictions line of `realm eval qa`: {err!r}") from err
        seen[key] = seen.get(key, 0) + 1
    return scores
