"""The stages of `realm pipeline` after its plan, declared once, and the ablation arms.

`run_stages(preset, work)` is the ordered list of the stages a run takes: the planner estimates them in this order
(`estimate`), the run's clock allots each what is left of the budget less the ones after it (pace.py), the runner
runs them in it (a test holds run.py to it), and the report reads their kinds (`kind_of`). Each `Stage` names the
trainer whose steps it takes (each kind paced by its own steps), the stages it reads, and its cost model
(estimate.py). An ablation arm (`ARMS`) is the main run's REALM, index and QA stages with one setting of REALM
pretraining changed: adding one is one entry there, and the planner, the runner and the report's Table 2 follow.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from realm.config import Preset, PretrainConfig
from realm.pipeline.estimate import (
    Cost,
    StageEstimate,
    Workload,
    arm_realm_cost,
    arms_eval_cost,
    eval_cost,
    examples_cost,
    ict_cost,
    index_cost,
    measure_cost,
    qa_cost,
    qa_start_cost,
    read_cost,
    realm_cost,
)

# run before anything can be estimated: their minutes count against the budget as they took
BEFORE_PLAN = ("corpus", "warm_start", "baseline_index", "calibration")
MAIN_QA = "eval"  # the stage holding the main system's dense predictions, which each arm is compared with
# the run's last stage under --ablations: every arm's dense exact match on the questions MAIN_QA answered, in lockstep
# until the run's deadline (work.py: arms_exact_match), so that a slow hour costs questions, not the budget
ARMS_EVAL = "arms_eval"
# the indexes of the retrievers QA chooses among, in stage order: the retriever's label, the stage that trained it
INDEXES_BUILT_BY = {
    "baseline_index": ("off-the-shelf", "warm_start"),
    "ict_index": ("ICT", "ict"),
    "realm_index": ("REALM", "realm"),
}


@dataclass(frozen=True)
class Stage:
    name: str
    kind: str | None  # the trainer whose steps it takes ("ict", "realm", "read", "qa"); None: no training steps
    reads: tuple[str, ...]  # the stages whose outputs it reads
    cost: Cost  # its estimate at a preset's step counts (estimate.py)
    arm: str | None = None  # the ablation arm it belongs to (None: the main run)
    changes: tuple[tuple[str, Any], ...] = ()  # the arm's settings of REALM pretraining

    def preset(self, preset: Preset) -> Preset:
        """`preset` with the arm's changes to pretraining (the main run's: unchanged)."""
        if not self.changes:
            return preset
        return dataclasses.replace(preset, pretrain=dataclasses.replace(preset.pretrain, **dict(self.changes)))


@dataclass(frozen=True)
class Arm:
    """One row of Table 2: the main system against the same stages with one setting of REALM pretraining changed
    (`changes`; None: no REALM pretraining at all, QA fine-tuned from REALM's start). Its stages are
    realm_<name>, realm_<name>_index and qa_<name> (qa_<name> alone without pretraining). `ours`/`other` may name
    `{start}` (the retriever REALM started from) and `{trained}` (the main document tower's setting); `paper`: the
    paper's NQ dev exact match for the pair (Guu et al., 2020, Table 2), None where it makes no such comparison."""

    name: str
    setting: str  # the row's name in the report
    ours: str
    other: str
    changes: dict | None
    paper: tuple[float, float] | None
    applies: Callable[[PretrainConfig], bool] = lambda pretrain: True
    # the stage whose predictions the arm is compared with (another arm's where the main run is not the reference)
    compared_with: Callable[[PretrainConfig], str] = lambda pretrain: MAIN_QA


def _fixed(pretrain: PretrainConfig) -> bool:
    return pretrain.doc_tower == "fixed"


ARMS: tuple[Arm, ...] = (
    # the retriever alone: REALM's reader fine-tuned with REALM's retriever and with its start's (the paper's
    # "Baseline retriever + REALM encoder", 35.3)
    Arm("ict", "retriever", "REALM-pretrained retriever", "{start} (no REALM), REALM's reader", None, (38.2, 35.3)),
    Arm("uniform", "masking", "salient-span masking", "random uniform masking", {"masking": "uniform"}, (38.2, 32.3)),
    # with a fixed document tower (ours), the paper's recipe (document tower trained, index refreshed) is an arm
    Arm(
        "trained",
        "document tower",
        "fixed (query tower trained)",
        "trained, index refreshed (the paper's)",
        {"doc_tower": "trained"},
        None,
        applies=_fixed,
    ),
    # the paper's refreshed-against-stale comparison; with a fixed document tower, between the two arms that train it
    Arm(
        "frozen",
        "index",
        "refreshed index{trained}",
        "frozen (stale) index",
        {"doc_tower": "trained", "refresh_every": 0},
        (38.2, 28.7),
        compared_with=lambda pretrain: "qa_trained" if _fixed(pretrain) else MAIN_QA,
    ),
)


def arms(pretrain: PretrainConfig) -> list[Arm]:
    """The arms `--ablations` runs for this recipe of REALM pretraining."""
    return [arm for arm in ARMS if arm.applies(pretrain)]


def run_stages(preset: Preset, work: Workload) -> list[Stage]:
    """The stages a run takes after its plan, in order, for `preset` (its ICT and reading settings) and `work`
    (QA data or none, --ablations or not)."""
    ict = bool(preset.ict.steps)
    start = "ict" if ict else "warm_start"
    stages = [Stage("ict", "ict", ("warm_start", "corpus"), ict_cost)] if ict else []
    stages.append(Stage("realm", "realm", (start, "warm_start", "corpus"), realm_cost))
    start_index = "ict_index" if ict else "baseline_index"
    if work.qa_train:
        retrievers = ("baseline_index", *(("ict_index",) if ict else ()), "realm_index")
        stages += [Stage("ict_index", None, ("ict", "corpus"), index_cost)] if ict else []
        stages += [
            Stage("realm_index", None, ("realm", "corpus"), index_cost),
            Stage("qa_start", None, retrievers, qa_start_cost),
        ]
        # the reader first reads answer-bearing blocks (recipes/reading.py); not with --ablations, whose arms
        # fine-tune without it: the arms and the main run compared like for like
        reading = bool(preset.reading.total_steps(work.qa_train)) and not work.ablations
        stages += [Stage("read", "read", ("qa_start",), read_cost)] if reading else []
        stages += [
            Stage("qa", "qa", ("qa_start", *(("read",) if reading else ())), qa_cost),
            Stage("eval", None, ("qa", *retrievers), eval_cost),
        ]
    stages.append(Stage("examples", None, ("realm",), examples_cost))
    if work.ablations:
        for arm in arms(preset.pretrain):
            stages += arm_stages(arm, start, start_index)
        fine_tuned = tuple(f"qa_{arm.name}" for arm in arms(preset.pretrain))
        stages.append(Stage(ARMS_EVAL, None, (MAIN_QA, *fine_tuned), arms_eval_cost(len(fine_tuned))))
    return stages


def arm_stages(arm: Arm, start: str, start_index: str) -> list[Stage]:
    """An arm's stages: REALM pretrained with its changes, its index, its paired measures and QA fine-tuning (its
    exact match: ARMS_EVAL); without pretraining, QA from REALM's start (`start`, its index `start_index`)."""
    if arm.changes is None:
        return [Stage(f"qa_{arm.name}", "qa", (start, start_index), qa_cost, arm.name)]
    changes = tuple(arm.changes.items())
    realm, index = f"realm_{arm.name}", f"realm_{arm.name}_index"
    return [
        Stage(realm, "realm", (start, "warm_start"), arm_realm_cost, arm.name, changes),
        Stage(index, None, (realm, "corpus"), index_cost, arm.name, changes),
        # zero-shot recall@5 and the held-out masked-LM gain, paired with the main run's (eval, examples)
        Stage(f"measure_{arm.name}", None, (realm, index, "eval", "examples"), measure_cost, arm.name, changes),
        Stage(f"qa_{arm.name}", "qa", (realm, index), qa_cost, arm.name, changes),
    ]


def estimate(preset: Preset, work: Workload) -> list[StageEstimate]:
    """Per-stage estimates for `preset` as it stands, every stage after the plan (`run_stages`), in order."""
    return [StageEstimate(s.name, *s.cost(s.preset(preset), work)) for s in run_stages(preset, work)]


def kind_of(stage: str) -> str | None:
    """The kind of training step `stage` takes ("ict", "realm", "read", "qa"), None for a stage without steps
    (an index, choosing a start, scoring) or one this table does not hold: each kind is paced by its own steps."""
    if stage in ("ict", "realm", "read", "qa"):  # each main trainer's stage is named for its kind
        return stage
    for arm in ARMS:
        if stage == f"qa_{arm.name}":
            return "qa"
        if stage == f"realm_{arm.name}" and arm.changes is not None:
            return "realm"
    return None
