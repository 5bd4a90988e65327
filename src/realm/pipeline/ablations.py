"""The paper's ablations in `realm pipeline --ablations`: which REALM pretraining runs it adds, which fine-tuned
systems the report compares (each pair on the same dev questions, with the paper's NQ figures where it has them),
and the report's ablation table and learning curves."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from realm.config import PretrainConfig
from realm.eval.intervals import paired_difference
from realm.eval.mlm import MaskedLMScore
from realm.eval.qa import PairedScore, compare_predictions
from realm.pipeline.curves import plot_runs
from realm.pipeline.document import ReportDocument
from realm.pipeline.records import EvalRecord
from realm.pipeline.stage_table import ARMS, ARMS_EVAL, MAIN_QA, Arm, arms
from realm.training.metrics import read_metrics


@dataclass(frozen=True)
class Ablation:
    """Two fine-tuned systems compared on the same dev questions, with the paper's NQ dev exact match for the pair
    (Guu et al., 2020, Table 2 / section 4.4; None: a comparison the paper does not make)."""

    what: str
    ours: str
    other: str
    ours_stage: str
    other_stage: str
    paper: tuple[float, float] | None


def start_retriever(ict: bool) -> str:
    """The retriever REALM pretraining started from, which the retriever ablation fine-tunes without REALM."""
    return "ICT retriever" if ict else "warm-start retriever (no ICT)"


def ablations(pretrain: PretrainConfig, ict: bool) -> list[Ablation]:
    """The comparisons of `--ablations`, one per arm (stage_table.py: ARMS) of this recipe of REALM pretraining.
    Without ICT (`ict`), REALM is compared with the warm-start retriever it started from, as the paper compares it
    with ICT."""
    trained = " (document tower trained)" if pretrain.doc_tower == "fixed" else ""
    return [
        Ablation(
            arm.setting,
            arm.ours.format(start=start_retriever(ict), trained=trained),
            arm.other.format(start=start_retriever(ict), trained=trained),
            arm.compared_with(pretrain),
            f"qa_{arm.name}",
            arm.paper,
        )
        for arm in arms(pretrain)
    ]


DETECTABLE_IN_SE = 1.96 + 0.84  # a true difference this many standard errors is found 80% of the time at 5%


def predictions(run_dir: Path, stage: str) -> Path:
    """The dense predictions of a fine-tuned system: the main run's (MAIN_QA), or an arm's by its QA stage's name."""
    return run_dir / stage / "predictions_dense.jsonl" if stage == MAIN_QA else run_dir / ARMS_EVAL / f"{stage}.jsonl"


@dataclass(frozen=True)
class PairedFigure:
    """A figure of the system an arm is compared with (`ours`) and of the arm (`other`) over the same items, and
    their paired difference ours - other with its 95% bootstrap interval. Written into the stage records that
    measure it (`to_dict`), so that the report and the results page read Table 2 from records alone."""

    ours: float
    other: float
    difference: float
    interval: tuple[float, float]
    items: int

    def to_dict(self) -> dict:
        rounded = [round(v, 4) for v in (self.ours, self.other, self.difference, *self.interval)]
        return dict(zip(("ours", "other", "difference", "low", "high"), rounded, strict=True)) | {"items": self.items}

    @classmethod
    def from_dict(cls, data: dict) -> PairedFigure:
        return cls(data["ours"], data["other"], data["difference"], (data["low"], data["high"]), data["items"])

    def cells(self, digits: int) -> list:
        low, high = self.interval
        return [
            round(self.ours, digits),
            round(self.other, digits),
            f"{self.difference:+.{digits}f} [{low:+.{digits}f}, {high:+.{digits}f}]",
        ]


def paired(ours: list[float], other: list[float]) -> PairedFigure:
    """Two systems' per-item scores in the same order, paired over the first items both scored."""
    n = min(len(ours), len(other))
    if n == 0:
        raise ValueError("no item both systems scored")
    difference, interval = paired_difference(ours[:n], other[:n])
    return PairedFigure(sum(ours[:n]) / n, sum(other[:n]) / n, difference, interval, n)


def paired_exact_match(ours: Path, other: Path) -> PairedFigure:
    """Dense exact match of two predictions files over the dev questions both answered."""
    p = PairedScore.from_dict(compare_predictions(ours, other, shared=True))
    return PairedFigure(p.exact_match_a, p.exact_match_b, p.difference, p.interval, p.questions)


def _hits(ranks: list[int | None], k: int = 5) -> list[float]:
    return [100.0 * (rank is not None and rank < k) for rank in ranks]


def paired_measures(ours: tuple[list, list], arm: tuple[list, list]) -> dict:
    """An arm's Table 2 columns before fine-tuning against the system it is compared with, each (zero-shot ranks
    on every dev question, per-sentence masked-LM gains in the scoring order): recall@5 and the gain, paired."""
    return {
        "recall@5": paired(_hits(ours[0]), _hits(arm[0])).to_dict(),
        "masked_lm_gain": paired(ours[1], arm[1]).to_dict(),
    }


def measured_by(stage: str, records: dict, run_dir: Path) -> tuple[list, list]:
    """What an arm's measures are paired with: the zero-shot ranks and per-sentence masked-LM gains of the system
    named by its QA stage, the main run's (`MAIN_QA`: its evaluation and held-out scoring) or an earlier arm's."""
    if stage == MAIN_QA:
        folder, scored = run_dir / "eval", records["examples"]
    else:
        measured = f"measure_{stage.removeprefix('qa_')}"
        folder, scored = run_dir / measured, records[measured]
    ranks = json.loads((folder / "zero_shot_ranks.json").read_text())["REALM"]
    return ranks, MaskedLMScore.from_dict(scored["with_retrieval"]).per_sentence_gain or []


def arm_of(stage: str) -> Arm:
    """The arm a stage of the table belongs to, by its QA or measures stage's name."""
    name = stage.split("_", 1)[1]
    return next(arm for arm in ARMS if arm.name == name)


@dataclass(frozen=True)
class AblationRow:
    """One row of the report's exact match ablation table (None while either system has not finished)."""

    ablation: Ablation
    em: PairedFigure | None = None

    @property
    def detectable(self) -> float | None:
        """The smallest true difference these questions would show 80% of the time (the interval's width gives
        the standard error)."""
        if self.em is None:
            return None
        return DETECTABLE_IN_SE * (self.em.interval[1] - self.em.interval[0]) / (2 * 1.96)

    def cells(self) -> list:
        a, paper, em = self.ablation, self.ablation.paper or (None, None), self.em
        shown = [em.ours, em.other, em.difference, "[{:+.1f}, {:+.1f}]".format(*em.interval)] if em else [None] * 4
        return [a.what, f"{a.ours} vs {a.other}", *shown, self.detectable, *paper, em.items if em else None]


def ablation_rows(r: dict, pretrain: PretrainConfig, ict: bool) -> list[AblationRow]:
    """One row per ablation: dense exact match paired over the dev questions both systems answered, as the run's
    last stage recorded it (ARMS_EVAL: the arms answer the dev questions the main evaluation answered, with a
    budget as many as its clock allowed)."""
    rows = []
    paired_em = r.get(ARMS_EVAL, {}).get("paired", {})
    for a in ablations(pretrain, ict):
        em = paired_em.get(a.other_stage)
        rows.append(AblationRow(a, PairedFigure.from_dict(em) if em else None))
    return rows


@dataclass(frozen=True)
class MeasureRow:
    """One arm's Table 2 columns before fine-tuning: zero-shot recall@5 over every dev question and the held-out
    masked-LM gain, each paired with what it is compared with (None: not measured, or not finished)."""

    ablation: Ablation
    recall: PairedFigure | None
    gain: PairedFigure | None

    def cells(self) -> list:
        a = self.ablation
        recall = self.recall.cells(2) if self.recall else [None] * 3
        gain = self.gain.cells(2) if self.gain else [None] * 3
        counts = [self.recall.items if self.recall else None, self.gain.items if self.gain else None]
        return [a.what, f"{a.ours} vs {a.other}", *recall, *gain, *counts]


def _start_recall(ev: EvalRecord) -> PairedFigure | None:
    """REALM's retriever against its start, zero-shot recall@5 on every dev question (the evaluation's record)."""
    paired_recall = ev.realm_vs_start.recall.get(5) if ev.realm_vs_start else None
    if ev.realm_vs_start is None or paired_recall is None:
        return None
    ours, other = (ev.zero_shot[label][5] for label in ("REALM", ev.realm_vs_start.start))
    return PairedFigure(ours, other, paired_recall.difference, paired_recall.interval, ev.answered.dev)


def measure_rows(r: dict, pretrain: PretrainConfig, ict: bool) -> list[MeasureRow]:
    """Table 2's columns that need no fine-tuning, per arm, from the arms' records: zero-shot recall@5 of each
    retriever on every dev question and the held-out masked-LM gain, each paired with what it is compared with."""
    rows = []
    for a in ablations(pretrain, ict):
        arm = arm_of(a.other_stage)
        if arm.changes is None:  # no REALM pretraining: REALM's retriever against its start, no masked-LM model
            rows.append(MeasureRow(a, _start_recall(EvalRecord.from_dict(r["eval"])) if "eval" in r else None, None))
            continue
        measured = r.get(f"measure_{arm.name}", {}).get("paired")
        recall, gain = (
            PairedFigure.from_dict(measured[k]) if measured else None for k in ("recall@5", "masked_lm_gain")
        )
        rows.append(MeasureRow(a, recall, gain))
    return rows


MEASURE_COLUMNS = [
    *("ablation", "comparison", "R@5 ours", "R@5 ablated", "difference [95%]"),
    *("masked-LM gain ours", "ablated", "difference [95%]", "dev questions", "sentences"),
]
ABLATION_COLUMNS = [
    *("ablation", "comparison", "ours EM", "ablated EM", "difference", "95% interval", "detectable"),
    *("paper EM", "paper ablated", "questions"),
]


def table2(plan: dict, r: dict) -> tuple[list[MeasureRow], list[AblationRow]] | None:
    """A finished or running `--ablations` run's Table 2 from its plan.json and stage results alone (None: a run
    without ablations): what the report and the results page show."""
    if not plan.get("options", {}).get("ablations"):
        return None
    pretrain = PretrainConfig(doc_tower=plan["preset"]["pretrain"]["doc_tower"])
    ict = plan["preset"]["ict"]["steps"] > 0
    return measure_rows(r, pretrain, ict), ablation_rows(r, pretrain, ict)


def measure_table(doc: ReportDocument, rows: list[MeasureRow]) -> None:
    doc.heading("Table 2 in miniature: what each arm's pretraining gave, before fine-tuning")
    doc.paragraph(
        "Each arm against the system it is compared with (the main run, or for the index the two runs that train "
        "the document tower): zero-shot recall@5 of its retriever on every dev question, and the held-out "
        "masked-LM gain (masked-token accuracy with its retrieval minus without) on the held-out sentences the "
        "main run scored, in the same order. Differences are paired over the same questions or sentences, with "
        "95% bootstrap intervals; the arm without REALM pretraining has no masked-LM model of its own. Exact "
        "match after fine-tuning is the next table."
    )
    doc.table(MEASURE_COLUMNS, [row.cells() for row in rows])


def ablation_table(doc: ReportDocument, rows: list[AblationRow]) -> None:
    doc.heading("Ablations (the paper's, in miniature)")
    doc.paragraph(
        "Exact match on our dev questions after fine-tuning, each system with its own dense retriever; the paper's "
        "numbers are NQ dev exact match (Guu et al., 2020). Same corpus, data and step counts for every row. "
        "The difference is paired over the dev questions both systems answered ('questions'), with its 95% bootstrap interval; 'detectable' is the "
        "smallest true difference these questions would show 80% of the time (2.8 standard errors): a smaller "
        "effect, such as the paper's scaled down to a short run, can hide in a flat row. The interval resamples "
        "questions, not training: one fine-tuning rerun with another seed can land as far from itself as a row's "
        "difference (`experiments/qa_seeds.py` reruns these QA stages with other seeds and measures it)."
    )
    doc.table(ABLATION_COLUMNS, [row.cells() for row in rows])


def ablation_curves(doc: ReportDocument, run_dir: Path, records: dict) -> None:
    """The ablations' runs side by side: where a difference does not show at the end, the curves say whether it
    is opening (and so whether a larger budget would show it) or not there at all."""
    realm = [s for s in records if s == "realm" or (s.startswith("realm_") and not s.endswith("_index"))]
    qa = [s for s in records if s == "qa" or (s.startswith("qa_") and s != "qa_start")]  # fine-tuned systems
    figures = [
        (
            realm,
            ("utility", "accuracy", "loss"),
            "REALM pretraining: retrieval utility (nats per mask), masked-token accuracy and loss",
        ),
        (
            qa,
            ("answer_in_top_k", "train_em", "loss"),
            "QA fine-tuning: answer in the reader's blocks, training exact match and loss",
        ),
    ]
    for stages, metrics, caption in figures:
        if len(stages) < 2:
            continue
        runs = {s: read_metrics(run_dir / s) for s in stages}
        png = plot_runs(metrics, runs, run_dir / "plots" / f"{stages[0]}_runs.png")
        if png is not None:
            doc.paragraph(f"{caption}, a colour per run: {', '.join(stages)}.")
            doc.image(png, caption)
