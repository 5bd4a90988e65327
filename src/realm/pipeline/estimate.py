"""The cost model of `realm pipeline`: what a run processes (`Workload`), each stage's cost in steps and seconds at
a preset's step counts (the `Cost` functions pipeline/stage_table.py names for its stages), and a preset's steps scaled by one factor (`scale_preset`) or set to
what a finished trainer trained (`trained_preset`). The costs are `StageCosts`: measured on this machine before
planning (pipeline/calibrate.py), or the preset's constants (`costed_for`: fp32's where the trainers compute in it).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass

import torch

from realm.config import Preset, PretrainConfig, QAConfig, StageCosts
from realm.pipeline.work import EXAMPLE_POOL

MIN_TRAINING_STEPS = 2
# MiniLM's fresh masked-LM head at the cpu preset's batch (8) and lr starts to copy after 600-800 own-block warm-up
# steps; retrieval gained on held-out sentences after about 1,000
# (docs/log/2026-11-27-results-how-many-warm-up-steps-and-a-cheaper-warm-up-step-twelfth-part.md): counted in sentences,
# so that a preset of larger batches (gpu) is held to as many sentences in fewer steps
READER_WARMUP_SENTENCES = 1000 * 8
WARMUP_FINDING = "docs/log/2026-11-27-results-how-many-warm-up-steps-and-a-cheaper-warm-up-step-twelfth-part.md"
# Fewer QA steps of 8 questions than 100 and the reader has not learned to read: SQuAD-open dev hybrid EM 2.3-2.5 after
# 15-16 steps (docs/log/2026-11-27-results-the-fine-tuned-query-tower-kept-only-when-it-beats-its-start-s-on-a.md), 46.3
# after 487 (docs/log/2026-11-24-results-the-query-tower-alone-realm-at-least-as-good-as-its-ict-warm-start-cpu.md),
# 50.9 after 823 (docs/log/2026-11-28-results-training-first-the-50-minute-qa-pipeline-on-a-bf16-cpu-and-in-fp32.md).
# Not measured in between: a round number well above the failures. Counted in questions, for any batch. A preset whose
# whole QA fine-tuning is shorter (a training file of a few hundred questions) is not held to it.
QA_MIN_QUESTIONS = 100 * 8
SCORED_SENTENCES = 1000  # held-out sentences scored when the budget affords them all
MIN_EVAL_QUESTIONS = 300  # the smallest dev sample: EM +-5.6 points at 50%
MIN_SCORED_SENTENCES = 300
HELD_OUT_RETRIEVERS = 2  # recall on the held-out training questions: the off-the-shelf and REALM retrievers


def reader_warmup_steps(cfg: PretrainConfig) -> int:
    """The own-block warm-up steps after which retrieval helped (READER_WARMUP_SENTENCES), at this batch size."""
    return math.ceil(READER_WARMUP_SENTENCES / cfg.batch_size)


def qa_min_steps(cfg: QAConfig) -> int:
    """The fewest QA steps worth running (QA_MIN_QUESTIONS), at this batch size."""
    return math.ceil(QA_MIN_QUESTIONS / cfg.batch_size)


@dataclass(frozen=True)
class Workload:
    """What the pipeline will process: corpus blocks, and the QA questions when QA stages run."""

    blocks: int
    qa_train: int = 0  # 0: no QA fine-tuning or evaluation
    qa_dev: int = 0
    ablations: bool = False  # two more pretraining runs, three more fine-tunings and evaluations
    qa_held_out: int = 0  # training questions held out of fine-tuning to choose retrievers on
    # what the plan sizes: the dev questions evaluated (None: all) and the held-out sentences scored
    eval_questions: int | None = None
    scored_sentences: int = SCORED_SENTENCES
    held_out_sentences: int | None = None  # held-out sentences with a salient span, as calibrated (None: unknown)

    def __post_init__(self) -> None:
        if self.ablations and not self.qa_train:
            raise ValueError("the ablations compare exact match: they need QA training and dev questions")

    @property
    def evaluated(self) -> int:
        """Dev questions the evaluation answers."""
        return self.qa_dev if self.eval_questions is None else min(self.eval_questions, self.qa_dev)

    @property
    def least_evaluated(self) -> int:
        """The fewest dev questions the evaluation answers whatever the clock (MIN_EVAL_QUESTIONS); under --ablations
        the arms answer at least as many of the same ones, in the run's last stage (pipeline/pace.py: _evaluation)."""
        return min(self.qa_dev, MIN_EVAL_QUESTIONS)

    def measured(self, share: float) -> Workload:
        """The workload with `share` (0: the least, 1: all) of the dev questions and held-out sentences measured."""
        least_q, least_s = self.least_evaluated, min(SCORED_SENTENCES, MIN_SCORED_SENTENCES)
        questions = round(least_q + share * (self.qa_dev - least_q))
        sentences = round(least_s + share * (SCORED_SENTENCES - least_s))
        return dataclasses.replace(
            self, eval_questions=None if questions >= self.qa_dev else questions, scored_sentences=sentences
        )


@dataclass(frozen=True)
class StageEstimate:
    name: str
    steps: int  # training steps (0: not a training stage)
    step_seconds: float  # per training step
    fixed_seconds: float  # embedding, tagging, evaluation

    @property
    def seconds(self) -> float:
        return self.fixed_seconds + self.steps * self.step_seconds


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
    reading = preset.reading
    if qa_train:
        qa_steps = _scaled(qa.total_steps(qa_train), scale, MIN_TRAINING_STEPS)
        qa = dataclasses.replace(qa, steps=qa_steps, checkpoint_every=min(qa.checkpoint_every, qa_steps))
        if reading.total_steps(qa_train):  # 0: no reading stage
            read_steps = _scaled(reading.total_steps(qa_train), scale, MIN_TRAINING_STEPS)
            checkpoints = min(reading.checkpoint_every, read_steps)
            reading = dataclasses.replace(reading, steps=read_steps, checkpoint_every=checkpoints)
    return dataclasses.replace(preset, ict=ict, pretrain=pretrain, qa=qa, reading=reading)


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
    """Fine-tuning scores the held-out training questions (up to `dev_limit`) after each epoch and at its last
    step."""
    per_epoch = math.ceil(work.qa_train / preset.qa.batch_size)
    questions = min(work.qa_held_out, preset.qa.dev_limit or work.qa_held_out)
    return math.ceil(steps / per_epoch) * questions * preset.costs.qa_question


# A stage's cost model (pipeline/stage_table.py names one for each stage): (training steps, seconds a step, fixed
# seconds: starting, embedding, tagging, scoring) at the preset's step counts for the run's workload.
Cost = Callable[[Preset, Workload], tuple[int, float, float]]


def _embed(preset: Preset, work: Workload) -> float:
    return work.blocks / preset.costs.embed_blocks_per_second


def _held_out_recall(preset: Preset, work: Workload) -> float:
    """One retriever's recall on the held-out training questions."""
    return work.qa_held_out * preset.costs.recall_question


def _retrievers(preset: Preset) -> int:
    """The retrievers a QA run compares: the off-the-shelf one, ICT's where it runs, REALM's."""
    return HELD_OUT_RETRIEVERS + (1 if preset.ict.steps else 0)


def ict_cost(preset: Preset, work: Workload) -> tuple[int, float, float]:
    return preset.ict.steps, preset.costs.ict_step, preset.costs.ict_startup


def realm_cost(preset: Preset, work: Workload) -> tuple[int, float, float]:
    """REALM pretraining: tagging the corpus's salient spans, and its first index. An index whose document tower
    already built one in the run copies its embeddings (pipeline/work.py: run_indexes): REALM's first index is its
    start's, ICT's, embedded here, or without ICT the warm start's, which QA runs build before planning (QA is
    calibrated on it)."""
    c = preset.costs
    first_index = 0.0 if not preset.ict.steps and work.qa_train else _embed(preset, work)
    tagging = work.blocks / c.tag_blocks_per_second
    return preset.pretrain.steps, pretrain_step_seconds(preset.pretrain, c), tagging + first_index + c.pretrain_startup


def arm_realm_cost(preset: Preset, work: Workload) -> tuple[int, float, float]:
    """An ablation arm's REALM pretraining: the main stage's salient spans and first index are reused."""
    c = preset.costs
    return preset.pretrain.steps, pretrain_step_seconds(preset.pretrain, c), c.pretrain_startup


def index_cost(preset: Preset, work: Workload) -> tuple[int, float, float]:
    """An index after pretraining: with a fixed document tower, a copy of the first index's embeddings."""
    return 0, 0.0, 0.0 if preset.pretrain.doc_tower == "fixed" else _embed(preset, work)


def qa_start_cost(preset: Preset, work: Workload) -> tuple[int, float, float]:
    return 0, 0.0, _retrievers(preset) * _held_out_recall(preset, work)


def read_cost(preset: Preset, work: Workload) -> tuple[int, float, float]:
    """The reading stage: the blocks each training question reads, found once, then its steps."""
    c = preset.costs
    return preset.reading.total_steps(work.qa_train), c.read_step, c.read_startup + work.qa_train * c.read_question


def qa_cost(preset: Preset, work: Workload) -> tuple[int, float, float]:
    """ORQA's fine-tuning, its held-out scoring, and the recall of the kept query tower and its start."""
    c = preset.costs
    steps = preset.qa.total_steps(work.qa_train)
    fixed = (
        qa_scoring_seconds(preset, work, steps) + c.qa_startup + HELD_OUT_RETRIEVERS * _held_out_recall(preset, work)
    )
    return steps, c.qa_step, fixed


def arms_eval_cost(arms: int) -> Cost:
    """The `arms` ablation arms' dense exact match on the main evaluation's sample, the run's last stage."""

    def cost(preset: Preset, work: Workload) -> tuple[int, float, float]:
        return 0, 0.0, arms * work.evaluated * preset.costs.qa_question

    return cost


def eval_cost(preset: Preset, work: Workload) -> tuple[int, float, float]:
    """The fine-tuned model with three retrievers on the sample; zero-shot recall of each retriever on all."""
    c = preset.costs
    return 0, 0.0, work.evaluated * c.qa_systems_question + _retrievers(preset) * work.qa_dev * c.recall_question


def measure_cost(preset: Preset, work: Workload) -> tuple[int, float, float]:
    """An arm's Table 2 columns: its retriever's zero-shot recall on every dev question, and its masked-LM gain on
    the held-out sentences the main run scored."""
    c = preset.costs
    sentences = work.held_out_sentences if work.held_out_sentences is not None else SCORED_SENTENCES
    return 0, 0.0, work.qa_dev * c.recall_question + min(work.scored_sentences, sentences) * c.scored_sentence


def examples_cost(preset: Preset, work: Workload) -> tuple[int, float, float]:
    """The worked examples' pool and the held-out sentences scored, with retrieval and without."""
    sentences = work.held_out_sentences if work.held_out_sentences is not None else SCORED_SENTENCES
    read = min(EXAMPLE_POOL, sentences) + min(work.scored_sentences, sentences)
    return 0, 0.0, read * preset.costs.scored_sentence


def retrieval_step_seconds(cfg: PretrainConfig, costs: StageCosts) -> float:
    """The estimate of a REALM step after the reader warm-up (the steps whose rate decays)."""
    if cfg.num_candidates <= 1:
        return costs.null_pretrain_step
    if cfg.doc_tower == "fixed":
        return costs.query_tower_pretrain_step
    return costs.pretrain_step if cfg.refresh_every else costs.frozen_pretrain_step


def trained_preset(preset: Preset, kind: str | None, trained: dict[str, int]) -> Preset:
    """`preset` with the step counts a trainer of `kind` trained (its steps.json): as fixed steps they replay its
    schedule (the ablations train exactly as long as the stage they are compared with)."""
    steps, decay_from = trained["steps"], trained["decay_from"]
    if kind == "realm":
        warmup = trained["null_warmup_steps"]
        pretrain = dataclasses.replace(preset.pretrain, steps=steps, null_warmup_steps=warmup, decay_from=decay_from)
        return dataclasses.replace(preset, pretrain=pretrain)
    if kind == "qa":
        qa = dataclasses.replace(preset.qa, steps=steps, lr_warmup=trained["lr_warmup"], decay_from=decay_from)
        return dataclasses.replace(preset, qa=qa)
    if kind == "read":
        reading = dataclasses.replace(
            preset.reading, steps=steps, lr_warmup=trained["lr_warmup"], decay_from=decay_from
        )
        return dataclasses.replace(preset, reading=reading)
    if kind == "ict":
        return dataclasses.replace(preset, ict=dataclasses.replace(preset.ict, steps=steps, decay_from=decay_from))
    raise ValueError(f"{kind!r} is not a kind of training step")


def largest_fitting(fits: Callable[[float], bool], low: float, high: float) -> float:
    """Bisection: the largest scale in [low, high] that `fits` (low fits, high does not; cost grows with scale)."""
    for _ in range(40):
        middle = (low + high) / 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return low
