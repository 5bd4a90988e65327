"""One clock for a budget: a `Deadline` says when a piece of work must end, and every timed part of a run takes one.

A trainer's steps end by theirs (training/schedule.py: `TimedSteps` sizes the steps to it); an evaluation scores
items in a seeded order until its `TimeLimit` fits no more. The budget in minutes becomes a `Deadline` once, when
the run is planned; each stage's is the run's less the stages after it (pipeline/pace.py: time_stage).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass


@dataclass(frozen=True)
class Deadline:
    """When work must end: `at` in time.time() seconds, absolute, so a run killed and resumed keeps the deadline of
    the run it continues; read on `clock` (tests give a fake one)."""

    at: float
    clock: Callable[[], float] = dataclasses.field(default=time.time, compare=False, repr=False)

    def now(self) -> float:
        return self.clock()

    def left(self) -> float:
        """Seconds until the deadline (negative: past it)."""
        return self.at - self.clock()

    def earlier(self, seconds: float) -> Deadline:
        """This deadline less `seconds` (what must still run after the work it bounds)."""
        return dataclasses.replace(self, at=self.at - seconds)

    def limit(self, least: int = 0) -> TimeLimit:
        """Scoring that ends by this deadline, with at least `least` items (its pace timed from now)."""
        return TimeLimit(self, least)


class TimeLimit:
    """A measurement that ends by the clock: items (dev questions, held-out sentences) are scored in a seeded order,
    and each next batch is taken only where the pace measured so far fits it before the deadline, with at least
    `least` items scored whatever the clock says (a run that fell behind overruns rather than report an interval too
    wide to read). The estimate a plan sized the sample with may be wrong for this question set or machine (NQ
    questions cost 1.17x the SQuAD ones the costs were calibrated on); the clock is not. The pace is measured from
    when the limit is made: make it as scoring begins."""

    def __init__(self, deadline: Deadline, least: int = 0):
        self.deadline, self.least = deadline, least
        self.started = deadline.now()
        self.last = (0, self.started)  # (items done, time) at the last reading

    def fits(self, done: int, more: int) -> int:
        """How many of the `more` next items to take, `done` scored: all while fewer than `least` are done, else as
        many as fit before the deadline at the slower of the mean pace and the pace since the last reading (items
        that slow down as they go are caught before they overrun) (0: stop)."""
        if done < self.least or done == 0:
            return more
        now = self.deadline.now()
        per_item = (now - self.started) / done
        if done > self.last[0]:
            per_item = max(per_item, (now - self.last[1]) / (done - self.last[0]))
        self.last = (done, now)
        if per_item <= 0:
            return more
        return max(0, min(more, int((self.deadline.at - now) / per_item)))

    def to_dict(self) -> dict:
        return {"at": self.deadline.at, "least": self.least}
