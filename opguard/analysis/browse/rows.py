"""The aligned op list of one rank of two runs, built lazily one step at a time.

A step's rows come from the same alignment the diff uses (:func:`opguard.analysis.align.align_step`
and :func:`~opguard.analysis.align.merge` on light op views), so the list shows exactly the
pairs the verdict was drawn from. Only the steps a person looks at are aligned; a few recent
ones are kept. Rows hold what the list draws (name, call site, stack depth), never full records.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from enum import Enum
from typing import Any

from ...store import CallSite, RankTrace, schema
from ...store.light import LightOp, LightReader
from ...store.records import UNKNOWN_SITE
from ..align.keys import KeyTable, OpKeys
from ..align.layouts import LayoutKeys
from ..align.passes import align_step, columns_of, merge, pairs_of, records_of
from ..align.steps import StepIndex
from ..result import RankDiff, StepSummary
from ..words.verdict import Side

STEP_CACHE = 16


class Status(Enum):
    EQUAL = "equal"
    DIFFERING = "differing"
    ABSORBED = "absorbed"  # differing, but no reader saw the difference (analysis.divergence.reach)
    # differing: a step of a computation the runs take in another order (analysis.align.moves)
    REORDERED = "reordered"
    # Outputs that are views of data that differs (their derived fingerprints differ): the diff
    # compares a view's data where it is read, so it is no difference of its own.
    VIEW = "view of differing data"
    ONLY_A = "only in A"
    ONLY_B = "only in B"

    @property
    def differs(self) -> bool:
        """Whether the row is a difference a person steps to: an absorbed one or a view is
        not."""
        return self not in (Status.EQUAL, Status.ABSORBED, Status.REORDERED, Status.VIEW)


@dataclass(frozen=True, slots=True)
class OpLine:
    """One op as the list shows it."""

    index: int
    name: str
    site: CallSite
    depth: int  # frames in its user stack: step over / step out compare these


@dataclass(frozen=True, slots=True)
class Row:
    a: OpLine | None
    b: OpLine | None
    status: Status

    @property
    def shown(self) -> OpLine:
        """The op that stands for the row: A's, or B's when only B has it."""
        op = self.a if self.a is not None else self.b
        assert op is not None
        return op

    def side(self, side: Side) -> OpLine | None:
        return self.a if side is Side.A else self.b


class _Lines:
    """Turns one trace's raw ops into (alignment view, list line) pairs."""

    def __init__(self, trace: RankTrace, table: KeyTable, keys: type[OpKeys]) -> None:
        self.trace = trace
        self._light = LightReader(trace, keys(trace, table))
        self._names = trace.op_names
        self._sites = trace.sites
        self._depths = {ident: len(stack) for ident, stack in trace.stacks.items()}

    def read(self, start: int, stop: int) -> tuple[list[LightOp], list[OpLine], list[Views]]:
        """Each op's alignment view, list line and view fingerprints."""
        lights: list[LightOp] = []
        lines: list[OpLine] = []
        views: list[Views] = []
        for raw in self.trace.raw_ops(start, stop):
            lights.append(self._light.light(raw))
            lines.append(self._line(raw))
            views.append(_views(raw))
        return lights, lines, views

    def _line(self, raw: dict[str, Any]) -> OpLine:
        name = self._names.get(raw["o"], f"<op {raw['o']}>")
        site = self._sites.get(raw.get("c", -1), UNKNOWN_SITE)
        return OpLine(raw["i"], name, site, self._depths.get(raw.get("k", -1), 0))


Views = tuple[Any, ...]  # the fingerprints of an op's view outputs, derived from their bases'


def _views(raw: dict[str, Any]) -> Views:
    """The derived fingerprints of an op's outputs that are views (as its light view read
    them), which the light view leaves out (a view's data is compared where it is read): two
    runs' views of differing data have different ones."""
    return tuple(out.get("h") for out in raw.get("y", ()) if out.get("f", 0) & schema.FLAG_VIEW)


class RankRows:
    """Rows of one rank, step by step. Safe to use from a worker thread and the UI at once."""

    def __init__(
        self, trace_a: RankTrace, trace_b: RankTrace, across_layouts: bool = False
    ) -> None:
        """``across_layouts``: two ranks of runs in different parallel layouts (TP=N against
        TP=1), whose ops align as the tolerant diff aligns them, by call site and the rank of
        their shapes (a shard lines up with the tensor it is a part of)."""
        table = KeyTable()
        keys = LayoutKeys if across_layouts else OpKeys
        self._lines = (_Lines(trace_a, table, keys), _Lines(trace_b, table, keys))
        self._fetch = records_of(trace_a, trace_b)
        self.index = (StepIndex(trace_a), StepIndex(trace_b))
        self.steps: Sequence[int] = sorted(
            {r.step for r in self.index[0].ranges} | {r.step for r in self.index[1].ranges}
        )
        # Steps taken, as every front end counts them: the longer run's (later step numbers
        # hold the ops after its last step).
        self.steps_taken = max(index.count().steps for index in self.index)
        # From the diff, once it has run: per-step counts, the first divergence's observed
        # pair and the ops its verdict names as the cause.
        self.summaries: dict[int, StepSummary] = {}
        self.first: tuple[int, int] | None = None
        self.causes: frozenset[tuple[Side, int]] = frozenset()
        self._cache: OrderedDict[int, list[Row]] = OrderedDict()
        self._lock = threading.Lock()

    @property
    def last_index(self) -> int:
        """The highest op index of either run (the list sizes its index columns by it)."""
        return max((index.ranges[-1].stop - 1 for index in self.index if index.ranges), default=0)

    def rows(self, step: int) -> Sequence[Row]:
        with self._lock:
            rows = self._cache.get(step)
            if rows is None:
                rows = self._cache[step] = self._build(step)
                while len(self._cache) > STEP_CACHE:
                    self._cache.popitem(last=False)
            else:
                self._cache.move_to_end(step)
            return rows

    def _build(self, step: int) -> list[Row]:
        sides = []
        for lines, index in zip(self._lines, self.index, strict=True):
            span = index.get(step)
            sides.append(lines.read(span.start, span.stop) if span else ([], [], []))
        (light_a, line_a, views_a), (light_b, line_b, views_b) = sides
        summary = self.summaries.get(step)
        absorbed = set(summary.absorbed_pairs) if summary is not None else set()
        reordered = set(summary.reordered_pairs) if summary is not None else set()

        def status(i: int, j: int) -> Status:
            a, b = light_a[i], light_b[j]
            if a.outputs == b.outputs:
                return Status.EQUAL if views_a[i] == views_b[j] else Status.VIEW
            if (a.index, b.index) in absorbed:
                return Status.ABSORBED
            return Status.REORDERED if (a.index, b.index) in reordered else Status.DIFFERING

        rows = []
        runs = align_step(columns_of(light_a), columns_of(light_b), self._fetch)
        for i, j in merge(len(light_a), len(light_b), pairs_of(runs)):
            if i is not None and j is not None:
                rows.append(Row(line_a[i], line_b[j], status(i, j)))
            elif i is not None:
                rows.append(Row(line_a[i], None, Status.ONLY_A))
            elif j is not None:
                rows.append(Row(None, line_b[j], Status.ONLY_B))
        return rows

    def row_of(self, side: Side, index: int) -> Row | None:
        """The row holding op ``index`` of run ``side`` (None: the run has no such op)."""
        step = self.step_of(side, index)
        if step is None:
            return None
        for row in self.rows(step):
            op = row.side(side)
            if op is not None and op.index == index:
                return row
        return None

    def partner(self, side: Side, index: int) -> int | None:
        """The index of the op aligned with op ``index`` of run ``side`` in the other run."""
        row = self.row_of(side, index)
        other = row.side(Side.B if side is Side.A else Side.A) if row is not None else None
        return other.index if other is not None else None

    def step_of(self, side: Side, index: int) -> int | None:
        span = self.index[side.value].of(index)
        return None if span is None else span.step

    def may_differ(self, step: int) -> bool:
        """False only for steps the diff found equal throughout: scans skip them unread."""
        summary = self.summaries.get(step)
        if summary is None:
            return True
        return bool(summary.differing or summary.only_a or summary.only_b)

    def set_diff(self, diff: RankDiff) -> None:
        with self._lock:
            self.summaries = {s.step: s for s in diff.steps}
            if any(s.absorbed for s in diff.steps):
                self._cache.clear()  # rows built before the diff did not know what it absorbed
        first = diff.first
        if first is None:
            return
        self.first = (first.observed_a.index, first.observed_b.index)
        named = ((Side.A, first.a), (Side.B, first.b))
        self.causes = frozenset((side, op.index) for side, op in named if op is not None)

    def first_divergence(self) -> tuple[Side, int] | None:
        return (Side.A, self.first[0]) if self.first is not None else None

    def is_first(self, row: Row) -> bool:
        return (
            self.first is not None
            and row.a is not None
            and row.b is not None
            and (row.a.index, row.b.index) == self.first
        )

    def is_cause(self, row: Row) -> bool:
        """Whether the row holds an op the verdict names as the cause (the first differing
        pair itself, or the inserted, removed or differing op it was traced back to)."""
        return any(
            op is not None and (side, op.index) in self.causes
            for side, op in ((Side.A, row.a), (Side.B, row.b))
        )
