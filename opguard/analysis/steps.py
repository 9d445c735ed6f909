"""Where each step starts and stops in one rank's trace.

Steps only grow along a trace, so the boundaries are found by bisection over op indices: a run
of a million ops with a few hundred steps is indexed by reading a few thousand records, not all
of them, which is what lets the debugger open a large trace at once.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass

from ..store import RankTrace


@dataclass(frozen=True, slots=True)
class StepRange:
    step: int
    start: int  # first op index
    stop: int  # one past the last op index


class StepIndex:
    """The steps of one trace, in order, with the op index range of each."""

    def __init__(self, trace: RankTrace) -> None:
        self._trace = trace
        self.ranges = self._build(len(trace))
        self._starts = [r.start for r in self.ranges]
        self._by_step = {r.step: r for r in self.ranges}

    def _step_at(self, index: int) -> float:
        raw = next(self._trace.raw_ops(index, index + 1), None)
        return math.inf if raw is None else raw.get("s", 0)

    def _build(self, count: int) -> list[StepRange]:
        ranges: list[StepRange] = []
        start = 0
        step = self._step_at(0) if count else math.inf
        while step != math.inf:
            guess = start + (ranges[-1].stop - ranges[-1].start if ranges else 1)
            stop = self._first_after(start, count, step, guess)
            ranges.append(StepRange(int(step), start, stop))
            start, step = stop, self._step_at(stop) if stop < count else math.inf
        return ranges

    def _first_after(self, lo: int, hi: int, step: float, guess: int) -> int:
        """The first index in (lo, hi] whose step is past ``step`` (``hi``: the end). Steps
        are usually alike in length, so the previous step's length is tried first: two reads
        instead of a bisection."""
        if lo < guess < hi:
            if self._step_at(guess) > step:
                hi = guess
                if self._step_at(guess - 1) <= step:
                    return guess
            else:
                lo = guess
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if self._step_at(mid) > step:
                hi = mid
            else:
                lo = mid
        return hi

    def get(self, step: int) -> StepRange | None:
        return self._by_step.get(step)

    def of(self, index: int) -> StepRange | None:
        """The step holding op ``index``, if the trace has that op."""
        at = bisect.bisect_right(self._starts, index) - 1
        if at < 0 or index >= self.ranges[at].stop:
            return None
        return self.ranges[at]
