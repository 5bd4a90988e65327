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
naming the budget this machine needs. The budget is a deadline (`PipelinePlan.ends_at`): each stage after the plan
is allotted, as it begins, what is left less the stages after it at the run's pace (`time_stage`), each kind of
training step at its own; a trainer ends its steps by its deadline (training.py: TimedSchedule), an evaluation
scores in a seeded order until its allotment ends (eval/time_limit.py: the sample its estimate sized is what the
report plans by, the clock decides).
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from realm.common.device import default_device, describe_machine
from realm.common.io import write_json_atomic
from realm.common.provenance import describe_code
from realm.config import Preset, PretrainConfig, QAConfig, StageCosts
from realm.data.sources import SQUAD_PARAGRAPHS, VITAL_ARTICLES
from realm.pipeline.ablations import ablation_variants
from realm.pipeline.work import EXAMPLE_POOL
from realm.recipes.warmup import OWN_BLOCK_READINGS

MIN_TRAINING_STEPS = 2
# MiniLM's fresh masked-LM head at the cpu preset's batch (8) and lr starts to copy after 600-800 own-block warm-up
# steps; retrieval gained on held-out sentences after about 1,000
# (docs/log/2026-11-27-results-how-many-warm-up-steps-and-a-cheaper-warm-up-step-twelfth-part.md): counted in sentences,
# so that a preset of larger batches (gpu) is held to as many sentences in fewer steps
READER_WARMUP_SENTENCES = 1000 * 8
WARMUP_FINDING = "docs/log/2026-11-27-results-how-many-warm-up-steps-and-a-cheaper-warm-up-step-twelfth-part.md"
FEW_QA_STEPS_FINDING = (
    "docs/log/2026-11-27-results-the-fine-tuned-query-tower-kept-only-when-it-beats-its-start-s-on-a.md"
)
BUDGET_SLACK = 1.1  # a plan may overrun its budget by this factor when the step counts hit their minimum
# Training first: at least this share of the budget goes to training steps; evaluation and held-out scoring are
# sampled to fit what is left (down to their minimum samples)
TRAINING_SHARE = 0.6
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
PACE_BOUND = 1.5  # the run's pace corrects an estimate by at most this factor either way
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

    def measured(self, share: float) -> Workload:
        """The workload with `share` (0: the least, 1: all) of the dev questions and held-out sentences measured."""
        least_q, least_s = min(self.qa_dev, MIN_EVAL_QUESTIONS), min(SCORED_SENTENCES, MIN_SCORED_SENTENCES)
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
        if p.qa.steps and p.reading.steps:
            qa = f", reading {p.reading.steps} steps{qa}"
        ict = f"ICT {p.ict.steps} steps" if p.ict.steps else "no ICT"
        steps = f"{ict}, REALM {p.pretrain.steps} steps{qa}"
        share = f" ({100 * self.training_minutes / budget:.0f}% of the budget)" if budget else ""
        measured = f"; {self.training_minutes:.0f} min of training steps{share}, then "
        if w.qa_dev:
            measured += f"EM over {w.evaluated:,} of {w.qa_dev:,} dev questions and "
        measured += f"{w.scored_sentences:,} held-out sentences scored"
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


def estimate(preset: Preset, work: Workload) -> list[StageEstimate]:
    """Per-stage estimates for `preset` as it stands, every stage after the plan."""
    c = preset.costs
    embed = work.blocks / c.embed_blocks_per_second
    qa_steps = preset.qa.total_steps(work.qa_train) if work.qa_train else 0
    scoring = qa_scoring_seconds(preset, work, qa_steps) if work.qa_train else 0.0
    held_out_recall = work.qa_held_out * c.recall_question  # one retriever's recall on the held-out training questions
    pretrain_steps = preset.pretrain.steps
    # An index whose document tower already built one in the run copies its embeddings (pipeline/work.py:
    # run_indexes). REALM's first index is its start's: ICT's, embedded by the REALM stage, or without ICT the warm
    # start's, which QA runs build before planning (QA is calibrated on it); a fixed document tower's later indexes
    # are copies of the first.
    first_index = 0.0 if not preset.ict.steps and work.qa_train else embed
    reembed = 0.0 if preset.pretrain.doc_tower == "fixed" else embed
    stages = [StageEstimate("ict", preset.ict.steps, c.ict_step, c.ict_startup)] if preset.ict.steps else []
    tagging = work.blocks / c.tag_blocks_per_second
    realm_step = pretrain_step_seconds(preset.pretrain, c)
    stages += [StageEstimate("realm", pretrain_steps, realm_step, tagging + first_index + c.pretrain_startup)]
    qa_fixed = scoring + c.qa_startup + HELD_OUT_RETRIEVERS * held_out_recall  # keep_query_tower: two recalls
    if work.qa_train:
        stages += [StageEstimate("ict_index", 0, 0.0, reembed)] if preset.ict.steps else []
        stages += [StageEstimate("realm_index", 0, 0.0, reembed)]
        retrievers = HELD_OUT_RETRIEVERS + (1 if preset.ict.steps else 0)
        stages += [
            StageEstimate("qa_start", 0, 0.0, retrievers * held_out_recall),
        ]
        read_steps = 0 if work.ablations else preset.reading.total_steps(work.qa_train)  # ablations: none (run.py)
        read_fixed = c.read_startup + work.qa_train * c.read_question  # the blocks each question reads, found once
        stages += [StageEstimate("read", read_steps, c.read_step, read_fixed)] if read_steps else []
        stages += [
            StageEstimate("qa", qa_steps, c.qa_step, qa_fixed),
            # the fine-tuned model with three retrievers on the sample; zero-shot recall of each retriever on all
            StageEstimate(
                "eval", 0, 0.0, work.evaluated * c.qa_systems_question + retrievers * work.qa_dev * c.recall_question
            ),
        ]
    sentences = work.held_out_sentences if work.held_out_sentences is not None else SCORED_SENTENCES
    read = min(EXAMPLE_POOL, sentences) + min(work.scored_sentences, sentences)  # the worked examples' pool, the scored
    stages += [StageEstimate("examples", 0, 0.0, read * c.scored_sentence)]
    if work.ablations:
        dense = work.evaluated * c.qa_question  # each ablation's dense evaluation
        stages += [StageEstimate("qa_ict", qa_steps, c.qa_step, qa_fixed + dense)]
        for variant, changes in ablation_variants(preset.pretrain).items():
            varied = dataclasses.replace(preset.pretrain, **changes)
            fixed = c.pretrain_startup
            stages += [
                StageEstimate(f"realm_{variant}", pretrain_steps, pretrain_step_seconds(varied, c), fixed),
                StageEstimate(f"realm_{variant}_index", 0, 0.0, 0.0 if varied.doc_tower == "fixed" else embed),
                StageEstimate(f"qa_{variant}", qa_steps, c.qa_step, qa_fixed + dense),
            ]
    return stages


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
    return work.measured(_largest_fitting(lambda share: training_room(share) >= 0, 0.0, 1.0))


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


def step_kind(stage: str) -> str | None:
    """The kind of training step a stage takes ("ict", "realm", "read", "qa", the ablations' too), None for a stage
    without steps: each kind is paced by its own steps alone."""
    if stage.endswith("_index") or stage == "qa_start":
        return None
    kinds = ("ict", "realm", "read", "qa")
    return next((kind for kind in kinds if stage == kind or stage.startswith(f"{kind}_")), None)


@dataclass(frozen=True)
class Pace:
    """How the finished stages since the plan ran against their estimates: each kind of training step by its own
    stages (REALM's pace says nothing about a QA step), and the rest (starts, embedding, tagging, scoring)
    together; each within PACE_BOUND. 1.0: nothing of that kind has run yet."""

    steps: dict[str, float] = dataclasses.field(default_factory=dict)
    other: float = 1.0

    def of(self, stage: str) -> float:
        kind = step_kind(stage)
        return self.steps.get(kind, 1.0) if kind else 1.0

    def seconds(self, e: StageEstimate) -> float:
        """`e` at this pace."""
        return e.steps * e.step_seconds * self.of(e.name) + e.fixed_seconds * self.other

    def describe(self) -> str:
        steps = ", ".join(f"{kind} steps at {pace:.2f}x" for kind, pace in self.steps.items())
        return f"{steps + ', ' if steps else ''}the rest at {self.other:.2f}x their estimates"


MIN_PACED_SECONDS = 30.0  # estimates shorter than this are too short to pace a run by


def _bounded(observed: float, estimated: float) -> float:
    if estimated < MIN_PACED_SECONDS:
        return 1.0
    return min(PACE_BOUND, max(1 / PACE_BOUND, observed / estimated))


def run_pace(finished: dict[str, StageEstimate], took: dict[str, float], stepping: dict[str, float]) -> Pace:
    """The pace of the `finished` stages (each estimated at the steps it trained). `took`: their seconds;
    `stepping`: the seconds a finished training stage spent in its steps (from its metrics)."""
    estimated: dict[str, float] = {}
    observed: dict[str, float] = {}
    estimated_other = observed_other = 0.0
    for name, e in finished.items():
        kind = step_kind(name)
        if kind and name in stepping and e.steps:
            estimated[kind] = estimated.get(kind, 0.0) + e.steps * e.step_seconds
            observed[kind] = observed.get(kind, 0.0) + stepping[name]
            estimated_other += e.fixed_seconds
            observed_other += max(0.0, took[name] - stepping[name])
        else:
            estimated_other += e.seconds
            observed_other += took[name]
    steps = {kind: _bounded(observed[kind], estimated[kind]) for kind in estimated}
    return Pace(steps, _bounded(observed_other, estimated_other))


def trained_preset(preset: Preset, stage: str, trained: dict[str, int]) -> Preset:
    """`preset` with the step counts a trainer of `stage`'s kind trained (its steps.json): as fixed steps they
    replay its schedule (the ablations train exactly as long as the stage they are compared with)."""
    kind, steps, decay_from = step_kind(stage), trained["steps"], trained["decay_from"]
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
    raise ValueError(f"{stage!r} is not a training stage")


@dataclass(frozen=True)
class StageTiming:
    """A stage after the plan, sized as it begins: what is left of the budget, less the stages after it at the
    run's pace, is its allotment. A training stage gets the steps (`scale`) that fit it and a `Deadline` for its
    steps (training.py: its trainer ends by it); an evaluation the sample estimated to fit it (`sample`: the
    evaluation itself scores until the allotment ends)."""

    stage: str
    began: float  # time.time()
    allotted: float  # seconds
    pace: Pace
    scale: float | None = None  # training: the steps of the preset's recipe it was sized at
    deadline: dict | None = None  # training: training.Deadline's fields (no clock)
    sample: int | None = None  # the estimate of what fits: eval: dev questions answered; examples: sentences scored

    @property
    def ends_at(self) -> float:
        return self.began + self.allotted

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: dict) -> StageTiming:
        return cls(**{**data, "pace": Pace(**data["pace"])})

    def describe(self) -> str:
        ends = time.strftime("%H:%M:%S", time.localtime(self.ends_at))
        what = f"{self.allotted / 60:.1f} min allotted (to {ends})"
        if self.deadline is not None:
            steps_end = time.strftime("%H:%M:%S", time.localtime(self.deadline["at"]))
            what += f", steps x{self.scale:.3f} of the recipe's to begin with, ending by {steps_end}"
        if self.sample is not None:
            what += f", about {self.sample:,} at the estimated pace (scored until it ends)"
        return f"{what}; {self.pace.describe()}"


def time_stage(
    plan: PipelinePlan,
    costed: Preset,
    stage: str,
    took: dict[str, float],
    ran: dict[str, StageEstimate],
    stepping: dict[str, float],
    now: float,
) -> StageTiming:
    """The timing of `stage`, about to begin at `now`: its allotment is the run's deadline less `now` and the
    estimates of the stages after it at the run's pace (each kind of step at its own; the report and process end
    too). `costed`: the preset unscaled, with the plan's costs; `took`: the seconds of every finished stage;
    `ran`: each finished training stage estimated at the steps it trained; `stepping`: the seconds each finished
    training stage spent in steps. A stage already late gets its least (QA: `qa_min_steps`, the measurements their
    least samples): a run that fell behind overruns rather than hand back a reader that cannot read."""
    assert plan.ends_at is not None
    work, c = plan.work, costed.costs

    def stages_at(scale: float) -> dict[str, StageEstimate]:
        return {s.name: s for s in estimate(scale_preset(costed, scale, work.qa_train), work)}

    at_plan = stages_at(plan.scale)
    finished = {name: ran.get(name, e) for name, e in at_plan.items() if name in took}
    pace = run_pace(finished, took, stepping)
    names = list(at_plan)
    after = names[names.index(stage) + 1 :] if stage in at_plan else []
    rest = sum(pace.seconds(at_plan[name]) for name in after if name not in took) + c.fixed_seconds * pace.other
    allotted = plan.ends_at - now - rest
    timing = StageTiming(stage, now, allotted, pace)
    if stage == "eval":
        zero_shot = at_plan["eval"].fixed_seconds - work.evaluated * c.qa_systems_question
        fits = (allotted / pace.other - zero_shot) / c.qa_systems_question
        least = min(work.qa_dev, MIN_EVAL_QUESTIONS)
        return dataclasses.replace(timing, sample=int(min(work.qa_dev, max(least, fits))))
    if stage == "examples":
        held = work.held_out_sentences if work.held_out_sentences is not None else SCORED_SENTENCES
        fits = allotted / pace.other / c.scored_sentence - min(EXAMPLE_POOL, held)
        return dataclasses.replace(timing, sample=int(min(SCORED_SENTENCES, max(MIN_SCORED_SENTENCES, fits))))
    if step_kind(stage) is None:
        return timing
    scale = _largest_fitting(lambda scale: pace.seconds(stages_at(scale)[stage]) <= allotted, 0.0, 1e3)
    qa_steps = costed.qa.total_steps(work.qa_train) if work.qa_train else 0
    least = MIN_TRAINING_STEPS
    if stage == "qa" and qa_steps >= qa_min_steps(costed.qa):
        least = qa_min_steps(costed.qa)
        scale = max(scale, least / qa_steps)
    sized = scale_preset(costed, scale, work.qa_train)
    deadline = {"at": now + allotted, "step_seconds": 0.0, "least_steps": least}
    if stage == "qa":
        per_epoch = math.ceil(work.qa_train / sized.qa.batch_size)
        scoring = min(work.qa_held_out, sized.qa.dev_limit or work.qa_held_out) * c.qa_question * pace.other
        after_steps = scoring + HELD_OUT_RETRIEVERS * work.qa_held_out * c.recall_question * pace.other
        deadline |= {"at": now + allotted - after_steps, "epoch_steps": per_epoch, "scoring_seconds": scoring}
        deadline["step_seconds"] = c.qa_step * pace.of(stage)
    elif stage == "realm":
        cfg = sized.pretrain
        deadline["step_seconds"] = retrieval_step_seconds(cfg, c) * pace.of(stage)
        flat = cfg.null_warmup_steps if cfg.num_candidates > 1 else 0
        deadline["reserved_steps"] = cfg.steps - flat if flat else 0
    else:
        deadline["step_seconds"] = (c.read_step if stage == "read" else c.ict_step) * pace.of(stage)
    return dataclasses.replace(timing, scale=scale, deadline=deadline)


def retrieval_step_seconds(cfg: PretrainConfig, costs: StageCosts) -> float:
    """The estimate of a REALM step after the reader warm-up (the steps whose rate decays)."""
    if cfg.num_candidates <= 1:
        return costs.null_pretrain_step
    if cfg.doc_tower == "fixed":
        return costs.query_tower_pretrain_step
    return costs.pretrain_step if cfg.refresh_every else costs.frozen_pretrain_step


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

    return _largest_fitting(lambda scale: minutes(scale) <= budget_minutes, 0.0, 2 * left / training)  # over budget


def _largest_fitting(fits: Callable[[float], bool], low: float, high: float) -> float:
    """Bisection: the largest scale in [low, high] that `fits` (low fits, high does not; cost grows with scale)."""
    for _ in range(40):
        middle = (low + high) / 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return low


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
