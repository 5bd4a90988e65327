"""The paper's ablations in `realm pipeline --ablations`: which REALM pretraining runs it adds, which fine-tuned
systems the report compares (each pair on the same dev questions, with the paper's NQ figures where it has them),
and the report's ablation table and learning curves."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from realm.config import PretrainConfig
from realm.eval.qa import compare_predictions
from realm.pipeline.curves import plot_runs
from realm.pipeline.document import ReportDocument
from realm.training.metrics import read_metrics


def ablation_variants(pretrain: PretrainConfig) -> dict[str, dict]:
    """The REALM pretraining runs `--ablations` adds, by name, as changes to the recipe: uniform masking; with a
    fixed document tower, the paper's recipe (document tower trained, index refreshed); and the stale index (the
    document tower trained, the index never refreshed)."""
    variants: dict[str, dict] = {"uniform": {"masking": "uniform"}}
    if pretrain.doc_tower == "fixed":
        variants["trained"] = {"doc_tower": "trained"}
    variants["frozen"] = {"doc_tower": "trained", "refresh_every": 0}
    return variants


MAIN_QA = "eval"  # the stage holding the main system's dense predictions


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


def ablations(doc_tower: str, ict: bool) -> list[Ablation]:
    """The comparisons of `--ablations` (`ablation_variants`). With a fixed document tower (ours), the
    paper's refreshed-against-stale comparison is made between the two runs that train it. Without ICT (`ict`),
    REALM is compared with the warm-start retriever it started from, as the paper compares it with ICT."""
    fixed = doc_tower == "fixed"
    rows = [
        Ablation(
            "retriever",
            "REALM-pretrained retriever",
            f"{start_retriever(ict)} (no REALM)",
            MAIN_QA,
            "qa_ict",
            (38.2, 31.3),
        ),
        Ablation("masking", "salient-span masking", "random uniform masking", MAIN_QA, "qa_uniform", (38.2, 32.3)),
    ]
    if fixed:
        rows.append(
            Ablation(
                "document tower",
                "fixed (query tower trained)",
                "trained, index refreshed (the paper's)",
                MAIN_QA,
                "qa_trained",
                None,
            )
        )
    rows.append(
        Ablation(
            "index",
            "refreshed index" + (" (document tower trained)" if fixed else ""),
            "frozen (stale) index",
            "qa_trained" if fixed else MAIN_QA,
            "qa_frozen",
            (38.2, 28.7),
        )
    )
    return rows


DETECTABLE_IN_SE = 1.96 + 0.84  # a true difference this many standard errors is found 80% of the time at 5%


def predictions(run_dir: Path, stage: str) -> Path:
    return run_dir / stage / "predictions_dense.jsonl"


def ablation_rows(r: dict, run_dir: Path, doc_tower: str, ict: bool) -> list[list]:
    """One row per ablation, with the paired difference over the dev questions both systems answered (dense
    retrieval, as the ablations vary the retriever's pretraining): with a budget the main evaluation answers dev in
    its seeded order until its clock runs out, the ablated systems the plan's sample of it. A row whose runs have
    not finished yet shows dashes."""

    rows = []
    for a in ablations(doc_tower, ict):
        ours, other, difference, interval, detectable, questions = None, None, None, None, None, None
        if a.ours_stage in r and a.other_stage in r:
            ours_file, other_file = predictions(run_dir, a.ours_stage), predictions(run_dir, a.other_stage)
            paired = compare_predictions(ours_file, other_file, shared=True)
            ours, other, difference = paired["exact_match_a"], paired["exact_match_b"], paired["difference"]
            questions = paired["questions"]
            low, high = paired["difference_95ci"]
            interval = f"[{low:+.1f}, {high:+.1f}]"
            detectable = DETECTABLE_IN_SE * (high - low) / (2 * 1.96)  # the interval's width gives the standard error
        paper = a.paper or (None, None)
        rows.append(
            [a.what, f"{a.ours} vs {a.other}", ours, other, difference, interval, detectable, *paper, questions]
        )
    return rows


def ablation_table(doc: ReportDocument, rows: list[list]) -> None:
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
    doc.table(
        [
            "ablation",
            "comparison",
            "ours EM",
            "ablated EM",
            "difference",
            "95% interval",
            "detectable",
            "paper EM",
            "paper ablated",
            "questions",
        ],
        rows,
    )


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
