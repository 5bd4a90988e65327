"""A measurement that ends by the clock: items (dev questions, held-out sentences) are scored in a seeded order,
and each next batch is taken only where the pace measured so far fits it before the deadline. The estimate a
plan sized the sample with may be wrong for this question set or machine (NQ questions cost 1.17x the SQuAD ones
the costs were calibrated on); the clock is not."""

from __future__ import annotations

import time
from collections.abc import Callable


class TimeLimit:
    """Scoring that must end by `at` (time.time() seconds: absolute, so a resumed run keeps its deadline), with at
    least `least` items scored whatever the clock says (a run that fell behind overruns rather than report an
    interval too wide to read). The pace is measured from when the limit is made: make it as scoring begins."""

    def __init__(self, at: float, least: int = 0, clock: Callable[[], float] = time.time):
        self.at, self.least, self.clock = at, least, clock
        self.started = clock()
        self.last = (0, self.started)  # (items done, time) at the last reading

    def fits(self, done: int, more: int) -> int:
        """How many of the `more` next items to take, `done` scored: all while fewer than `least` are done, else as
        many as fit before `at` at the slower of the mean pace and the pace since the last reading (items that
        slow down as they go are caught before they overrun) (0: stop)."""
        if done < self.least or done == 0:
            return more
        now = self.clock()
        per_item = (now - self.started) / done
        if done > self.last[0]:
            per_item = max(per_item, (now - self.last[1]) / (done - self.last[0]))
        self.last = (done, now)
        if per_item <= 0:
            return more
        return max(0, min(more, int((self.at - now) / per_item)))

    def to_dict(self) -> dict:
        return {"at": self.at, "least": self.least}
