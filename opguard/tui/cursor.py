"""The debugger's navigation state, kept apart from any widget so it can be tested without a UI.

A :class:`DebugCursor` stands on one row of the aligned op list (a step and a row within it) and
knows how to move like a debugger: op by op, difference by difference, over or out of a call by
stack depth, to an op index, to an input's producer and back. It reads rows through the small
:class:`RowSource` protocol, which :class:`opguard.analysis.browse.rows.RankRows` implements over traces and
tests implement over lists.

Moves that may read far (the next difference, a search, stepping over) are split in two: a
``find_*`` method that only computes the target, so the UI can run it in a worker thread, and
:meth:`DebugCursor.move_to` / :meth:`DebugCursor.jump_to` that apply it.
"""

from __future__ import annotations

import bisect
import re
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Protocol

from ..analysis.browse.rows import Row, Side, Status

VISIBLE_CACHE = 32
LOCAL_STEPS = 2  # stepping over or out looks no further than the next step


class RowSource(Protocol):
    """What the cursor reads: the steps, each step's rows, and hints from the diff."""

    @property
    def steps(self) -> Sequence[int]: ...

    def rows(self, step: int) -> Sequence[Row]: ...

    def step_of(self, side: Side, index: int) -> int | None: ...

    def may_differ(self, step: int) -> bool: ...

    def first_divergence(self) -> tuple[Side, int] | None: ...


@dataclass(frozen=True, slots=True, order=True)
class Position:
    step: int
    row: int  # index into the step's rows (all of them, not only the visible ones)


@dataclass(frozen=True, slots=True)
class RowFilter:
    """Which rows the list shows: all, or without equal pairs, and/or only ops of one file."""

    hide_equal: bool = False
    files: tuple[str | None, str | None] | None = None  # (file in A, file in B)

    @property
    def active(self) -> bool:
        return self.hide_equal or self.files is not None

    def accepts(self, row: Row) -> bool:
        if self.hide_equal and not row.status.differs:
            return False
        if self.files is not None:
            file_a, file_b = self.files
            in_a = row.a is not None and row.a.site.file == file_a
            in_b = row.b is not None and row.b.site.file == file_b
            return in_a or in_b
        return True


@dataclass(frozen=True, slots=True)
class Query:
    """A search: ``file.py:LINE`` finds ops called from that line, anything else is a
    case-insensitive part of an op name."""

    text: str
    file: str | None = None
    line: int | None = None

    @classmethod
    def parse(cls, text: str) -> Query:
        text = text.strip()
        match = re.fullmatch(r"(.+):(\d+)", text)
        if match:
            return cls(text, match.group(1), int(match.group(2)))
        return cls(text.lower())

    def matches(self, row: Row) -> bool:
        for op in (row.a, row.b):
            if op is None:
                continue
            if self.file is not None:
                file = op.site.file
                if op.site.line == self.line and (
                    file == self.file or file.endswith(f"/{self.file}")
                ):
                    return True
            elif self.text in op.name.lower():
                return True
        return False


class DebugCursor:
    """Where the debugger stands in one rank's aligned op list, and how it moves."""

    def __init__(self, source: RowSource) -> None:
        self.source = source
        self.filter = RowFilter()
        self.history: list[Position] = []
        self._visible: OrderedDict[tuple[int, RowFilter], Sequence[int]] = OrderedDict()
        self._lock = threading.Lock()
        self.position: Position | None = next(
            (Position(step, 0) for step in source.steps if source.rows(step)), None
        )

    # -- what is under the cursor ---------------------------------------------------------

    @property
    def row(self) -> Row | None:
        if self.position is None:
            return None
        return self.source.rows(self.position.step)[self.position.row]

    def visible(self, step: int | None = None) -> Sequence[int]:
        """Indices of the rows of ``step`` (default: the current one) that the filter shows."""
        if step is None:
            if self.position is None:
                return ()
            step = self.position.step
        rows = self.source.rows(step)
        if not self.filter.active:
            return range(len(rows))
        key = (step, self.filter)
        with self._lock:
            found = self._visible.get(key)
            if found is None:
                found = self._visible[key] = [
                    i for i, r in enumerate(rows) if self.filter.accepts(r)
                ]
                while len(self._visible) > VISIBLE_CACHE:
                    self._visible.popitem(last=False)
            return found

    def visible_index(self) -> int | None:
        """The cursor's place among the visible rows of its step (None: the filter hides it)."""
        if self.position is None:
            return None
        visible = self.visible()
        at = bisect.bisect_left(visible, self.position.row)
        return at if at < len(visible) and visible[at] == self.position.row else None

    # -- walking the rows -----------------------------------------------------------------

    def _steps_from(self, step: int, forward: bool) -> Iterator[int]:
        steps = self.source.steps
        at = bisect.bisect_left(steps, step)
        order = range(at, len(steps)) if forward else range(min(at, len(steps) - 1), -1, -1)
        return (steps[i] for i in order)

    def _scan(
        self,
        accept: Callable[[Row], bool],
        *,
        forward: bool = True,
        skip: Callable[[int], bool] | None = None,
        max_steps: int | None = None,
    ) -> Position | None:
        """The first visible row after (or before) the cursor that ``accept`` takes; steps for
        which ``skip`` says there is nothing to find are passed over without being read."""
        if self.position is None:
            return None
        start = self.position
        for count, step in enumerate(self._steps_from(start.step, forward)):
            if max_steps is not None and count >= max_steps:
                break
            if skip is not None and skip(step):
                continue
            rows = self.source.rows(step)
            visible = self.visible(step)
            if step == start.step:
                cut = (
                    bisect.bisect_right(visible, start.row)
                    if forward
                    else bisect.bisect_left(visible, start.row)
                )
                visible = visible[cut:] if forward else visible[:cut]
            for i in visible if forward else reversed(visible):
                if accept(rows[i]):
                    return Position(step, i)
        return None

    def _hidden_step(self, step: int) -> bool:
        """Steps the diff found equal throughout show nothing while equal rows are hidden."""
        return self.filter.hide_equal and not self.source.may_differ(step)

    def next_op(self) -> bool:
        return self.move_to(self._scan(lambda row: True, skip=self._hidden_step))

    def prev_op(self) -> bool:
        return self.move_to(self._scan(lambda row: True, forward=False, skip=self._hidden_step))

    def move_by(self, count: int) -> bool:
        """``count`` visible rows down (up when negative), staying within the step: paging."""
        at = self.visible_index()
        visible = self.visible()
        if at is None or self.position is None or not visible:
            return False
        target = max(0, min(len(visible) - 1, at + count))
        return self.move_to(Position(self.position.step, visible[target]))

    def goto_step(self, step: int) -> bool:
        """The first visible row of ``step``."""
        if step not in self.source.steps:
            return False
        visible = self.visible(step)
        return bool(visible) and self.jump_to(Position(step, visible[0]))

    def next_step(self, forward: bool = True) -> bool:
        """The first shown row of the next (or previous) step that shows any."""
        if self.position is None:
            return False
        steps = self._steps_from(self.position.step, forward)
        next(steps, None)  # the current step
        return any(self.goto_step(step) for step in steps if not self._hidden_step(step))

    # -- finding (pure: safe to run in a worker thread) -----------------------------------

    def find_difference(self, forward: bool = True) -> Position | None:
        def equal_throughout(step: int) -> bool:
            return not self.source.may_differ(step)

        return self._scan(lambda row: row.status.differs, forward=forward, skip=equal_throughout)

    def find_first_differing(self) -> Position | None:
        """The first row of the list whose aligned ops' outputs differ (filters aside): where
        runs that differ by rounding alone start to differ."""
        for step in self.source.steps:
            if self.source.may_differ(step):
                rows = self.source.rows(step)
                found = next((i for i, r in enumerate(rows) if r.status is Status.DIFFERING), None)
                if found is not None:
                    return Position(step, found)
        return None

    def find_over(self) -> Position | None:
        """The next op no deeper in the call stack: the ops of calls made here are passed."""
        depth = self.row.shown.depth if self.row is not None else 0
        return self._scan(lambda row: row.shown.depth <= depth, max_steps=LOCAL_STEPS)

    def find_out(self) -> Position | None:
        """The next op shallower in the call stack: the rest of this call is passed."""
        depth = self.row.shown.depth if self.row is not None else 0
        return self._scan(lambda row: row.shown.depth < depth, max_steps=LOCAL_STEPS)

    def find_match(self, query: Query, forward: bool = True) -> Position | None:
        return self._scan(query.matches, forward=forward, skip=self._hidden_step)

    def locate(self, side: Side, index: int) -> Position | None:
        """The row holding op ``index`` of run A or B."""
        step = self.source.step_of(side, index)
        if step is None:
            return None
        for i, row in enumerate(self.source.rows(step)):
            op = row.side(side)
            if op is not None and op.index == index:
                return Position(step, i)
        return None

    # -- moving ---------------------------------------------------------------------------

    def move_to(self, position: Position | None) -> bool:
        """Steps to ``position`` (from a ``find_*``); False when there was nowhere to go."""
        if position is None:
            return False
        self.position = position
        return True

    def jump_to(self, position: Position | None) -> bool:
        """Jumps to ``position``, remembering where from (:meth:`back` returns); a filter that
        would hide the target is switched off."""
        if position is None:
            return False
        if self.position is not None and position != self.position:
            self.history.append(self.position)
        if not self.filter.accepts(self.source.rows(position.step)[position.row]):
            self.filter = RowFilter()
        return self.move_to(position)

    def goto(self, side: Side, index: int) -> bool:
        return self.jump_to(self.locate(side, index))

    def first_divergence(self) -> bool:
        first = self.source.first_divergence()
        return first is not None and self.goto(*first)

    def back(self) -> bool:
        """Returns to where the last jump (a followed producer, a search, a go-to) started."""
        return bool(self.history) and self.move_to(self.history.pop())

    # -- filters --------------------------------------------------------------------------

    def set_filter(self, row_filter: RowFilter) -> None:
        """Applies a filter; a cursor on a row it hides moves to the nearest shown row of the
        step, if there is one."""
        self.filter = row_filter
        if self.position is None or self.visible_index() is not None:
            return
        visible = self.visible()
        if visible:
            at = min(bisect.bisect_left(visible, self.position.row), len(visible) - 1)
            self.position = Position(self.position.step, visible[at])

    def toggle_hide_equal(self) -> None:
        self.set_filter(replace(self.filter, hide_equal=not self.filter.hide_equal))

    def toggle_this_file(self) -> None:
        """Shows only ops called from the current op's file (in either run), or all again."""
        row = self.row
        if self.filter.files is not None or row is None:
            self.set_filter(replace(self.filter, files=None))
            return
        files = (row.a.site.file if row.a else None, row.b.site.file if row.b else None)
        self.set_filter(replace(self.filter, files=files))


@dataclass(frozen=True, slots=True)
class Target:
    """Where "go to" goes: ``123`` or ``a123`` is op 123 of run A, ``b123`` of run B, ``s4``
    the start of step 4."""

    kind: str  # "A", "B" or "step"
    number: int

    @classmethod
    def parse(cls, text: str) -> Target | None:
        match = re.fullmatch(r"\s*(a|b|s|step)?\s*#?(\d+)\s*", text.lower())
        if match is None:
            return None
        prefix = match.group(1) or "a"
        return cls("step" if prefix.startswith("s") else prefix.upper(), int(match.group(2)))

    def apply(self, cursor: DebugCursor) -> bool:
        if self.kind == "step":
            return cursor.goto_step(self.number)
        return cursor.goto(Side[self.kind], self.number)
