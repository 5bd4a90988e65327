"""How long each pipeline stage may run: training first, then what measures it, so the whole run fits a budget.

The cost of a stage is estimated from `StageCosts`: measured on this machine, on the run's own data, just before
planning (pipeline/calibrate.py), or where that cannot run the preset's constants (its `fp32_costs` where the
trainers compute in fp32, on a CPU without bf16 matmul). What the run spent before planning (corpus, warm start,
off-the-shelf index, calibration), embedding, tagging and the trainers' starts are fixed costs. Of the rest, the
training steps come first: at least TRAINING_SHARE of the budget, unless measuring everything fits beside it.
The evaluation (dev questions answered) and the held-out masked-LM scoring (held-out sentences scored) are then
sized to what is left, as seeded samples whose interval the report gives (`Workload.eval_questions`,
`Workload.scored_sentences`). The training steps of ICT, REALM pretraining and QA fine-tuning are all cut (or
stretched) by the same factor, so the relative lengths of the stages stay those of the preset; schedules that count
steps (warmup, the retriever freeze, the refresh interval, checkpoints) scale with them. A budget that leaves QA
fine-tuning fewer than `qa_min_steps` is refused before training,
naming the budget this machine needs. The budget becomes the run's one deadline (`PipelinePlan.deadline`,
common/deadline.py): each stage after the plan gets its own as it begins, the run's less the stages after it at
the run's pace (pipeline/pace.py: time_stage), each kind of training step at its own; a trainer ends its steps by
it (training/schedule.py: TimedSteps), an evaluation scores in a seeded order until it (common/deadline.py:
TimeLimit; the sample its estimate sized is what the report plans by, the clock decides).
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from realm.common.deadline import Deadline
from realm.common.device import default_device, describe_machine
from realm.common.io import write_json_atomic
from realm.common.provenance import describe_code
from realm.config import Preset, StageCosts
from realm.data.sources import SQUAD_PARAGRAPHS, VITAL_ARTICLES
from realm.pipeline.estimate import (
    MIN_TRAINING_STEPS,
    WARMUP_FINDING,
    StageEstimate,
    Workload,
    costed_for,
    largest_fitting,
    qa_min_steps,
    reader_warmup_steps,
    scale_preset,
)
from realm.pipeline.stage_table import arms, estimate
from realm.recipes.warmup import OWN_BLOCK_READINGS

FEW_QA_STEPS_FINDING = (
    "docs/log/2026-11-27-results-the-fine-tuned-query-tower-kept-only-when-it-beats-its-start-s-on-a.md"
)
BUDGET_SLACK = 1.1  # a plan may overrun its budget by this factor when the step counts hit their minimum
# Training first: at least this share of the budget goes to training steps; evaluation and held-out scoring are
# sampled to fit what is left (down to their minimum samples)
TRAINING_SHARE = 0.6


@dataclass(frozen=True)
class PipelinePlan:
    budget_minutes: float | None
    scale: float  # training steps relative to the preset
    preset: Preset  # the preset with its step counts scaled, and the stage costs it was sized with
    stages: tuple[StageEstimate, ...]
    work: Workload  # with the evaluation and the held-out scoring sized
    spent_seconds: float = 0.0  # before planning: corpus, warm start, off-the-shelf index, calibration
    # the estimate of a plan whose own-block reader warm-up reaches `reader_warmup_steps`, where this one's stops short
    reading_minutes: float | None = None
    began: float | None = None  # time.time() the run began (its first stage), where it has a budget

    @property
    def ends_at(self) -> float | None:
        """The run's deadline (time.time()): its beginning plus the budget; None without a budget."""
        if self.began is None or self.budget_minutes is None:
            return None
        return self.began + 60 * self.budget_minutes

    @property
    def deadline(self) -> Deadline | None:
        """The run's deadline: its beginning plus the budget (the budget's one form after minutes); None without."""
        return Deadline(self.ends_at) if self.ends_at is not None else None

    @property
    def estimated_minutes(self) -> float:
        training = sum(s.steps * s.step_seconds for s in self.stages)
        return (_fixed_seconds(self.preset, self.stages, self.spent_seconds) + training) / 60

    @property
    def training_minutes(self) -> float:
        """The estimated minutes of training steps (what TRAINING_SHARE counts)."""
        return sum(s.steps * s.step_seconds for s in self.stages) / 60

    def describe(self) -> str:
        p, budget, w = self.preset, self.budget_minutes, self.work
        fits = f" for a budget of {budget:g} min (training steps x{self.scale:.2f})" if budget else ""
        qa = f", QA {p.qa.steps} steps" if p.qa.steps else ""
        if p.qa.steps and p.reading.steps and any(s.name == "read" for s in self.stages):  # not under --ablations
            qa = f", reading {p.reading.steps} steps{qa}"
        ict = f"ICT {p.ict.steps} steps" if p.ict.steps else "no ICT"
        steps = f"{ict}, REALM {p.pretrain.steps} steps{qa}"
        share = f" ({100 * self.training_minutes / budget:.0f}% of the budget)" if budget else ""
        measured = f"; {self.training_minutes:.0f} min of training steps{share}, then "
        if w.qa_dev:
            measured += f"EM over {w.evaluated:,} of {w.qa_dev:,} dev questions and "
        measured += f"{w.scored_sentences:,} held-out sentences scored"
        if w.ablations:  # every arm planned within the budget (stage_table.py)
            named = [arm.setting for arm in arms(p.pretrain)]
            measured += (
                f"; {len(named)} ablation arms ({', '.join(named)}), each trained as long as the main stages, "
                f"scored on the same {w.evaluated:,} dev questions (exact match, last: fewer where the run is "
                f"behind), on all {w.qa_dev:,} (zero-shot recall@5) and on the main run's held-out sentences"
            )
        short = (
            f"; REALM's reader warm-up gets {p.pretrain.null_warmup_steps:,} of the {reader_warmup_steps(p.pretrain):,} steps after "
            f"which retrieval helped in {WARMUP_FINDING}: a budget of about "
            f"{math.ceil(self.reading_minutes)} min gives it them"
            if self.reading_minutes is not None
            else ""
        )
        return f"{self.estimated_minutes:.0f} min estimated with {p.costs.source}{fits}; {steps}{measured}{short}"

    def to_dict(self) -> dict:
        return {
            "budget_minutes": self.budget_minutes,
            "scale": self.scale,
            "estimated_minutes": self.estimated_minutes,
            "training_minutes": self.training_minutes,
            "training_share_rule": f"at least {TRAINING_SHARE:.0%} of the budget in training steps, unless all "
            "the measurement fits beside them; evaluation and held-out scoring sampled to fit the rest",
            "spent_seconds": self.spent_seconds,
            "reading_minutes": self.reading_minutes,
            "began": self.began,
            "ends_at": self.ends_at,
            "work": dataclasses.asdict(self.work),
            "costs": dataclasses.asdict(self.preset.costs),
            "stages": [{**dataclasses.asdict(s), "seconds": s.seconds} for s in self.stages],
        }


def _fixed_seconds(preset: Preset, stages: Sequence[StageEstimate], spent_seconds: float) -> float:
    """Everything but the training steps: what was spent before the plan, each stage's fixed part, the run's end."""
    return spent_seconds + preset.costs.fixed_seconds + sum(s.fixed_seconds for s in stages)


def plan_pipeline(
    preset: Preset,
    work: Workload,
    budget_minutes: float | None,
    scale: float | None = None,
    spent_seconds: float = 0.0,
    sized: Workload | None = None,
) -> PipelinePlan:
    """Scale the preset's step counts so the estimated run fits `budget_minutes` (None: keep them), of which
    `spent_seconds` are gone, training first (`measurement_sized`). `scale` and `sized`: what an earlier plan of
    this run chose, kept so its finished stages stay valid. Raises BudgetTooSmall, naming the budget this machine
    needs, where the budget cannot buy a run worth having: the fixed costs alone overrun it, the least steps do, or
    QA fine-tuning would get fewer than `qa_min_steps`."""
    if budget_minutes is None:
        return PipelinePlan(None, 1.0, preset, tuple(estimate(preset, work)), work, spent_seconds)
    if scale is None:
        try:
            plan = _fitted(preset, work, budget_minutes, spent_seconds)
            why = _too_few_qa_steps(plan)
        except BudgetTooSmall as refused:
            why = str(refused)
        if why is not None:
            needed = needed_minutes(preset, work, spent_seconds, budget_minutes)
            raise BudgetTooSmall(
                f"a budget of {budget_minutes:g} min is too small here: {why}; on the {_costed(preset)}, this run "
                f"needs about {needed} min ({spent_seconds / 60:.0f} of them spent on the stages before the plan, "
                f"which a re-run in the same --run-dir keeps): pass --budget-minutes {needed} or more"
            )
        sized, scale = plan.work, plan.scale
    sized = sized or measurement_sized(preset, work, budget_minutes * 60, spent_seconds)
    scaled = scale_preset(preset, scale, work.qa_train)
    reading = _reading_minutes(preset, scaled, work, spent_seconds, budget_minutes)
    return PipelinePlan(budget_minutes, scale, scaled, tuple(estimate(scaled, sized)), sized, spent_seconds, reading)


class BudgetTooSmall(ValueError):
    """The budget cannot buy a run worth having on this machine; the message names what it needs."""


def _fitted(preset: Preset, work: Workload, budget_minutes: float, spent_seconds: float) -> PipelinePlan:
    """The plan for a budget, training first (without the reading estimate); BudgetTooSmall where the fixed costs or
    the least step counts overrun it."""
    sized = measurement_sized(preset, work, budget_minutes * 60, spent_seconds)
    scale = _scale_to_fit(preset, sized, budget_minutes, spent_seconds)
    scaled = scale_preset(preset, scale, work.qa_train)
    plan = PipelinePlan(budget_minutes, scale, scaled, tuple(estimate(scaled, sized)), sized, spent_seconds)
    if plan.estimated_minutes > budget_minutes * BUDGET_SLACK:
        raise BudgetTooSmall(f"even {MIN_TRAINING_STEPS} steps per trainer take about {plan.estimated_minutes:.0f} min")
    return plan


def _too_few_qa_steps(plan: PipelinePlan) -> str | None:
    """Why a plan's QA fine-tuning cannot teach a reader anything (None: it can, or there is none)."""
    work = plan.work
    qa = plan.preset.qa
    # a preset whose whole QA fine-tuning is shorter (a few dozen questions: a smoke test) is not judged by it
    least = qa_min_steps(qa)
    if not work.qa_train or dataclasses.replace(qa, steps=None).total_steps(work.qa_train) < least:
        return None
    steps = qa.total_steps(work.qa_train)
    if steps >= least:
        return None
    return (
        f"it leaves QA fine-tuning {steps} steps, fewer than the {least} a reader needs to learn anything "
        f"(SQuAD-open EM 2.3 after 16 steps, 46.3 after 487: {FEW_QA_STEPS_FINDING})"
    )


def needed_minutes(
    preset: Preset, work: Workload, spent_seconds: float, tried: float, enough: Callable[[Preset], bool] | None = None
) -> int:
    """The smallest whole budget in minutes (above `tried`) whose plan fits and whose scaled preset is `enough` (by
    default: QA fine-tuning, where it runs, gets `qa_min_steps`)."""

    def fits(minutes: float) -> bool:
        try:
            plan = _fitted(preset, work, minutes, spent_seconds)
        except BudgetTooSmall:
            return False
        return enough(plan.preset) if enough is not None else _too_few_qa_steps(plan) is None

    low, high = tried, 2 * tried
    while not fits(high) and high < 1e6:
        low, high = high, 2 * high
    for _ in range(30):
        middle = (low + high) / 2
        low, high = (low, middle) if fits(middle) else (middle, high)
    return math.ceil(high)


def measurement_sized(preset: Preset, work: Workload, budget_seconds: float, spent_seconds: float) -> Workload:
    """Training first: `work` with the largest evaluation and held-out scoring (the same share of each, between
    their least samples and all) that leave TRAINING_SHARE of the budget to training steps; the least where none
    does (the steps then get what is left)."""

    def training_room(share: float) -> float:
        fixed = _fixed_seconds(preset, estimate(preset, work.measured(share)), spent_seconds)
        return budget_seconds - fixed - TRAINING_SHARE * budget_seconds

    if training_room(1.0) >= 0:
        return work.measured(1.0)
    if training_room(0.0) <= 0:
        return work.measured(0.0)
    return work.measured(largest_fitting(lambda share: training_room(share) >= 0, 0.0, 1.0))


def _reading_minutes(
    preset: Preset, scaled: Preset, work: Workload, spent_seconds: float, budget_minutes: float
) -> float | None:
    """Where `scaled` cuts an own-block reader warm-up below `reader_warmup_steps`: the budget whose plan keeps them
    (every trainer scaled alike, the measurement sized to it); else None."""
    warmup = preset.pretrain.null_warmup_steps
    own_block = preset.pretrain.reader_warmup in OWN_BLOCK_READINGS
    if not own_block or not warmup or scaled.pretrain.null_warmup_steps >= reader_warmup_steps(preset.pretrain):
        return None

    def reads(longer: Preset) -> bool:
        return longer.pretrain.null_warmup_steps >= reader_warmup_steps(longer.pretrain)

    return needed_minutes(preset, work, spent_seconds, budget_minutes, reads)


def plan_run(
    options: PipelineOptions,
    preset: Preset,
    work: Workload,
    calibration: dict | None,
    spent_seconds: float,
    invoked: float | None = None,
) -> PipelinePlan:
    """Planned once per run directory: a re-run for the same budget, preset and workload keeps the scale in
    plan.json, so stage costs measured anew cannot change step counts and so re-run finished stages. A new plan is
    costed with the `calibration`'s measured costs (pipeline/calibrate.py), else the constants of the precision this
    machine trains in; `spent_seconds` (the stages before planning) count against the budget. The run began when
    this invocation did (`invoked`, time.time()), or earlier where an earlier one ran the stages before the plan."""
    basis = {"budget_minutes": options.budget_minutes, "preset": preset.name, "workload": dataclasses.asdict(work)}
    path = Path(options.run_dir) / "plan.json"
    stored = json.loads(path.read_text()) if path.is_file() else {}
    dtype = preset.compute_dtype(default_device())
    costed = costed_for(preset, dtype)
    if calibration is not None:
        costed = dataclasses.replace(costed, costs=StageCosts(**calibration["costs"]))
    same = stored.get("basis") == basis
    kept, sized = (stored["scale"], Workload(**stored["work"])) if same else (None, None)
    plan = plan_pipeline(costed, work, options.budget_minutes, kept, spent_seconds, sized)
    if options.budget_minutes is not None:  # the run's deadline: kept by a re-run, after a kill too
        began = stored.get("began") if kept is not None else None
        before = time.time() - spent_seconds
        plan = dataclasses.replace(plan, began=began or min(before, invoked or before))
    settings = {k: str(v) if isinstance(v, Path) else v for k, v in dataclasses.asdict(options).items()}
    record = {"basis": basis, **plan.to_dict(), "compute_dtype": str(dtype).removeprefix("torch.")}
    record["stage_timings"] = stored.get("stage_timings", {}) if kept is not None else {}  # set as each stage begins
    record["calibration"] = calibration["measured"] if calibration else None
    record["machine"] = (kept is not None and stored.get("machine")) or describe_machine()  # the run's first
    record["code"] = code_of_run(stored if kept is not None else {}, describe_code())
    write_json_atomic(path, {**record, "preset": plan.preset.to_dict(), "options": settings})
    return plan


def code_of_run(stored: dict, now: dict) -> dict:
    """The code a run began with; an invocation that resumed it on other code is listed in `resumed_with`."""
    first = stored.get("code") or now
    resumed = list(first.get("resumed_with", []))
    if {k: now[k] for k in ("commit", "dirty")} != {
        k: first.get(k) for k in ("commit", "dirty")
    } and now not in resumed:
        resumed.append(now)
    return {**first, "resumed_with": resumed} if resumed else first


def _costed(preset: Preset) -> str:
    """Which costs an estimate used, for the messages that refuse a budget."""
    return f"{preset.name} preset, costed with {preset.costs.source}"


def _scale_to_fit(preset: Preset, work: Workload, budget_minutes: float, spent_seconds: float) -> float:
    """The largest factor on every trainer's steps whose plan fits what the fixed costs leave of the budget (some
    grow with the steps: fine-tuning scores the dev questions once an epoch)."""
    stages = estimate(preset, work)
    fixed = _fixed_seconds(preset, stages, spent_seconds)
    training = sum(s.steps * s.step_seconds for s in stages)
    left = budget_minutes * 60 - fixed
    if left <= 0 or training <= 0:
        raise BudgetTooSmall(f"embedding, tagging and evaluation alone take about {fixed / 60:.0f} min")

    def minutes(scale: float) -> float:
        scaled = scale_preset(preset, scale, work.qa_train)
        return PipelinePlan(
            budget_minutes, scale, scaled, tuple(estimate(scaled, work)), work, spent_seconds
        ).estimated_minutes

    return largest_fitting(lambda scale: minutes(scale) <= budget_minutes, 0.0, 2 * left / training)  # over budget


@dataclass(frozen=True)
class PipelineOptions:
    inputs: tuple[str, ...] = (VITAL_ARTICLES, SQUAD_PARAGRAPHS)
    run_dir: Path = Path("runs/default")
    warm_start: str = "minilm"  # both retriever towers and the reader ("random": tests)
    qa_train: Path | str | None = None  # a QA file, or a named set (data/question_sets.py)
    qa_dev: Path | str | None = None
    qa_articles: Path | None = None  # a SQuAD file naming each training question's article (tuning_split)
    ablations: bool = False
    budget_minutes: float | None = None
    progress: bool = True
    command: str = "realm pipeline"  # as typed, for the report
