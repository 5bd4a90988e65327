"""How long each pipeline stage may run: one scale for every training stage, so the whole run fits a budget.

The cost of a stage is estimated from the preset's `StageCosts` (measured on the machine the preset is
sized for; its `fp32_costs` where the trainers will compute in fp32, on a CPU without bf16 matmul).
Embedding, tagging and evaluation are fixed costs; the training steps of ICT, REALM pretraining and QA
fine-tuning share what is left, all cut (or stretched) by the same factor, so the
relative lengths of the stages stay those of the preset. Schedules that count steps (warmup, the
retriever freeze, the refresh interval, checkpoints) scale with them.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import torch

from realm.config import Preset, PretrainConfig, StageCosts
from realm.data.sources import VITAL_ARTICLES
from realm.pipeline.ablations import ablation_variants

MIN_TRAINING_STEPS = 2
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
    preset: Preset  # the preset with its step counts scaled
    stages: tuple[StageEstimate, ...]

    @property
    def estimated_minutes(self) -> float:
        return (self.preset.costs.fixed_seconds + sum(s.seconds for s in self.stages)) / 60

    def to_dict(self) -> dict:
        return {
            "budget_minutes": self.budget_minutes,
            "scale": self.scale,
            "estimated_minutes": self.estimated_minutes,
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
        steps=_scaled(ict.steps, scale, MIN_TRAINING_STEPS),
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


def estimate(preset: Preset, work: Workload) -> list[StageEstimate]:
    """Per-stage estimates for `preset` as it stands."""
    c = preset.costs
    embed = work.blocks / c.embed_blocks_per_second
    qa_steps = preset.qa.total_steps(work.qa_train) if work.qa_train else 0
    pretrain_steps = preset.pretrain.steps
    stages = [
        StageEstimate("ict", preset.ict.steps, c.ict_step, 0.0),
        StageEstimate(
            "realm",
            pretrain_steps,
            pretrain_step_seconds(preset.pretrain, c),
            (work.blocks / c.tag_blocks_per_second) + embed,
        ),
    ]
    # An index whose document tower already built one in the run copies its embeddings (pipeline/work.py:
    # run_indexes): with a fixed document tower, every REALM index is the ICT tower's, embedded once (the REALM
    # stage's first index); a trained one's first index is the ICT tower's too.
    reembed = 0.0 if preset.pretrain.doc_tower == "fixed" else embed
    if work.qa_train:
        stages += [
            StageEstimate("baseline_index", 0, 0.0, embed),
            StageEstimate("ict_index", 0, 0.0, reembed),
            StageEstimate("realm_index", 0, 0.0, reembed),
        ]
        stages += [
            StageEstimate("qa", qa_steps, c.qa_step, 0.0),
            StageEstimate("eval", 0, 0.0, 3 * work.qa_dev * c.qa_question),
        ]
    if work.ablations:
        stages += [StageEstimate("qa_ict", qa_steps, c.qa_step, work.qa_dev * c.qa_question)]
        for variant, changes in ablation_variants(preset.pretrain).items():
            varied = dataclasses.replace(preset.pretrain, **changes)
            stages += [
                StageEstimate(f"realm_{variant}", pretrain_steps, pretrain_step_seconds(varied, c), 0.0),
                StageEstimate(f"realm_{variant}_index", 0, 0.0, 0.0 if varied.doc_tower == "fixed" else embed),
                StageEstimate(f"qa_{variant}", qa_steps, c.qa_step, work.qa_dev * c.qa_question),
            ]
    return stages


def plan_pipeline(
    preset: Preset, work: Workload, budget_minutes: float | None, scale: float | None = None
) -> PipelinePlan:
    """Scale the preset's step counts so the estimated run fits `budget_minutes` (None: keep them).
    `scale`: the one an earlier plan of this run chose, kept so its finished stages stay valid."""
    stages = estimate(preset, work)
    if budget_minutes is None:
        return PipelinePlan(None, 1.0, preset, tuple(stages))
    chosen = _scale_to_fit(preset, stages, budget_minutes) if scale is None else scale
    scaled = scale_preset(preset, chosen, work.qa_train)
    plan = PipelinePlan(budget_minutes, chosen, scaled, tuple(estimate(scaled, work)))
    if scale is None and plan.estimated_minutes > budget_minutes * BUDGET_SLACK:  # the minimum step counts do not fit
        raise ValueError(
            f"a budget of {budget_minutes:g} min is too small: even {MIN_TRAINING_STEPS} steps per "
            f"trainer take about {plan.estimated_minutes:.0f} min on the {_costed(preset)}"
        )
    return plan


def costed_in_fp32(preset: Preset) -> bool:
    """Whether `costed_for` gave the preset its fp32 stage costs."""
    return preset.fp32_costs is not None and preset.costs == preset.fp32_costs


def _costed(preset: Preset) -> str:
    """Which costs an estimate used, for the messages that refuse a budget."""
    return f"{preset.name} preset" + (" in fp32 (this machine has no bf16 matmul)" if costed_in_fp32(preset) else "")


def _scale_to_fit(preset: Preset, stages: list[StageEstimate], budget_minutes: float) -> float:
    """The factor on every trainer's steps that fills what the fixed costs leave of the budget."""
    fixed = preset.costs.fixed_seconds + sum(s.fixed_seconds for s in stages)
    training = sum(s.steps * s.step_seconds for s in stages)
    left = budget_minutes * 60 - fixed
    if left <= 0 or training <= 0:
        raise ValueError(
            f"a budget of {budget_minutes:g} min is too small: embedding, tagging and evaluation "
            f"alone take about {fixed / 60:.0f} min on the {_costed(preset)}"
        )
    return left / training


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
