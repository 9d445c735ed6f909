"""How many steps a rank's trace holds, and where each step starts and stops in it.

A step is what the recorder cuts at each ``optimizer.step()`` (or ``opguard.step()``): ops
carry the number of steps taken before them, so a run of three steps numbers its ops 0, 1 and 2,
and a final ``loss.item()`` after the last step is numbered 3. :func:`count_steps` is the one
rule every front end counts by (``show``, ``record --json``, ``diff``, ``explain``, the TUI):
the steps taken, with the ops after the last of them said apart, never as one more step.

Steps only grow along a trace, so the boundaries are found by bisection over op indices: a run
of a million ops with a few hundred steps is indexed by reading a few thousand records, not all
of them, which is what lets the debugger open a large trace at once.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from ...store import RankTrace


@dataclass(frozen=True, slots=True)
class StepCount:
    """The steps a rank's trace holds, and the ops it recorded after the last of them (a final
    ``loss.item()``, an evaluation, or the step a killed or failed run was in)."""

    steps: int = 0
    ops_after: int = 0

    def describe(self) -> str:
        """``3 steps``, ``3 steps + 1 op after the last step``: how every report says it."""
        text = _plural(self.steps, "step")
        if not self.ops_after:
            return text
        where = "after the last step" if self.steps else "before any step ended"
        return f"{text} + {_plural(self.ops_after, 'op')} {where}"


def describe_runs(a: StepCount, b: StepCount) -> str:
    """Both runs' counts in one phrase: ``both runs: 3 steps``, or each run's when they differ."""
    if a == b:
        return f"both runs: {a.describe()}"
    return f"run A: {a.describe()}; run B: {b.describe()}"


def op_level_limits(meta: Mapping[str, Any]) -> str:
    """Which steps a run that recorded ops kept them of, as recorded (``--window 5:7``,
    ``--keep-last 20``), or '' when it kept them all."""
    window, keep_last = meta.get("window"), meta.get("keep_last")
    limits = []
    if isinstance(window, list) and len(window) == 2:
        limits.append(f"--window {window[0]}:{window[1]}")
    if isinstance(keep_last, int) and not isinstance(keep_last, bool):
        limits.append(f"--keep-last {keep_last}")
    return ", ".join(limits)


def _step_numbers(steps: Sequence[int]) -> str:
    """``5``, ``5 to 7`` (consecutive), else ``5, 7, 9``."""
    if len(steps) == 1:
        return str(steps[0])
    if list(steps) == list(range(steps[0], steps[-1] + 1)):
        return f"{steps[0]} to {steps[-1]}"
    return ", ".join(map(str, steps))


def ops_held(trace_a: RankTrace, trace_b: RankTrace) -> str:
    """The steps each run holds ops of, and why when it kept some only: ``run A: steps 0 to
    99; run B: steps 5 to 6 (--window 5:7)``."""
    held = []
    for name, trace in (("A", trace_a), ("B", trace_b)):
        first, last = trace.first_op(), trace.last_op()
        span = f"steps {first[1]} to {last[1]}" if first and last else "no ops"
        limits = op_level_limits(trace.meta)
        held.append(f"run {name}: {span}" + (f" ({limits})" if limits else ""))
    return "; ".join(held)


def compared_steps_note(compared: Sequence[Any], trace_a: RankTrace, trace_b: RankTrace) -> str:
    """What a diff of runs that kept ops of some steps only compared: ``op level: compared
    steps 5 to 6, the steps both runs hold ops for (run A: …; run B: …)``. ``compared``: the
    compared steps' summaries (their ``step``)."""
    steps = [summary.step for summary in compared]
    what = f"compared step(s) {_step_numbers(steps)}" if steps else "compared no step"
    return f"op level: {what}, the steps both runs hold ops for ({ops_held(trace_a, trace_b)})"


def _plural(n: int, noun: str) -> str:
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def add_to_ranges(ranges: list[list[int]], step: int) -> None:
    """Adds ``step`` (at least the last one added) to ``ranges``, ``[first, last]`` pairs."""
    if ranges and ranges[-1][1] >= step - 1:
        ranges[-1][1] = step
    else:
        ranges.append([step, step])


def range_text(first: int, last: int) -> str:
    """``step 4`` or ``steps 0-3``."""
    return f"step {first}" if first == last else f"steps {first}-{last}"


def count_steps(trace: RankTrace, ops_per_step: Mapping[int, int] | None = None) -> StepCount:
    """The steps ``trace`` holds. ``ops_per_step``: its ops counted by step number, when the
    caller has read them all anyway (``opguard show``, the TUI's step index); without it, the
    last op and a bisection find what is needed in a few reads (the diff)."""
    recorded = _steps_recorded(trace)
    if ops_per_step is not None:
        if not ops_per_step:
            return StepCount(recorded)
        steps = max(_steps_held(trace, max(ops_per_step)), recorded)
        return StepCount(steps, sum(n for step, n in ops_per_step.items() if step >= steps))
    last = trace.last_op()
    first = trace.first_op()
    if last is None or first is None:
        return StepCount(recorded)
    last_index, last_step = last
    steps = max(_steps_held(trace, last_step), recorded)
    end = last_index + 1
    return StepCount(steps, end - _first_at_step(trace, steps, first[0], end))


def _steps_recorded(trace: RankTrace) -> int:
    """The steps a trace's step-level records say were taken: a record is written as a step
    ends, so the last one's number + 1 (0 without any). Op records may stop earlier (a
    window, ``--steps-only``)."""
    numbers = trace.step_numbers()
    return numbers[-1] + 1 if numbers else 0


def _steps_held(trace: RankTrace, last_step: int) -> int:
    """How many steps ended in ``trace``, whose last op is numbered ``last_step``.

    A trace recorded to its end has the recorder's own count, which only it knows when the
    last step was followed by no op. That count goes on after a step limit stopped recording
    (``opguard.record(steps=N)`` in a longer loop), so it is capped by the steps the trace
    reaches. A trace whose recording ended early (killed, the script or the recorder failed)
    holds the steps that ended before its last op: the ops of that op's step are the ones
    after the last step."""
    end = trace.info.get("end")
    counted = end.get("steps") if isinstance(end, dict) else None
    if isinstance(counted, int) and not isinstance(counted, bool) and not trace.partial:
        return max(0, min(counted, last_step + 1))
    return max(0, last_step)


def _first_at_step(trace: RankTrace, step: int, start: int, end: int) -> int:
    """The first op index in ``[start, end)`` (the trace's ops) whose step is ``step`` or later
    (``end`` if none)."""
    if step <= 0:
        return start
    lo, hi = start - 1, end  # step_at(lo) < step <= step_at(hi), ends virtual
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if _step_at(trace, mid) >= step:
            hi = mid
        else:
            lo = mid
    return hi


def _step_at(trace: RankTrace, index: int) -> float:
    """The step of op ``index``; infinity when the trace holds no such op (past its end)."""
    raw = next(trace.raw_ops(index, index + 1), None)
    return math.inf if raw is None else raw.get("s", 0)


@dataclass(frozen=True, slots=True)
class StepRange:
    step: int
    start: int  # first op index
    stop: int  # one past the last op index


class StepIndex:
    """The steps of one trace, in order, with the op index range of each."""

    def __init__(self, trace: RankTrace) -> None:
        self._trace = trace
        self.ranges = self._build()
        self._starts = [r.start for r in self.ranges]
        self._by_step = {r.step: r for r in self.ranges}

    def _step_at(self, index: int) -> float:
        return _step_at(self._trace, index)

    def _build(self) -> list[StepRange]:
        """The steps' ranges over the trace's ops, which run without gaps from its first op
        (op 0, unless the first steps' ops were dropped) to its last."""
        first, last = self._trace.first_op(), self._trace.last_op()
        if first is None or last is None:
            return []
        ranges: list[StepRange] = []
        start, end = first[0], last[0] + 1
        step: float = first[1]
        while step != math.inf:
            guess = start + (ranges[-1].stop - ranges[-1].start if ranges else 1)
            stop = self._first_after(start, end, step, guess)
            ranges.append(StepRange(int(step), start, stop))
            start, step = stop, self._step_at(stop) if stop < end else math.inf
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

    def count(self) -> StepCount:
        """The steps the trace holds (:func:`count_steps`), from the ranges already found."""
        return count_steps(self._trace, {r.step: r.stop - r.start for r in self.ranges})

    def of(self, index: int) -> StepRange | None:
        """The step holding op ``index``, if the trace has that op."""
        at = bisect.bisect_right(self._starts, index) - 1
        if at < 0 or index >= self.ranges[at].stop:
            return None
        return self.ranges[at]
