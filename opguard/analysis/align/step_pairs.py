"""The alignment of the steps a diff compares, by op index: which op of run B an op of run A
is paired with, for the steps walked so far.

The walk (:mod:`opguard.analysis.diff`) reads each trace a step at a time (:func:`step_columns`)
and aligns each step once (:func:`~.passes.align_step`); :class:`StepAlignments` keeps the
pairs of the last few steps and re-aligns an older step from the traces when the producer chain
reaches back to it. :func:`aligned_index` aligns the one step that holds an op.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator

from ...store import RankTrace
from ...store.light import LightReader, OpColumns
from .keys import KeyTable, OpKeys
from .myers import Run as MatchRun
from .passes import align_step, records_of

STEP_CACHE = 4


def step_columns(reader: LightReader, only: int | None) -> Iterator[tuple[int, OpColumns]]:
    """Groups a trace's ops by step, in order (only step ``only`` when given)."""
    if only is None:
        for columns in reader.columns():
            yield columns.step, columns
        return
    pending: OpColumns | None = None
    for columns in reader.columns(until=only):
        if columns.step != only:
            if columns.step > only:
                break
            continue  # skipped ops do not end a group: the next run of step ``only`` joins it
        if pending is not None and pending.step == columns.step:
            pending.extend(columns)
            continue
        if pending is not None:
            yield pending.step, pending
        pending = columns
    if pending is not None:
        yield pending.step, pending


class StepPairs:
    """The aligned pairs of one step by op index, mapped on first use."""

    __slots__ = ("_maps", "_runs", "index_a", "index_b")

    def __init__(self, index_a: list[int], index_b: list[int], runs: list[MatchRun]) -> None:
        self.index_a, self.index_b, self._runs = index_a, index_b, runs
        self._maps: tuple[dict[int, int], dict[int, int]] | None = None

    def maps(self) -> tuple[dict[int, int], dict[int, int]]:
        if self._maps is None:
            a_to_b: dict[int, int] = {}
            for i, j, n in self._runs:
                a_to_b.update(zip(self.index_a[i : i + n], self.index_b[j : j + n], strict=True))
            self._maps = (a_to_b, {b: a for a, b in a_to_b.items()})
        return self._maps


class StepAlignments:
    """A index <-> B index for recent steps; older steps are re-aligned from the traces on
    demand (the producer chain rarely reaches back more than a step)."""

    def __init__(self, reader_a: LightReader, reader_b: LightReader) -> None:
        self._readers = (reader_a, reader_b)
        self._fetch = records_of(reader_a.trace, reader_b.trace)
        self._ranges: dict[int, tuple[tuple[int, int], tuple[int, int]]] = {}
        self._cache: OrderedDict[int, StepPairs] = OrderedDict()

    def add(self, step: int, ops_a: OpColumns, ops_b: OpColumns, runs: list[MatchRun]) -> None:
        self._ranges[step] = (
            (ops_a.index[0], ops_a.index[-1] + 1),
            (ops_b.index[0], ops_b.index[-1] + 1),
        )
        self._remember(step, StepPairs(ops_a.index, ops_b.index, runs))

    def _remember(self, step: int, pairs: StepPairs) -> StepPairs:
        self._cache.pop(step, None)
        self._cache[step] = pairs
        while len(self._cache) > STEP_CACHE:
            self._cache.popitem(last=False)
        return pairs

    def step_of(self, index: int, side: int) -> int | None:
        """The compared step holding op ``index`` of run A (side 0) or B (side 1)."""
        # Latest first: the ops asked about (producers of what is being read) are recent.
        for step, ranges in reversed(self._ranges.items()):
            lo, hi = ranges[side]
            if lo <= index < hi:
                return step
        return None

    def compared(self, index: int, side: int) -> bool:
        """Whether op ``index`` of run A (side 0) or B (side 1) lies in a compared step."""
        return self.step_of(index, side) is not None

    def b_of(self, a_index: int) -> int | None:
        step = self.step_of(a_index, 0)
        return None if step is None else self._pairs(step).maps()[0].get(a_index)

    def a_of(self, b_index: int) -> int | None:
        step = self.step_of(b_index, 1)
        return None if step is None else self._pairs(step).maps()[1].get(b_index)

    def step_ops(self, step: int) -> tuple[tuple[list[int], list[int]], list[tuple[int, int]]]:
        """A compared step's op indices in each run, and its aligned pairs (op indices)."""
        pairs = self._pairs(step)
        return (pairs.index_a, pairs.index_b), list(pairs.maps()[0].items())

    def _pairs(self, step: int) -> StepPairs:
        pairs = self._cache.get(step)
        if pairs is None:
            (alo, ahi), (blo, bhi) = self._ranges[step]
            ra, rb = self._readers
            ops_a, ops_b = ra.read(alo, ahi), rb.read(blo, bhi)
            runs = align_step(ops_a, ops_b, self._fetch)
            pairs = self._remember(step, StepPairs(ops_a.index, ops_b.index, runs))
        return pairs


def aligned_index(trace_a: RankTrace, trace_b: RankTrace, index_a: int) -> int | None:
    """The op of run B that the diff aligns with op ``index_a`` of run A (None: the op exists
    only in A). Aligns only the step that holds the op."""
    step = trace_a.op(index_a).step
    table = KeyTable()
    found = [
        next(
            (
                columns
                for _, columns in step_columns(LightReader(trace, OpKeys(trace, table)), step)
            ),
            None,
        )
        for trace in (trace_a, trace_b)
    ]
    ops_a, ops_b = found
    if ops_a is None or ops_b is None:
        return None
    pairs = StepPairs(
        ops_a.index, ops_b.index, align_step(ops_a, ops_b, records_of(trace_a, trace_b))
    )
    return pairs.maps()[0].get(index_a)
