"""How long each pipeline stage may run: one scale for every training stage, so the whole run fits a budget.

The cost of a stage is estimated from `StageCosts`: measured on this machine, on the run's own data, just before
planning (pipeline/calibrate.py), or where that cannot run the preset's constants (its `fp32_costs` where the
trainers compute in fp32, on a CPU without bf16 matmul). What the run spent before planning (corpus, warm start,
off-the-shelf index, calibration), embedding, tagging and evaluation are fixed costs; the training steps of ICT,
REALM pretraining and QA fine-tuning share what is left, all cut (or stretched) by the same factor, so the relative
lengths of the stages stay those of the preset. Schedules that count steps (warmup, the retriever freeze, the
refresh interval, checkpoints) scale with them. Each training stage takes its factor as it begins, at the pace the
run has kept (`paced_scale`).
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch

from realm.common.device import default_device
from realm.common.io import write_json_atomic
from realm.config import Preset, PretrainConfig, StageCosts
from realm.data.sources import VITAL_ARTICLES
from realm.pipeline.ablations import ablation_variants
from realm.recipes.warmup import OWN_BLOCK_READINGS

MIN_TRAINING_STEPS = 2
# MiniLM's fresh masked-LM head at the cpu preset's batch and lr starts to copy after 600-800 own-block warm-up steps;
# retrieval gained on held-out sentences after about 1,000 (docs/results.md, twelfth part)
READER_WARMUP_STEPS = 1000
BUDGET_SLACK = 1.1  # a plan may overrun its budget by this factor when the step counts hit their minimum


@dataclass(frozen=True)
class Workload:
    """What the pipeline will process: corpus blocks, and the QA questions when QA stages run."""

    blocks: int
    qa_train: int = 0  # 0: no QA fine-tuning or evaluation
    qa_dev: int = 0
    ablations: bool = False  # two more pretraining runs, three more fine-tunings and evaluations

    def __post_init__(self) -> None:
        if self.ablations and not self.qa_train:
            raise ValueError("the ablations compare exact match: they need QA training and dev questions")


@dataclass(frozen=True)
class StageEstimate:
    name: str
    steps: int  # training steps (0: not a training stage)
    step_seconds: float  # per training step
    fixed_seconds: float  # embedding, tagging, evaluation

    @property
    def seconds(self) -> float:
        return self.fixed_seconds + self.steps * self.step_seconds


@dataclass(frozen=True)
class PipelinePlan:
    budget_minutes: float | None
    scale: float  # training steps relative to the preset
    preset: Preset  # the preset with its step counts scaled, and the stage costs it was sized with
    stages: tuple[StageEstimate, ...]
    spent_seconds: float = 0.0  # before planning: corpus, warm start, off-the-shelf index, calibration
    # the estimate of a plan whose own-block reader warm-up reaches READER_WARMUP_STEPS, where this one's stops short
    reading_minutes: float | None = None

    @property
    def estimated_minutes(self) -> float:
        return (self.spent_seconds + self.preset.costs.fixed_seconds + sum(s.seconds for s in self.stages)) / 60

    def describe(self) -> str:
        p, budget = self.preset, self.budget_minutes
        fits = f" for a budget of {budget:g} min (training steps x{self.scale:.2f})" if budget else ""
        qa = f", QA {p.qa.steps} steps" if p.qa.steps else ""
        ict = f"ICT {p.ict.steps} steps" if p.ict.steps else "no ICT"
        steps = f"{ict}, REALM {p.pretrain.steps} steps{qa}"
        short = (
            f"; REALM's reader warm-up gets {p.pretrain.null_warmup_steps:,} of the {READER_WARMUP_STEPS:,} steps after "
            f"which retrieval helped in docs/results.md (twelfth part): a budget of about "
            f"{math.ceil(self.reading_minutes)} min gives it them"
            if self.reading_minutes is not None
            else ""
        )
        return f"{self.estimated_minutes:.0f} min estimated with {p.costs.source}{fits}; {steps}{short}"

    def to_dict(self) -> dict:
        return {
            "budget_minutes": self.budget_minutes,
            "scale": self.scale,
            "estimated_minutes": self.estimated_minutes,
            "spent_seconds": self.spent_seconds,
            "reading_minutes": self.reading_minutes,
            "costs": dataclasses.asdict(self.preset.costs),
            "stages": [{**dataclasses.asdict(s), "seconds": s.seconds} for s in self.stages],
        }


def _scaled(value: int, scale: float, minimum: int = 1) -> int:
    return max(minimum, round(value * scale))


def scale_preset(preset: Preset, scale: float, qa_train: int) -> Preset:
    """The preset with every training length (and the schedules counted in steps) times `scale`."""
    ict, pretrain, qa = preset.ict, preset.pretrain, preset.qa
    steps = _scaled(pretrain.steps, scale, MIN_TRAINING_STEPS)
    pretrain = dataclasses.replace(
        pretrain,
        steps=steps,
        warmup_steps=_scaled(pretrain.warmup_steps, scale),
        retriever_frozen_steps=min(steps - 1, round(pretrain.retriever_frozen_steps * scale)),
        null_warmup_steps=min(steps - 1, round(pretrain.null_warmup_steps * scale)),
        refresh_every=_scaled(pretrain.refresh_every, scale) if pretrain.refresh_every else 0,
        checkpoint_every=_scaled(pretrain.checkpoint_every, scale),
    )
    ict = dataclasses.replace(
        ict,
        steps=_scaled(ict.steps, scale, MIN_TRAINING_STEPS) if ict.steps else 0,  # 0: no ICT stage
        warmup_steps=_scaled(ict.warmup_steps, scale),
        checkpoint_every=_scaled(ict.checkpoint_every, scale),
    )
    if qa_train:
        qa_steps = _scaled(qa.total_steps(qa_train), scale, MIN_TRAINING_STEPS)
        qa = dataclasses.replace(qa, steps=qa_steps, checkpoint_every=min(qa.checkpoint_every, qa_steps))
    return dataclasses.replace(preset, ict=ict, pretrain=pretrain, qa=qa)


def pretrain_step_seconds(cfg: PretrainConfig, costs: StageCosts) -> float:
    """Mean seconds a REALM pretraining step: the null-document warm-up reads one short sequence an example; a
    retrieval step reads `num_candidates - 1` long ones, and shares the cores with the index builder once the
    towers train and the index refreshes (with a fixed document tower: never, and no document-tower gradient)."""
    null = cfg.steps if cfg.num_candidates <= 1 else min(cfg.null_warmup_steps, cfg.steps)
    if cfg.doc_tower == "fixed":
        seconds = null * costs.null_pretrain_step + (cfg.steps - null) * costs.query_tower_pretrain_step
        return seconds / max(1, cfg.steps)
    towers_from = min(max(cfg.towers_start_step, null), cfg.steps)
    quiet = cfg.steps - null if not cfg.refresh_every else towers_from - null  # retrieval, no builder at work
    busy = cfg.steps - null - quiet
    seconds = null * costs.null_pretrain_step + quiet * costs.frozen_pretrain_step + busy * costs.pretrain_step
    return seconds / max(1, cfg.steps)


def costed_for(preset: Preset, dtype: torch.dtype) -> Preset:
    """The preset with the stage costs of the precision its trainers compute in: without bf16 matmul (an AVX2-only
    CPU) every stage runs in fp32, 1.1-2.3x slower, and a plan costed for bf16 would overrun its budget."""
    if dtype == torch.float32 and preset.fp32_costs is not None:
        return dataclasses.replace(preset, costs=preset.fp32_costs)
    return preset


def qa_scoring_seconds(preset: Preset, work: Workload, steps: int) -> float:
    """Fine-tuning scores the dev questions (up to `dev_limit`) after each epoch and at its last step."""
    per_epoch = math.ceil(work.qa_train / preset.qa.batch_size)
    questions = min(work.qa_dev, preset.qa.dev_limit or work.qa_dev)
    return math.ceil(steps / per_epoch) * questions * preset.costs.qa_question


def estimate(preset: Preset, work: Workload) -> list[StageEstimate]:
    """Per-stage estimates for `preset` as it stands."""
    c = preset.costs
    embed = work.blocks / c.embed_blocks_per_second
    qa_steps = preset.qa.total_steps(work.qa_train) if work.qa_train else 0
    scoring = qa_scoring_seconds(preset, work, qa_steps) if work.qa_train else 0.0
    pretrain_steps = preset.pretrain.steps
    # An index whose document tower already built one in the run copies its embeddings (pipeline/work.py:
    # run_indexes). REALM's first index is its start's: ICT's, embedded by the REALM stage, or without ICT the warm
    # start's, which QA runs build before planning (QA is calibrated on it); a fixed document tower's later indexes
    # are copies of the first.
    first_index = 0.0 if not preset.ict.steps and work.qa_train else embed
    reembed = 0.0 if preset.pretrain.doc_tower == "fixed" else embed
    stages = [StageEstimate("ict", preset.ict.steps, c.ict_step, 0.0)] if preset.ict.steps else []
    stages += [
        StageEstimate(
            "realm",
            pretrain_steps,
            pretrain_step_seconds(preset.pretrain, c),
            (work.blocks / c.tag_blocks_per_second) + first_index,
        ),
    ]
    if work.qa_train:
        stages += [StageEstimate("ict_index", 0, 0.0, reembed)] if preset.ict.steps else []
        stages += [StageEstimate("realm_index", 0, 0.0, reembed)]
        stages += [
            StageEstimate("qa", qa_steps, c.qa_step, scoring),
            StageEstimate("eval", 0, 0.0, work.qa_dev * c.qa_systems_question),
        ]
    if work.ablations:
        stages += [StageEstimate("qa_ict", qa_steps, c.qa_step, scoring + work.qa_dev * c.qa_question)]
        for variant, changes in ablation_variants(preset.pretrain).items():
            varied = dataclasses.replace(preset.pretrain, **changes)
            stages += [
                StageEstimate(f"realm_{variant}", pretrain_steps, pretrain_step_seconds(varied, c), 0.0),
                StageEstimate(f"realm_{variant}_index", 0, 0.0, 0.0 if varied.doc_tower == "fixed" else embed),
                StageEstimate(f"qa_{variant}", qa_steps, c.qa_step, scoring + work.qa_dev * c.qa_question),
            ]
    return stages


def plan_pipeline(
    preset: Preset,
    work: Workload,
    budget_minutes: float | None,
    scale: float | None = None,
    spent_seconds: float = 0.0,
) -> PipelinePlan:
    """Scale the preset's step counts so the estimated run fits `budget_minutes` (None: keep them), of which
    `spent_seconds` are gone. `scale`: the one an earlier plan of this run chose, kept so its finished stages stay
    valid."""
    stages = estimate(preset, work)
    if budget_minutes is None:
        return PipelinePlan(None, 1.0, preset, tuple(stages), spent_seconds)
    chosen = _scale_to_fit(preset, work, stages, budget_minutes, spent_seconds) if scale is None else scale
    scaled = scale_preset(preset, chosen, work.qa_train)
    reading = _reading_minutes(preset, scaled, work, spent_seconds)
    plan = PipelinePlan(budget_minutes, chosen, scaled, tuple(estimate(scaled, work)), spent_seconds, reading)
    if scale is None and plan.estimated_minutes > budget_minutes * BUDGET_SLACK:  # the minimum step counts do not fit
        raise ValueError(
            f"a budget of {budget_minutes:g} min is too small: even {MIN_TRAINING_STEPS} steps per "
            f"trainer take about {plan.estimated_minutes:.0f} min on the {_costed(preset)}"
        )
    return plan


def _reading_minutes(preset: Preset, scaled: Preset, work: Workload, spent_seconds: float) -> float | None:
    """Where `scaled` cuts an own-block reader warm-up below READER_WARMUP_STEPS: the estimated minutes of the plan
    that keeps them (every trainer scaled alike); else None."""
    warmup = preset.pretrain.null_warmup_steps
    own_block = preset.pretrain.reader_warmup in OWN_BLOCK_READINGS
    if not own_block or not warmup or scaled.pretrain.null_warmup_steps >= READER_WARMUP_STEPS:
        return None
    scale = READER_WARMUP_STEPS / warmup
    kept = scale_preset(preset, scale, work.qa_train)
    return PipelinePlan(None, scale, kept, tuple(estimate(kept, work)), spent_seconds).estimated_minutes


def plan_run(
    options: PipelineOptions, preset: Preset, work: Workload, calibration: dict | None, spent_seconds: float
) -> PipelinePlan:
    """Planned once per run directory: a re-run for the same budget, preset and workload keeps the scale in
    plan.json, so stage costs measured anew cannot change step counts and so re-run finished stages. A new plan is
    costed with the `calibration`'s measured costs (pipeline/calibrate.py), else the constants of the precision this
    machine trains in; `spent_seconds` (the stages before planning) count against the budget."""
    basis = {"budget_minutes": options.budget_minutes, "preset": preset.name, "workload": dataclasses.asdict(work)}
    path = Path(options.run_dir) / "plan.json"
    stored = json.loads(path.read_text()) if path.is_file() else {}
    dtype = preset.compute_dtype(default_device())
    costed = costed_for(preset, dtype)
    if calibration is not None:
        costed = dataclasses.replace(costed, costs=StageCosts(**calibration["costs"]))
    kept = stored["scale"] if stored.get("basis") == basis else None
    plan = plan_pipeline(costed, work, options.budget_minutes, kept, spent_seconds)
    settings = {k: str(v) if isinstance(v, Path) else v for k, v in dataclasses.asdict(options).items()}
    record = {"basis": basis, **plan.to_dict(), "compute_dtype": str(dtype).removeprefix("torch.")}
    record["stage_scales"] = stored.get("stage_scales", {}) if kept is not None else {}  # set as each stage begins
    record["calibration"] = calibration["measured"] if calibration else None
    write_json_atomic(path, {**record, "preset": plan.preset.to_dict(), "options": settings})
    return plan


def paced_scale(
    plan: PipelinePlan, costed: Preset, work: Workload, ran: dict[str, float], took: dict[str, float]
) -> float:
    """The scale of the next training stage's steps: what fits the budget left at the pace the run has kept. A
    machine's speed drifts (a shared host, a long run's heat) further than a minute's calibration can see: the
    stages finished since the plan took `pace` times their estimate, and every stage left is costed at that pace.
    `costed`: the preset unscaled, with the plan's costs; `ran`: the scale each planned stage begun ran with;
    `took`: the seconds of every finished stage, those before the plan too."""
    assert plan.budget_minutes is not None

    def seconds(scale: float) -> dict[str, float]:
        return {s.name: s.seconds for s in estimate(scale_preset(costed, scale, work.qa_train), work)}

    finished = [name for name in ran if name in took]
    if not finished:
        return plan.scale
    pace = sum(took[n] for n in finished) / max(1e-9, sum(seconds(ran[n])[n] for n in finished))
    left = plan.budget_minutes * 60 - sum(took.values())

    def needed(scale: float) -> float:
        rest = sum(v for name, v in seconds(scale).items() if name not in took)
        return pace * (rest + costed.costs.fixed_seconds)

    fits, too_long = 0.0, max(plan.scale, 1e-3)
    while needed(too_long) <= left and too_long < 1e3:
        fits, too_long = too_long, 2 * too_long
    return _largest_fitting(lambda scale: needed(scale) <= left, fits, too_long)


def paced_preset(
    plan: PipelinePlan, base: Preset, work: Workload, path: Path, stage: str, took: dict[str, float]
) -> tuple[Preset, float]:
    """The plan's preset (`base` scaled) with the steps of the training stage `stage`, about to begin, sized at the
    run's pace, and that scale, kept in plan.json (`path`): a re-run trains the same steps."""
    if plan.budget_minutes is None:
        return plan.preset, plan.scale
    costed = dataclasses.replace(base, costs=plan.preset.costs)
    stored = json.loads(path.read_text())
    scales = stored["stage_scales"]
    if stage not in scales:
        scales[stage] = paced_scale(plan, costed, work, scales, took)
        write_json_atomic(path, stored)
    return scale_preset(costed, scales[stage], work.qa_train), scales[stage]


def _costed(preset: Preset) -> str:
    """Which costs an estimate used, for the messages that refuse a budget."""
    return f"{preset.name} preset, costed with {preset.costs.source}"


def _scale_to_fit(
    preset: Preset, work: Workload, stages: list[StageEstimate], budget_minutes: float, spent_seconds: float
) -> float:
    """The largest factor on every trainer's steps whose plan fits what the fixed costs leave of the budget (some
    grow with the steps: fine-tuning scores the dev questions once an epoch)."""
    fixed = spent_seconds + preset.costs.fixed_seconds + sum(s.fixed_seconds for s in stages)
    training = sum(s.steps * s.step_seconds for s in stages)
    left = budget_minutes * 60 - fixed
    if left <= 0 or training <= 0:
        raise ValueError(
            f"a budget of {budget_minutes:g} min is too small: embedding, tagging and evaluation "
            f"alone take about {fixed / 60:.0f} min on the {_costed(preset)}"
        )

    def minutes(scale: float) -> float:
        scaled = scale_preset(preset, scale, work.qa_train)
        return PipelinePlan(
            budget_minutes, scale, scaled, tuple(estimate(scaled, work)), spent_seconds
        ).estimated_minutes

    return _largest_fitting(lambda scale: minutes(scale) <= budget_minutes, 0.0, 2 * left / training)  # over budget


def _largest_fitting(fits: Callable[[float], bool], low: float, high: float) -> float:
    """Bisection: the largest scale in [low, high] that `fits` (low fits, high does not; cost grows with scale)."""
    for _ in range(40):
        middle = (low + high) / 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return low


@dataclass(frozen=True)
class PipelineOptions:
    inputs: tuple[str, ...] = (VITAL_ARTICLES,)
    run_dir: Path = Path("runs/default")
    warm_start: str = "minilm"  # both retriever towers and the reader ("random": tests)
    qa_train: Path | None = None
    qa_dev: Path | None = None
    ablations: bool = False
    budget_minutes: float | None = None
    progress: bool = True
    command: str = "realm pipeline"  # as typed, for the report
