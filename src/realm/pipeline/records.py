"""The stage records of `realm pipeline` that its figures come from, typed: the held-out scoring of REALM's
masked LM (`ExamplesRecord`), where QA fine-tuning started (`QAStart`) and the evaluation (`EvalRecord`). The
stages (work.py) write `to_dict()`; the report, the headline, the results page and `realm results --check` read the
fields of `from_dict(record)`, so that a figure is named in one place. A field that a record written before it
lacks reads as None or empty: every archived run (docs/runs) still reads."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

from realm.eval.mlm import MaskedLMScore, WorkedExample
from realm.eval.qa import PairedScore, QAScore

SYSTEMS = ("dense", "bm25", "hybrid")  # the fine-tuned reader with each retriever

Interval = tuple[float, float]


def _interval(values: Sequence[float]) -> Interval:
    low, high = values
    return (low, high)


def _recall(data: dict) -> dict[int, float]:
    """{"recall@5": 76.5, ...} -> {5: 76.5, ...}"""
    return {int(key.removeprefix("recall@")): value for key, value in data.items() if key.startswith("recall@")}


@dataclass(frozen=True)
class ExamplesRecord:
    """REALM's masked LM on held-out sentences (work.py: pretraining_examples): the paper's Table 3 `examples` of
    the first `pool` sentences, and the score with and without retrieval of `scored_sentences` of the
    `held_out_sentences` with a maskable salient span (of `held_out_sentences_tagged`, in the `held_out_part` of
    the held-out documents)."""

    with_retrieval: MaskedLMScore
    scored_sentences: int
    held_out_sentences: int
    held_out_sentences_tagged: int | None = None
    held_out_part: str | None = None
    pool: int | None = None
    examples: list[WorkedExample] = field(default_factory=list)

    @property
    def all_scored(self) -> bool:
        return self.scored_sentences >= self.held_out_sentences

    def to_dict(self) -> dict:
        return {
            "held_out_sentences": self.held_out_sentences,
            "scored_sentences": self.scored_sentences,
            "held_out_sentences_tagged": self.held_out_sentences_tagged,
            "held_out_part": self.held_out_part,
            "pool": self.pool,
            "examples": [e.to_dict() for e in self.examples],
            "with_retrieval": self.with_retrieval.to_dict(),
        }

    @classmethod
    def from_dict(cls, data: dict) -> ExamplesRecord:
        scored = MaskedLMScore.from_dict(data["with_retrieval"])
        return cls(
            scored,
            data.get("scored_sentences", scored.sentences),
            data.get("held_out_sentences", scored.sentences),
            data.get("held_out_sentences_tagged"),
            data.get("held_out_part"),
            data.get("pool"),
            [WorkedExample.from_dict(e) for e in data.get("examples", [])],
        )


@dataclass(frozen=True)
class QAStart:
    """The retriever and reader QA fine-tuning started from: the highest zero-shot recall@5 on the tuning split's
    questions (`recall`: label -> percent, in stage order), unless `fixed` (by --ablations)."""

    retriever: str
    reader: str
    fixed: bool
    recall: dict[str, float]
    questions: int
    articles: int | None = None

    def to_dict(self) -> dict:
        return {
            "retriever": self.retriever,
            "reader": self.reader,
            "fixed": self.fixed,
            "recall@5": dict(self.recall),
            "questions": self.questions,
            "articles": self.articles,
        }

    @classmethod
    def from_dict(cls, data: dict) -> QAStart:
        return cls(
            data["retriever"],
            data.get("reader", "warm start"),
            bool(data.get("fixed", False)),
            dict(data.get("recall@5", {})),
            data.get("questions", 0),
            data.get("articles"),
        )


@dataclass(frozen=True)
class DevQuestions:
    """Which dev questions the systems answered: `evaluated` of `dev`, in the order drawn with `seed`; `offered`
    and `until` (the time limit's record) where the clock sized the sample, answering in that order until it ended."""

    evaluated: int
    dev: int
    seed: int | None = None
    offered: int | None = None
    until: dict | None = None

    @property
    def all_answered(self) -> bool:
        return self.evaluated >= self.dev

    def to_dict(self) -> dict:
        data: dict = {"evaluated": self.evaluated, "dev": self.dev, "seed": self.seed}
        if self.offered is not None:
            data["offered"] = self.offered
        if self.until is not None:
            data["until"] = self.until
        return data

    @classmethod
    def from_dict(cls, data: dict) -> DevQuestions:
        return cls(data["evaluated"], data["dev"], data.get("seed"), data.get("offered"), data.get("until"))


@dataclass(frozen=True)
class RecallDifference:
    """Zero-shot recall@k of one retriever minus another's over the same questions, with its paired 95% interval
    (eval/retrieval.py: paired_recall), in points."""

    difference: float
    interval: Interval

    def to_dict(self) -> dict:
        return {"difference": self.difference, "difference_95ci": list(self.interval)}

    @classmethod
    def from_dict(cls, data: dict) -> RecallDifference:
        return cls(data["difference"], _interval(data["difference_95ci"]))


@dataclass(frozen=True)
class RealmVsStart:
    """REALM's retriever against the one it started from (`start`), zero-shot on every dev question: k -> the
    paired difference in recall@k."""

    start: str
    recall: dict[int, RecallDifference]

    def to_dict(self) -> dict:
        return {"start": self.start} | {f"recall@{k}": d.to_dict() for k, d in self.recall.items()}

    @classmethod
    def from_dict(cls, data: dict) -> RealmVsStart:
        return cls(data["start"], {k: RecallDifference.from_dict(data[f"recall@{k}"]) for k in _recall(data)})


@dataclass(frozen=True)
class Coverage:
    """The share of the dev questions whose answer some block of the corpus holds: the ceiling of recall."""

    percent: float
    interval: Interval
    questions: int

    def to_dict(self) -> dict:
        return {"percent": self.percent, "percent_95ci": list(self.interval), "questions": self.questions}

    @classmethod
    def from_dict(cls, data: dict) -> Coverage:
        return cls(data["percent"], _interval(data["percent_95ci"]), data["questions"])


@dataclass(frozen=True)
class Outcomes:
    """Which dev questions were answered (their rows in the dev file) and, per system, whether each was an exact
    match ("1") or not ("0"), in the same order: what `realm results --check` pairs two runs on."""

    rows: list[int]
    marks: dict[str, str]  # system -> one mark per row

    def exact_match_by_row(self, system: str) -> dict[int, float] | None:
        """The system's exact match per dev row (100 or 0); None where the record has no marks for it."""
        if system not in self.marks:
            return None
        return {row: 100.0 * (mark == "1") for row, mark in zip(self.rows, self.marks[system], strict=True)}

    def to_dict(self) -> dict:
        return {"rows": list(self.rows)} | dict(self.marks)

    @classmethod
    def from_dict(cls, data: dict) -> Outcomes:
        return cls(list(data["rows"]), {key: marks for key, marks in data.items() if key != "rows"})


@dataclass(frozen=True)
class EvalRecord:
    """The evaluation stage's record: each system's figures on the dev questions answered, their paired
    differences, every zero-shot retriever's recall on all of dev (label -> k -> percent), REALM's against its
    start, the corpus' answer coverage and the named question set evaluated (None: a user's file)."""

    systems: dict[str, QAScore]
    questions: DevQuestions | None = None
    outcomes: Outcomes | None = None
    paired: dict[str, PairedScore] = field(default_factory=dict)
    zero_shot: dict[str, dict[int, float]] = field(default_factory=dict)
    realm_vs_start: RealmVsStart | None = None
    coverage: Coverage | None = None
    question_set: str | None = None

    @property
    def dense(self) -> QAScore:
        return self.systems["dense"]

    @property
    def bm25(self) -> QAScore:
        return self.systems["bm25"]

    @property
    def hybrid(self) -> QAScore:
        return self.systems["hybrid"]

    @property
    def answered(self) -> DevQuestions:
        """The dev questions answered (a record from before the plan sampled dev: all, as many as dense answered)."""
        if self.questions is not None:
            return self.questions
        count = self.dense.questions or 0
        return DevQuestions(count, count)

    def to_dict(self) -> dict:
        data: dict = {} if self.questions is None else {"questions": self.questions.to_dict()}
        data |= {kind: score.to_dict() for kind, score in self.systems.items()}
        if self.outcomes is not None:
            data["outcomes"] = self.outcomes.to_dict()
        data["paired"] = {name: p.to_dict() for name, p in self.paired.items()}
        for label, recall in self.zero_shot.items():
            data[f"zero_shot/{label}"] = {f"recall@{k}": value for k, value in recall.items()}
        data["realm_vs_start"] = {} if self.realm_vs_start is None else self.realm_vs_start.to_dict()
        data["answer_coverage"] = None if self.coverage is None else self.coverage.to_dict()
        data["question_set"] = self.question_set
        return data

    @classmethod
    def from_dict(cls, data: dict) -> EvalRecord:
        questions, outcomes = data.get("questions"), data.get("outcomes")
        paired, coverage = data.get("paired") or {}, data.get("answer_coverage")
        return cls(
            {kind: QAScore.from_dict(data[kind]) for kind in SYSTEMS if kind in data},
            DevQuestions.from_dict(questions) if questions else None,
            Outcomes.from_dict(outcomes) if outcomes else None,
            {name: PairedScore.from_dict(p) for name, p in paired.items()},
            {key.split("/", 1)[1]: _recall(value) for key, value in data.items() if key.startswith("zero_shot/")},
            RealmVsStart.from_dict(data["realm_vs_start"]) if data.get("realm_vs_start") else None,
            Coverage.from_dict(coverage) if coverage else None,
            data.get("question_set"),
        )
