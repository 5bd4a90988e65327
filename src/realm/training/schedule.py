"""Learning-rate schedules, and how a trainer's steps end by a deadline: the flat phase ends by time, the decaying
phase is sized from the time left and re-sized once from its own timed steps; steps.json records what it trained."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch

from realm.common.deadline import Deadline
from realm.common.io import write_json_atomic


@dataclass
class LinearSchedule:
    """Linear warm-up over `warmup` steps, then (not before `decay_from`) linear decay to 0 at `total`. Groups whose
    prefix is in `starts` keep a zero rate until that step, then warm up (e.g. towers frozen while a fresh head
    learns). `flat_until`: where a flat phase ends (REALM's reader warm-up; 0: none). Mutable: a deadline settles
    `flat_until`, `total` and `decay_from` as the run goes (`TimedSchedule`); every checkpoint holds it, so a
    resumed run keeps the schedule its first part ran on. `sizings`: how often a deadline has sized the decaying
    phase (at its start, then once from its timed steps)."""

    warmup: int
    total: int
    decay_from: int = 0
    starts: dict[str, int] = field(default_factory=dict)
    flat_until: int = 0
    sizings: int = 0

    def factor(self, prefix: str, step: int) -> float:
        start = self.starts.get(prefix, 0)
        if step < start + self.warmup:
            return max(0.0, (step - start + 1) / max(1, self.warmup)) if step >= start else 0.0
        decay_start = max(start + self.warmup, self.decay_from)
        return min(1.0, max(0.0, (self.total - step) / max(1, self.total - decay_start)))


class ScheduledLR(torch.optim.lr_scheduler.LambdaLR):
    """LambdaLR over a `LinearSchedule` read live (each param group by its prefix), saved with the scheduler."""

    def __init__(self, optimizer: torch.optim.Optimizer, schedule: LinearSchedule):
        self.schedule = schedule
        lambdas: list[Callable[[int], float]] = [
            functools.partial(schedule.factor, group.get("prefix", "")) for group in optimizer.param_groups
        ]
        super().__init__(optimizer, lambdas)

    def state_dict(self) -> dict:
        state = super().state_dict()
        state["schedule"] = dataclasses.asdict(self.schedule)
        return state

    def load_state_dict(self, state_dict: dict) -> None:
        state = dict(state_dict)
        saved = state.pop("schedule", None)  # None: a checkpoint from before schedules were saved
        super().load_state_dict(state)
        if saved is not None and saved["sizings"]:  # a deadline settled it; else this run's config holds (a branch)
            for name, value in saved.items():  # in place: the group lambdas read this object
                setattr(self.schedule, name, value)


def linear_schedule(
    optimizer: torch.optim.Optimizer,
    warmup: int,
    total: int,
    start_at: dict[str, int] | None = None,
    decay_from: int = 0,
    flat_until: int = 0,
) -> ScheduledLR:
    """A `LinearSchedule` over the optimizer's groups (by the prefix each records: `bert_optimizer`)."""
    schedule = LinearSchedule(warmup, total, decay_from, dict(start_at or {}), flat_until)
    return ScheduledLR(optimizer, schedule)


# -- deadlines ------------------------------------------------------------------------------------
TIMED_STEPS = 24  # a decaying phase is re-sized once, after at most this many of its steps were timed


@dataclass(frozen=True)
class TimedSteps:
    """A trainer's steps that end by `deadline` (the run's one clock: common/deadline.py), and what sizes the phase
    whose rate decays: the estimate of one of its steps (`step_seconds`) and the fewest it may have. A flat phase
    before it (REALM's reader warm-up) ends when only `reserved_steps` of the decaying phase's steps fit before the
    deadline, or at its planned length. QA scores its held-out questions at each epoch's end (`epoch_steps`,
    `scoring_seconds` each): the scorings before the last step take time from the steps (the last one is the
    caller's to leave time for)."""

    deadline: Deadline
    step_seconds: float
    least_steps: int = 2
    reserved_steps: int = 0
    epoch_steps: int = 0
    scoring_seconds: float = 0.0
    timed_steps: int = TIMED_STEPS

    def to_dict(self) -> dict:
        """Its JSON form (steps.json, plan.json): the deadline's `at` beside the estimates."""
        sizing = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name != "deadline"}
        return {"at": self.deadline.at, **sizing}

    @classmethod
    def from_dict(cls, data: dict, clock: Callable[[], float] = time.time) -> TimedSteps:
        sizing = {k: v for k, v in data.items() if k != "at"}
        return cls(Deadline(data["at"], clock), **sizing)


class TimedSchedule:
    """Settles a trainer's `LinearSchedule` by `TimedSteps` (None: the fixed steps it was given), step by step.

    A flat phase ends by time; the decaying phase is sized in steps from the time left as it begins (at the
    estimated step) and re-sized once from its own first timed steps, after which nothing changes: its rate stays
    flat while it is timed and decays linearly from there to 0 at its last step, so the schedule is one a run
    with fixed steps can replay (the trainer's steps.json). What recurs between steps (checkpoints, QA's scorings) is timed apart
    (`between`) and counted where it falls; the re-sizing waits until each of `recurs` (name -> every so many steps:
    the trainer's checkpoints) has been timed once, so that no pause it cannot see takes the time of the steps it
    sizes. `warmup_of`: the rate warm-up of a length (QA: ORQA's rule), set when the phase is first sized;
    `on_flat_end(step)`: what starts when the flat phase ends (REALM's towers)."""

    def __init__(
        self,
        timed: TimedSteps | None,
        schedule: LinearSchedule,
        warmup_of: Callable[[int], int] | None = None,
        on_flat_end: Callable[[int], None] | None = None,
        recurs: dict[str, int] | None = None,
    ):
        self.timed, self.schedule = timed, schedule
        self.warmup_of, self.on_flat_end = warmup_of, on_flat_end
        self.recurs = {name: every for name, every in (recurs or {}).items() if every > 0}
        self.timed_from: tuple[int, float] | None = None  # (step, time) this process began timing the phase
        self.last: tuple[int, float] | None = None  # (step, time) of the last call
        self.excluded = 0.0  # seconds between steps since then (checkpoints, scorings)
        # what recurs between steps: name -> (every so many steps, seconds it took last)
        self.recurring: dict[str, tuple[int, float]] = {}
        if timed is not None and timed.epoch_steps:
            self.recurring["scoring"] = (timed.epoch_steps, timed.scoring_seconds)

    def between(self, name: str, every: int, seconds: float) -> None:
        """`seconds` spent after a step on what recurs every `every` steps (a checkpoint, a scoring)."""
        self.excluded += seconds
        self.recurring[name] = (every, seconds)

    @contextlib.contextmanager
    def timing(self, name: str, every: int) -> Iterator[None]:
        """Times what recurs every `every` steps, on the deadline's clock (`between`)."""
        clock = self.timed.deadline.clock if self.timed is not None else time.time
        began = clock()
        yield
        self.between(name, every, clock() - began)

    def before_step(self, step: int) -> None:
        """Called before each step (`step`: the steps done); may end the flat phase and size the decaying one."""
        d, s = self.timed, self.schedule
        if d is None or s.sizings >= 2:
            return
        now = d.deadline.now()
        last, self.last = self.last, (step, now)
        if step < s.flat_until:  # ends before the step that would take from the decaying phase's share
            next_step = now - last[1] if last is not None and last[0] == step - 1 else 0.0
            if now + next_step + d.reserved_steps * d.step_seconds <= d.deadline.at:
                return
            self._end_flat(step)
        if s.sizings == 0:  # the decaying phase begins: as many of its steps as the time left holds, estimated
            s.total = step + self._fitting(step, now, d.step_seconds)
            if self.warmup_of is not None:
                s.warmup = self.warmup_of(s.total)
            s.sizings = 1
        if self.timed_from is None:
            self.timed_from, self.excluded = (step, now), 0.0
            timed = step + self._timed_steps(s.total - step)
            for name, every in self.recurs.items():  # not yet timed: timed before the re-sizing counts it
                if name not in self.recurring:
                    timed = max(timed, (step // every + 1) * every)
            s.decay_from = max(s.decay_from, min(s.total, timed))
            return
        began, at = self.timed_from
        if step >= s.decay_from:  # timed: re-sized once from what its steps took
            measured = (now - at - self.excluded) / max(1, step - began)
            s.total = step + self._fitting(step, now, max(measured, 1e-6))
            s.decay_from, s.sizings = step, 2

    def _timed_steps(self, planned: int) -> int:
        assert self.timed is not None
        return min(self.timed.timed_steps, max(2, planned // 4))

    def _end_flat(self, step: int) -> None:
        s = self.schedule
        s.total += step - s.flat_until  # the decaying phase keeps its length until it is sized
        s.flat_until = s.decay_from = step
        if self.on_flat_end is not None:
            self.on_flat_end(step)

    def _fitting(self, step: int, now: float, step_seconds: float) -> int:
        """Steps from `step` on that end by the deadline at `step_seconds` each, with what recurs between them
        (not after the last: the caller leaves time for that); at least what leaves the phase its fewest steps."""
        d, s = self.timed, self.schedule
        assert d is not None
        least = max(1, d.least_steps - (step - s.flat_until))
        steps = max(0, int((d.deadline.at - now) / step_seconds))
        for _ in range(4):  # what recurs depends on the steps it leaves
            pauses = sum(((step + steps - 1) // every - step // every) * sec for every, sec in self.recurring.values())
            steps = max(0, int((d.deadline.at - now - max(0.0, pauses)) / step_seconds))
        return max(least, steps)


# -- what a trainer trained ----------------------------------------------------------------------
STEPS_RECORD = "steps.json"


def record_steps(out_dir: Path, planned: dict[str, int], trained: dict[str, int], timed: TimedSteps | None) -> None:
    """out_dir/steps.json: the step counts a trainer was given and those it trained (each a field of its config:
    given as fixed steps, they replay the run's schedule), the deadline it trained to and when it ended."""
    record = {
        "planned": planned,
        "trained": trained,
        "deadline": timed.to_dict() if timed is not None else None,
        "ended": time.time(),
    }
    write_json_atomic(Path(out_dir) / STEPS_RECORD, record)


def read_steps(out_dir: Path) -> dict | None:
    """A trainer's steps.json (None: it has none: it never finished, or it predates the record)."""
    path = Path(out_dir) / STEPS_RECORD
    return json.loads(path.read_text()) if path.is_file() else None
