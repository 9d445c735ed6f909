"""The measured noise floor (``opguard diff --tolerant --noise CONTROL``): how far rounding moves
each op of this model, read from a control run.

The control is a run of run A's script whose rounding was perturbed (``opguard record
--perturb-rounding SEED``, another thread count, another reduction order): it makes the same
ops as run A, and each differs from A's by what rounding does in this model, amplified as this
model amplifies it (through its steps, its normalizations, its thresholds), which the analytic
bounds of :mod:`.families` can only estimate. The two runs are aligned as any two runs are
(:func:`~..align.passes.align_step`, step by step, as the walk reaches each step of run A), and
the distance of A's tensor from the control's at the aligned op is the floor for B's distance
from A there (times :data:`~.rule.NOISE_SAFETY`). An op the control does not align with has no
measured floor: the analytic bound alone judges it.

Memory: a step of light columns of each run at a time, and the recent steps' pairs.
"""

from __future__ import annotations

from collections.abc import Iterator

from ...store import OpRecord, RankTrace
from ...store.light import LightReader, OpColumns
from ..align.keys import KeyTable, OpKeys
from ..align.passes import align_step, records_of
from ..align.step_pairs import StepAlignments, step_columns
from .views import Distances


class NoiseFloor:
    """Run A's distances from a control run of its script, op by op (one rank)."""

    def __init__(self, trace_a: RankTrace, control: RankTrace) -> None:
        table = KeyTable()
        readers = (
            LightReader(trace_a, OpKeys(trace_a, table)),
            LightReader(control, OpKeys(control, table)),
        )
        self.control = control
        self._alignments = StepAlignments(*readers)
        self._fetch = records_of(trace_a, control)
        self._steps: tuple[Iterator[tuple[int, OpColumns]], ...] = tuple(
            step_columns(r, None) for r in readers
        )
        self._next = tuple(next(s, None) for s in self._steps)
        self._distances = Distances((trace_a, control))

    def partner(self, op_a: OpRecord) -> OpRecord | None:
        """The control's op aligned with run A's ``op_a``; None where there is none."""
        self._align_through(op_a.step)
        index = self._alignments.b_of(op_a.index)
        return self.control.op(index) if index is not None else None

    def output(self, op_a: OpRecord, slot: int) -> float | None:
        """The distance of ``op_a``'s output ``slot`` from the control's; None where unknown."""
        other = self.partner(op_a)
        if other is None or slot >= len(other.outputs) or slot >= len(op_a.outputs):
            return None
        found = self._distances.between(op_a.outputs[slot], other.outputs[slot])
        return found.estimate if found is not None else None

    def input(self, op_a: OpRecord, slot: str) -> float | None:
        """The distance of ``op_a``'s input ``slot`` from the control's; None where unknown."""
        other = self.partner(op_a)
        if other is None:
            return None
        mine = next((t for t in op_a.inputs if t.slot == slot), None)
        theirs = next((t for t in other.inputs if t.slot == slot), None)
        if mine is None or theirs is None:
            return None
        found = self._distances.between(mine, theirs)
        return found.estimate if found is not None else None

    def _align_through(self, step: int) -> None:
        """Aligns the steps of both runs up to ``step`` not aligned yet (steps only one run
        holds are passed over)."""
        while self._next[0] is not None and self._next[1] is not None:
            (sa, ops_a), (sc, ops_c) = self._next[0], self._next[1]
            if min(sa, sc) > step:
                return
            if sa != sc:
                lower = 0 if sa < sc else 1
                self._next = tuple(
                    next(self._steps[i], None) if i == lower else self._next[i] for i in (0, 1)
                )
                continue
            runs = align_step(ops_a, ops_c, self._fetch)
            self._alignments.add(sa, ops_a, ops_c, runs)
            self._next = tuple(next(s, None) for s in self._steps)
