"""Comparing two runs rank by rank: stream both traces step by step, align each step, and
stop judging at the first aligned pair whose outputs differ (counting continues, so the
alignment summary and the per-step picture cover the whole run).

Memory holds one step of light ops per side, plus a small cache of re-aligned steps for the
producer chain; it does not grow with the length of the trace.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from ..store import RankTrace, Run, TraceError
from .align import AlignReader, align, merge
from .divergence import Divergence, Explainer
from .keys import KeyTable, LightOp, LightReader

UNALIGNED_EXAMPLES = 5
STEP_CACHE = 4


@dataclass
class StepSummary:
    step: int
    aligned: int = 0
    only_a: int = 0
    only_b: int = 0
    differing: int = 0  # aligned pairs whose outputs differ


@dataclass
class RankDiff:
    rank: int
    steps_a: int = 0
    steps_b: int = 0
    aligned: int = 0
    only_a: int = 0
    only_b: int = 0
    differing: int = 0
    steps: list[StepSummary] = field(default_factory=list)
    unaligned_a: list[int] = field(default_factory=list)  # first few op indices only in A
    unaligned_b: list[int] = field(default_factory=list)
    first: Divergence | None = None
    notes: list[str] = field(default_factory=list)


def _steps(reader: LightReader, only: int | None) -> Iterator[tuple[int, list[LightOp]]]:
    """Groups a trace's ops by step, in order."""
    current: list[LightOp] = []
    step = None
    for raw in reader.trace.raw_ops():
        op = reader.light(raw)
        if only is not None and op.step != only:
            if op.step > only:
                break
            continue
        if op.step != step and current:
            yield step, current  # type: ignore[misc]
            current = []
        step = op.step
        current.append(op)
    if current:
        yield step, current  # type: ignore[misc]


class _StepAlignments:
    """A index <-> B index for recent steps; older steps are re-aligned from the traces on
    demand (the producer chain rarely reaches back more than a step)."""

    def __init__(self, reader_a: LightReader, reader_b: LightReader) -> None:
        self._readers = (reader_a, reader_b)
        self._ranges: dict[int, tuple[tuple[int, int], tuple[int, int]]] = {}
        self._cache: OrderedDict[int, tuple[dict[int, int], dict[int, int]]] = OrderedDict()

    def add(
        self, step: int, ops_a: list[LightOp], ops_b: list[LightOp], pairs: list[tuple[int, int]]
    ) -> None:
        self._ranges[step] = (
            (ops_a[0].index, ops_a[-1].index + 1),
            (ops_b[0].index, ops_b[-1].index + 1),
        )
        self._remember(step, [(ops_a[i].index, ops_b[j].index) for i, j in pairs])

    def _remember(
        self, step: int, pairs: list[tuple[int, int]]
    ) -> tuple[dict[int, int], dict[int, int]]:
        self._cache.pop(step, None)
        maps = self._cache[step] = (dict(pairs), {b: a for a, b in pairs})
        while len(self._cache) > STEP_CACHE:
            self._cache.popitem(last=False)
        return maps

    def _step_of(self, index: int, side: int) -> int | None:
        for step, ranges in self._ranges.items():
            lo, hi = ranges[side]
            if lo <= index < hi:
                return step
        return None

    def compared(self, index: int, side: int) -> bool:
        """Whether op ``index`` of run A (side 0) or B (side 1) lies in a compared step."""
        return self._step_of(index, side) is not None

    def b_of(self, a_index: int) -> int | None:
        step = self._step_of(a_index, 0)
        return None if step is None else self._mappings(step)[0].get(a_index)

    def a_of(self, b_index: int) -> int | None:
        step = self._step_of(b_index, 1)
        return None if step is None else self._mappings(step)[1].get(b_index)

    def _mappings(self, step: int) -> tuple[dict[int, int], dict[int, int]]:
        maps = self._cache.get(step)
        if maps is None:
            (alo, ahi), (blo, bhi) = self._ranges[step]
            ra, rb = self._readers
            ops_a = [ra.light(r) for r in ra.trace.raw_ops(alo, ahi)]
            ops_b = [rb.light(r) for r in rb.trace.raw_ops(blo, bhi)]
            pairs = [(ops_a[i].index, ops_b[j].index) for i, j in align(ops_a, ops_b)]
            maps = self._remember(step, pairs)
        return maps


def diff_rank(trace_a: RankTrace, trace_b: RankTrace, *, step: int | None = None) -> RankDiff:
    table = KeyTable()
    reader_a, reader_b = AlignReader(trace_a, table), AlignReader(trace_b, table)
    result = RankDiff(rank=trace_a.rank)
    alignments = _StepAlignments(reader_a, reader_b)
    explainer = Explainer(trace_a, trace_b, alignments)
    steps_a, steps_b = _steps(reader_a, step), _steps(reader_b, step)
    next_a, next_b = next(steps_a, None), next(steps_b, None)
    while next_a is not None and next_b is not None:
        (sa, ops_a), (sb, ops_b) = next_a, next_b
        if sa != sb:  # a step that has no ops on the other side
            result.notes.append(f"step {min(sa, sb)} exists only in run {'A' if sa < sb else 'B'}")
            if sa < sb:
                next_a = next(steps_a, None)
            else:
                next_b = next(steps_b, None)
            continue
        result.steps_a += 1
        result.steps_b += 1
        next_a, next_b = next(steps_a, None), next(steps_b, None)
        last_of_a, last_of_b = next_a is None, next_b is None
        _compare_step(
            result,
            sa,
            ops_a,
            ops_b,
            alignments,
            explainer,
            cut_a=last_of_b and not trace_b.finished,
            cut_b=last_of_a and not trace_a.finished,
        )
    for name, rest, gen, counter in (
        ("A", next_a, steps_a, "steps_a"),
        ("B", next_b, steps_b, "steps_b"),
    ):
        extra = 0
        while rest is not None:
            extra += 1
            rest = next(gen, None)
        if extra:
            other = "B" if name == "A" else "A"
            result.notes.append(
                f"run {name} has {extra} more step(s) than run {other}; "
                f"compared the first {getattr(result, counter)}"
            )
            setattr(result, counter, getattr(result, counter) + extra)
    for name, trace in (("A", trace_a), ("B", trace_b)):
        if not trace.finished:
            result.notes.append(
                f"run {name} did not finish (killed, crashed or still recording): "
                f"compared up to its last recorded op"
            )
        if trace.failure:
            result.notes.append(
                f"run {name}: recording stopped at op {trace.failure['at_op']}: "
                f"{trace.failure['error']}"
            )
        if trace.damage:
            result.notes.append(f"run {name}: {trace.damage}")
    return result


def _compare_step(
    result: RankDiff,
    step: int,
    ops_a: list[LightOp],
    ops_b: list[LightOp],
    alignments: _StepAlignments,
    explainer: Explainer,
    *,
    cut_a: bool,
    cut_b: bool,
) -> None:
    """Aligns one step and counts it; ``cut_a``/``cut_b``: the other run ended inside this
    step, so this side's ops after the last aligned pair were never reached there."""
    pairs = align(ops_a, ops_b)
    alignments.add(step, ops_a, ops_b, pairs)
    merged = merge(len(ops_a), len(ops_b), pairs)
    end_a = pairs[-1][0] if pairs else -1
    end_b = pairs[-1][1] if pairs else -1
    summary = StepSummary(step)
    for i, j in merged:
        if i is not None and j is not None:
            summary.aligned += 1
            if ops_a[i].outputs != ops_b[j].outputs:
                summary.differing += 1
                if result.first is None:
                    result.first = explainer.explain(
                        explainer.trace_a.op(ops_a[i].index), explainer.trace_b.op(ops_b[j].index)
                    )
        elif i is not None:
            if cut_a and i > end_a:
                continue
            summary.only_a += 1
            if len(result.unaligned_a) < UNALIGNED_EXAMPLES:
                result.unaligned_a.append(ops_a[i].index)
        elif j is not None:
            if cut_b and j > end_b:
                continue
            summary.only_b += 1
            if len(result.unaligned_b) < UNALIGNED_EXAMPLES:
                result.unaligned_b.append(ops_b[j].index)
    result.steps.append(summary)
    result.aligned += summary.aligned
    result.only_a += summary.only_a
    result.only_b += summary.only_b
    result.differing += summary.differing


@dataclass
class RunDiff:
    """The comparison of two runs: every compared rank, and the verdict."""

    path_a: str
    path_b: str
    meta_a: dict[str, Any]
    meta_b: dict[str, Any]
    ranks: list[RankDiff]

    @property
    def first(self) -> Divergence | None:
        found = [r.first for r in self.ranks if r.first is not None]
        return min(found, key=lambda d: (d.step, d.rank)) if found else None

    @property
    def verdict(self) -> str:
        return "diverged" if self.first is not None else "identical"


def diff_runs(
    run_a: Run, run_b: Run, *, rank: int | None = None, step: int | None = None
) -> RunDiff:
    if rank is not None:
        ranks = [rank]
    else:
        ranks = sorted(set(run_a.ranks) & set(run_b.ranks))
        if not ranks:
            raise TraceError(f"no rank recorded in both runs (A: {run_a.ranks}, B: {run_b.ranks})")
    results = [diff_rank(run_a.rank(r), run_b.rank(r), step=step) for r in ranks]
    if step is not None and not any(summary.step == step for r in results for summary in r.steps):
        # Nothing compared is not "identical": say which run lacks the step.
        has = [
            name
            for name, r in (("A", run_a), ("B", run_b))
            if any(_has_step(r.rank(k), step) for k in ranks)
        ]
        where = f"only in run {has[0]}" if len(has) == 1 else "in neither run"
        raise TraceError(f"step {step} was recorded {where}: nothing to compare")
    return RunDiff(str(run_a.path), str(run_b.path), run_a.meta, run_b.meta, results)


def _has_step(trace: RankTrace, step: int) -> bool:
    for raw in trace.raw_ops():  # steps only grow along a trace
        if raw.get("s", 0) >= step:
            return bool(raw.get("s", 0) == step)
    return False
