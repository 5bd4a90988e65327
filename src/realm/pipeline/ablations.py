"""The paper's ablations in `realm pipeline --ablations`: which REALM pretraining runs it adds, and which fine-tuned
systems the report compares (each pair on the same dev questions, with the paper's NQ figures where it has them)."""

from __future__ import annotations

from dataclasses import dataclass

from realm.config import PretrainConfig


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


def ablations(doc_tower: str) -> list[Ablation]:
    """The comparisons of `--ablations` (`ablation_variants`). With a fixed document tower (ours), the
    paper's refreshed-against-stale comparison is made between the two runs that train it."""
    fixed = doc_tower == "fixed"
    rows = [
        Ablation(
            "retriever", "REALM-pretrained retriever", "ICT-only retriever (ORQA)", MAIN_QA, "qa_ict", (38.2, 31.3)
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
