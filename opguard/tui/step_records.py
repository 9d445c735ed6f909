"""The debugger's model of a rank recorded at step level only (``opguard record
--steps-only``): there are no ops to list, so the steps are the list, and a step's detail is
its state entries compared (:func:`~opguard.analysis.state_diff.compare_step`), read when the
step is selected. Tested without a UI.
"""

from __future__ import annotations

from ..analysis import RankDiff
from ..analysis.state_diff import StepComparison, compare_step
from ..store import RankTrace

# What the list says of a step (the diff compares steps in order and stops at the first that
# differs: later steps are compared when selected).
EQUAL, FIRST, NOT_COMPARED, ONLY_A, ONLY_B = "equal", "FIRST", "", "only A", "only B"


class StepRecords:
    """The steps either run recorded at step level, and what the diff found about them."""

    def __init__(self, trace_a: RankTrace, trace_b: RankTrace) -> None:
        self.traces = (trace_a, trace_b)
        self._in = (set(trace_a.step_numbers()), set(trace_b.step_numbers()))
        self.steps: list[int] = sorted(self._in[0] | self._in[1])
        self.diff: RankDiff | None = None

    @property
    def first(self) -> int | None:
        """The first step whose state differs, once the diff has run."""
        first = self.diff.state_first if self.diff is not None else None
        return first.step if first is not None else None

    def set_diff(self, diff: RankDiff) -> None:
        self.diff = diff

    def only_in(self, step: int) -> str | None:
        """``A`` or ``B`` for a step recorded at step level in that run only, else None."""
        in_a, in_b = (step in recorded for recorded in self._in)
        return None if in_a == in_b else "A" if in_a else "B"

    def status(self, step: int) -> str:
        only = self.only_in(step)
        if only is not None:
            return ONLY_A if only == "A" else ONLY_B
        states = self.diff.states if self.diff is not None else None
        if states is None:
            return NOT_COMPARED
        first = self.first
        if first is None:
            return EQUAL if states.compared else NOT_COMPARED
        return EQUAL if step < first else FIRST if step == first else NOT_COMPARED

    def compare(self, step: int) -> StepComparison | None:
        """Step ``step`` of both runs entry by entry (None: a run did not record it);
        :class:`~opguard.store.TraceError` when a record is damaged."""
        states = [trace.step_state(step) for trace in self.traces]
        if states[0] is None or states[1] is None:
            return None
        return compare_step(states[0], states[1])
