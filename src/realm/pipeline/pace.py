"""The run's pace and each stage's deadline: as a stage after the plan begins, what is left of the run's deadline
less the stages after it (at the pace the finished stages ran, each kind of training step at its own) is its
allotment (`time_stage`): a training stage's steps end by it (training/schedule.py: TimedSteps), an evaluation
scores until it (common/deadline.py: TimeLimit).
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from realm.common.deadline import Deadline
from realm.common.io import write_json_atomic
from realm.config import Preset, StageCosts
from realm.pipeline.estimate import (
    HELD_OUT_RETRIEVERS,
    MIN_SCORED_SENTENCES,
    MIN_TRAINING_STEPS,
    SCORED_SENTENCES,
    StageEstimate,
    Workload,
    largest_fitting,
    qa_min_steps,
    retrieval_step_seconds,
    scale_preset,
    trained_preset,
)
from realm.pipeline.plan import PipelinePlan
from realm.pipeline.records import EvalRecord
from realm.pipeline.stage_table import ARMS_EVAL, arms, estimate, kind_of
from realm.pipeline.stages import stepping_seconds
from realm.pipeline.work import EXAMPLE_POOL
from realm.training.schedule import TimedSteps, read_steps

PACE_BOUND = 1.5  # the run's pace corrects an estimate by at most this factor either way
# non-step seconds worth this share of the budget count at the calibration's pace before any are timed: at 55 min
# under --ablations ~40 estimated seconds of loading and scoring set the pace of the arms' ~1,000 at 1.50x (it read
# 0.96x once the evaluation had run), and the evaluation was cut to its least
OTHER_PRIOR_SHARE = 0.05


@dataclass(frozen=True)
class Pace:
    """How the finished stages since the plan ran against their estimates: each kind of training step by its own
    stages (REALM's pace says nothing about a QA step), and the rest (starts, embedding, tagging, scoring)
    together; each within PACE_BOUND. 1.0: nothing of that kind has run yet."""

    steps: dict[str, float] = dataclasses.field(default_factory=dict)
    other: float = 1.0

    def of(self, stage: str) -> float:
        kind = kind_of(stage)
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


def run_pace(
    finished: dict[str, StageEstimate], took: dict[str, float], stepping: dict[str, float], prior: float = 0.0
) -> Pace:
    """The pace of the `finished` stages (each estimated at the steps it trained). `took`: their seconds;
    `stepping`: the seconds a finished training stage spent in its steps (from its metrics); `prior`: seconds of
    non-step work counted at 1.0x beside those timed (OTHER_PRIOR_SHARE)."""
    estimated: dict[str, float] = {}
    observed: dict[str, float] = {}
    estimated_other = observed_other = 0.0
    for name, e in finished.items():
        kind = kind_of(name)
        if kind and name in stepping and e.steps:
            estimated[kind] = estimated.get(kind, 0.0) + e.steps * e.step_seconds
            observed[kind] = observed.get(kind, 0.0) + stepping[name]
            estimated_other += e.fixed_seconds
            observed_other += max(0.0, took[name] - stepping[name])
        else:
            estimated_other += e.seconds
            observed_other += took[name]
    steps = {kind: _bounded(observed[kind], estimated[kind]) for kind in estimated}
    return Pace(steps, _bounded(observed_other + prior, estimated_other + prior))


@dataclass(frozen=True)
class StageTiming:
    """A stage after the plan, sized as it begins: what is left of the run's deadline, less the stages after it at
    the run's pace, is its allotment (`deadline`). A training stage gets the steps (`scale`) that fit it and
    `timed`, the deadline its steps end by and what sizes them (training/schedule.py: TimedSteps); an evaluation the
    sample estimated to fit it (`sample`: the evaluation itself scores until its deadline)."""

    stage: str
    began: float  # time.time()
    allotted: float  # seconds: its deadline less `began`
    pace: Pace
    scale: float | None = None  # training: the steps of the preset's recipe it was sized at
    timed: TimedSteps | None = None  # training
    sample: int | None = None  # the estimate of what fits: eval: dev questions answered; examples: sentences scored

    @property
    def deadline(self) -> Deadline:
        return Deadline(self.began + self.allotted)

    def to_dict(self) -> dict:
        """Its JSON form in plan.json (a trainer's `timed` under "deadline")."""
        kept = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in ("pace", "timed")}
        timed = self.timed.to_dict() if self.timed is not None else None
        return kept | {"pace": dataclasses.asdict(self.pace), "deadline": timed}

    @classmethod
    def from_dict(cls, data: dict) -> StageTiming:
        kept = {k: v for k, v in data.items() if k not in ("pace", "deadline")}
        timed = TimedSteps.from_dict(data["deadline"]) if data.get("deadline") else None
        return cls(**kept, pace=Pace(**data["pace"]), timed=timed)

    def describe(self) -> str:
        ends = time.strftime("%H:%M:%S", time.localtime(self.deadline.at))
        what = f"{self.allotted / 60:.1f} min allotted (to {ends})"
        if self.timed is not None:
            steps_end = time.strftime("%H:%M:%S", time.localtime(self.timed.deadline.at))
            what += f", steps x{self.scale:.3f} of the recipe's to begin with, ending by {steps_end}"
        if self.sample is not None:
            what += f", about {self.sample:,} at the estimated pace (scored until it ends)"
        return f"{what}; {self.pace.describe()}"


def _as_it_will_run(name: str, at_plan: dict[str, StageEstimate], ran: dict[str, StageEstimate]) -> StageEstimate:
    """A stage's estimate as it will run: an ablation arm replaying a main trainer that has trained (run.py: trained)
    at the steps that trainer took, any other at the plan's."""
    kind, planned = kind_of(name), at_plan[name]
    if kind is None or kind == name or kind not in ran or not at_plan[kind].steps:
        return planned
    return dataclasses.replace(planned, steps=round(planned.steps * ran[kind].steps / at_plan[kind].steps))


def _evaluation(timing: StageTiming, work: Workload, c: StageCosts, zero_shot: float, answering: int) -> StageTiming:
    """The evaluation's sample, sized with the exact match of the `answering` arms (ARMS_EVAL, the run's last
    stage), which answer the questions it answers: what is left for exact match is shared at one sample, and the
    evaluation's share is its allotment. At least MIN_EVAL_QUESTIONS whatever the clock. (The 120-minute
    --ablations run at 6e8ce53 began its evaluation 5.9 min behind and, held to the plan's 1,496 questions with
    four arms answering them after it, would have ended near 1.08 of its budget; now the arms, last, answer fewer
    of them where the run has fallen further behind.)"""
    per_arm = answering * c.qa_question * timing.pace.other
    shared = timing.allotted + work.evaluated * per_arm  # left out: the arms' exact match at the plan's sample
    fits = (shared / timing.pace.other - zero_shot) / (c.qa_systems_question + answering * c.qa_question)
    sample = int(min(work.qa_dev, max(work.least_evaluated, fits)))
    return dataclasses.replace(timing, allotted=shared - sample * per_arm, sample=sample)


def time_stage(
    plan: PipelinePlan,
    costed: Preset,
    stage: str,
    took: dict[str, float],
    ran: dict[str, StageEstimate],
    stepping: dict[str, float],
    now: float,
    work: Workload | None = None,
) -> StageTiming:
    """The timing of `stage`, about to begin at `now`: its allotment is the run's deadline less `now` and the
    estimates of the stages after it at the run's pace (each kind of step at its own; the report and process end
    too). `costed`: the preset unscaled, with the plan's costs; `took`: the seconds of every finished stage;
    `ran`: each finished training stage estimated at the steps it trained; `stepping`: the seconds each finished
    training stage spent in steps; `work`: the plan's, with the dev questions the evaluation answered once it has.
    A stage already late gets its least (QA: `qa_min_steps`, the measurements their least samples): a run that fell behind overruns rather than hand back a reader that cannot read. A main trainer
    shares what is left with the arms that replay its steps (`replays`), the run's delay spread over all of them."""
    assert plan.deadline is not None
    work, c = work or plan.work, costed.costs

    def stages_at(scale: float) -> dict[str, StageEstimate]:
        return {s.name: s for s in estimate(scale_preset(costed, scale, work.qa_train), work)}

    at_plan = stages_at(plan.scale)
    finished = {name: ran.get(name, e) for name, e in at_plan.items() if name in took}
    pace = run_pace(finished, took, stepping, OTHER_PRIOR_SHARE * 60 * (plan.budget_minutes or 0.0))
    names = list(at_plan)
    if stage not in at_plan:  # a stage the table (stage_table.py) does not plan has no share of the budget
        raise ValueError(f"{stage!r} is not a stage of this run's plan ({', '.join(names)})")
    after = [name for name in names[names.index(stage) + 1 :] if name not in took]
    replays = [name for name in after if stage == kind_of(stage) and kind_of(name) == stage]  # run.py: trained
    expected = [_as_it_will_run(name, at_plan, ran) for name in after if name not in replays]
    rest = sum(pace.seconds(e) for e in expected) + c.fixed_seconds * pace.other
    deadline = plan.deadline.earlier(rest)  # for this stage and its replays
    allotted = deadline.at - now
    timing = StageTiming(stage, now, allotted, pace)
    if stage == "eval":
        zero_shot = at_plan["eval"].fixed_seconds - work.evaluated * c.qa_systems_question
        return _evaluation(timing, work, c, zero_shot, len(arms(costed.pretrain)) if ARMS_EVAL in after else 0)
    if stage == "examples":
        held = work.held_out_sentences if work.held_out_sentences is not None else SCORED_SENTENCES
        fits = allotted / pace.other / c.scored_sentence - min(EXAMPLE_POOL, held)
        return dataclasses.replace(timing, sample=int(min(SCORED_SENTENCES, max(MIN_SCORED_SENTENCES, fits))))
    if kind_of(stage) is None:
        return timing

    def seconds(scale: float, names: list[str]) -> float:
        return sum(pace.seconds(e) for name, e in stages_at(scale).items() if name in names)

    scale = largest_fitting(lambda scale: seconds(scale, [stage, *replays]) <= allotted, 0.0, 1e3)
    qa_steps = costed.qa.total_steps(work.qa_train) if work.qa_train else 0
    least = MIN_TRAINING_STEPS
    if stage == "qa" and qa_steps >= qa_min_steps(costed.qa):
        least = qa_min_steps(costed.qa)
        scale = max(scale, least / qa_steps)
    if replays:  # the arms' share, at the steps this stage trains, comes after it
        deadline = deadline.earlier(seconds(scale, replays))
        timing = dataclasses.replace(timing, allotted=deadline.at - now)
    sized = scale_preset(costed, scale, work.qa_train)
    sizing: dict = {"least_steps": least}
    if stage == "qa":  # its steps end before the held-out scoring and recall that follow the last of them
        per_epoch = math.ceil(work.qa_train / sized.qa.batch_size)
        scoring = min(work.qa_held_out, sized.qa.dev_limit or work.qa_held_out) * c.qa_question * pace.other
        after_steps = scoring + HELD_OUT_RETRIEVERS * work.qa_held_out * c.recall_question * pace.other
        deadline = deadline.earlier(after_steps)
        sizing |= {"step_seconds": c.qa_step * pace.of(stage), "epoch_steps": per_epoch, "scoring_seconds": scoring}
    elif stage == "realm":
        cfg = sized.pretrain
        flat = cfg.null_warmup_steps if cfg.num_candidates > 1 else 0
        sizing |= {"step_seconds": retrieval_step_seconds(cfg, c) * pace.of(stage)}
        sizing["reserved_steps"] = cfg.steps - flat if flat else 0
    else:
        sizing["step_seconds"] = (c.read_step if stage == "read" else c.ict_step) * pace.of(stage)
    return dataclasses.replace(timing, scale=scale, timed=TimedSteps(deadline, **sizing))


class RunClock:
    """The run's one clock after its plan: a stage about to begin is given its deadline and, for a trainer, the
    steps that fit it (`time_stage`, at the pace of the stages that finished), kept in plan.json so that a resumed
    stage keeps both. `records`: the finished stages' records (pipeline/stages.py)."""

    def __init__(
        self, plan: PipelinePlan, base_preset: Preset, run_dir: Path, records: dict, echo: Callable[[str], None]
    ):
        self.plan, self.base_preset, self.run_dir, self.records, self.echo = plan, base_preset, run_dir, records, echo

    @property
    def costed(self) -> Preset:
        """The preset unscaled, with the costs the plan was sized with."""
        return dataclasses.replace(self.base_preset, costs=self.plan.preset.costs)

    @property
    def work(self) -> Workload:
        """The plan's workload, with the dev questions the evaluation answered once it has (the arms answer those)."""
        record = self.records.get("eval")
        answered = EvalRecord.from_dict(record.result).questions if record is not None else None
        if answered is None:
            return self.plan.work
        return dataclasses.replace(self.plan.work, eval_questions=answered.evaluated)

    def timing(self, stage: str) -> StageTiming | None:
        """`stage`'s timing, made as it begins (or read back for a resumed stage); None without a budget."""
        if self.plan.budget_minutes is None:
            return None
        path = self.run_dir / "plan.json"
        stored = json.loads(path.read_text())
        if stage in stored.setdefault("stage_timings", {}):
            return StageTiming.from_dict(stored["stage_timings"][stage])
        took = {name: r.seconds for name, r in self.records.items()}
        trained = {s.name for s in self.plan.stages if s.steps} & took.keys()
        stepping = {name: seconds for name in trained if (seconds := stepping_seconds(self.run_dir / name))}
        timings = stored["stage_timings"]
        work = self.work
        ran = {n: e for n in trained if (e := self._trained_estimate(n, timings.get(n), work)) is not None}
        timing = time_stage(self.plan, self.costed, stage, took, ran, stepping, time.time(), work)
        stored["stage_timings"][stage] = timing.to_dict()
        write_json_atomic(path, stored)
        late = " (the run is behind: its least)" if timing.allotted <= 0 else ""
        self.echo(f"[pipeline] {stage}: {timing.describe()}{late}")
        return timing

    def sized(self, stage: str) -> tuple[Preset, TimedSteps | None]:
        """The preset a training stage begins with, and the deadline its steps end by with what sizes them (None:
        fixed steps)."""
        timing = self.timing(stage)
        if timing is None or timing.scale is None or timing.timed is None:
            return self.plan.preset, None
        return scale_preset(self.costed, timing.scale, self.plan.work.qa_train), timing.timed

    def _trained_estimate(self, stage: str, timing: dict | None, work: Workload) -> StageEstimate | None:
        """A finished training stage's estimate at the steps it trained (its steps.json), for the run's pace
        (`timing`: the stage's, from plan.json; `work`: the run's, `RunClock.work`)."""
        steps = read_steps(self.run_dir / stage)
        if steps is None or timing is None or timing.get("scale") is None:
            return None
        sized = scale_preset(self.costed, timing["scale"], self.plan.work.qa_train)
        ran = trained_preset(sized, kind_of(stage), steps["trained"])
        return next((e for e in estimate(ran, work) if e.name == stage), None)
