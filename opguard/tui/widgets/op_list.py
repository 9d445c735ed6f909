"""The aligned op list: a virtual view that draws only the rows on screen.

A step may hold hundreds of thousands of rows, so this is a ``ScrollView`` with the line API
(as Toolong draws millions of log lines): its virtual height is the number of visible rows and
``render_line`` formats a row only when it scrolls into view; strips are cached per row.
"""

from __future__ import annotations

from typing import ClassVar

from rich.segment import Segment
from rich.style import Style
from textual import events
from textual.cache import LRUCache
from textual.geometry import Size
from textual.message import Message
from textual.scroll_view import ScrollView
from textual.strip import Strip

from ...analysis.browse.rows import RankRows, Row, Status
from ..cursor import DebugCursor, Position, RowFilter

STATUS_WIDTH = 8
OP_WIDTH = 26
# The list leaves out the most common namespace and overload; the detail pane shows full names.
QUIET_PREFIX, QUIET_SUFFIX = "aten::", ".default"

_STATUS_TEXT = {
    Status.EQUAL: ("equal", "op-list--equal"),
    Status.DIFFERING: ("differs", "op-list--differing"),
    Status.ABSORBED: ("absorbed", "op-list--equal"),
    Status.REORDERED: ("reordered", "op-list--equal"),
    Status.VIEW: ("view ≠", "op-list--equal"),
    Status.ONLY_A: ("only A", "op-list--only-a"),
    Status.ONLY_B: ("only B", "op-list--only-b"),
}


class OpList(ScrollView, can_focus=False):
    """Rows of the cursor's step that its filter shows, the cursor's row highlighted."""

    COMPONENT_CLASSES: ClassVar[set[str]] = {
        "op-list--cursor",
        "op-list--equal",
        "op-list--differing",
        "op-list--only-a",
        "op-list--only-b",
        "op-list--first",
        "op-list--cause",
        "op-list--empty",
    }

    class Clicked(Message):
        """A row was clicked: the screen moves the cursor there."""

        def __init__(self, position: Position) -> None:
            super().__init__()
            self.position = position

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.cursor: DebugCursor | None = None
        self.rows: RankRows | None = None
        self._cache: LRUCache[tuple[object, ...], Strip] = LRUCache(1024)
        self._index_width = 3
        self._drawn: tuple[int | None, RowFilter, int, int] | None = None  # step, filter, top, row

    def show(self, cursor: DebugCursor, rows: RankRows) -> None:
        """Draws another rank's rows, or the same ones with new marks (the diff arrived)."""
        self.cursor, self.rows = cursor, rows
        self._index_width = max(3, len(str(rows.last_index)))
        self._cache.clear()
        self._drawn = None
        self.sync()

    def header(self) -> str:
        """Column titles, aligned with the rows."""
        width = self._index_width
        return f"  {'A #':>{width}} {'B #':>{width}}  {'status':<{STATUS_WIDTH}} {'op':<{OP_WIDTH}} call site"

    def sync(self) -> None:
        """Follows the cursor: resizes to its step's visible rows and scrolls it into view,
        by a line when it stepped just past an edge, centred when it jumped. A step to the
        next row redraws those two lines only."""
        cursor = self.cursor
        if cursor is None:
            return
        visible = cursor.visible()
        self.virtual_size = Size(self.scrollable_content_region.width, max(len(visible), 1))
        at = cursor.visible_index()
        top = round(self.scroll_offset.y)
        if at is not None:
            height = max(self.scrollable_content_region.height, 1)
            if at < top - 1 or at > top + height:
                self.scroll_to(y=max(at - height // 2, 0), animate=False, immediate=True)
            elif at < top:
                self.scroll_to(y=at, animate=False, immediate=True)
            elif at >= top + height:
                self.scroll_to(y=at - height + 1, animate=False, immediate=True)
        step = cursor.position.step if cursor.position is not None else None
        drawn = (step, cursor.filter, round(self.scroll_offset.y))
        if at is not None and self._drawn is not None and self._drawn[:3] == drawn:
            self.refresh_lines(self._drawn[3])
            self.refresh_lines(at)
        else:
            self.refresh()
        self._drawn = (*drawn, at) if at is not None else None

    def render_line(self, y: int) -> Strip:
        width = self.size.width
        base = self.rich_style
        cursor = self.cursor
        if cursor is None or cursor.position is None:
            return Strip.blank(width, base)
        visible = cursor.visible()
        at = round(self.scroll_offset.y) + y
        if not visible:
            if y == 0:
                note = "  no rows shown in this step: e shows equal rows, t all files"
                style = self.get_component_rich_style("op-list--empty")
                return Strip([Segment(note, style)]).crop_extend(0, width, base)
            return Strip.blank(width, base)
        if at >= len(visible):
            return Strip.blank(width, base)
        position = Position(cursor.position.step, visible[at])
        selected = position == cursor.position
        key = (position, selected, width)
        strip = self._cache.get(key)
        if strip is None:
            row = cursor.source.rows(position.step)[position.row]
            strip = self._cache[key] = self._format(row, selected, width, base)
        return strip

    def _format(self, row: Row, selected: bool, width: int, base: Style) -> Strip:
        status, component = _STATUS_TEXT[row.status]
        if self.rows is not None and self.rows.is_first(row):
            status, component = "FIRST", "op-list--first"
        elif self.rows is not None and self.rows.is_cause(row):
            status, component = "cause", "op-list--cause"
        line_style = self.get_component_rich_style("op-list--cursor") if selected else base
        status_style = line_style + self.get_component_rich_style(component, partial=True)
        op = row.shown
        a = str(row.a.index) if row.a is not None else "-"
        b = str(row.b.index) if row.b is not None else "-"
        name = op.name.removeprefix(QUIET_PREFIX).removesuffix(QUIET_SUFFIX)
        name = name if len(name) <= OP_WIDTH else name[: OP_WIDTH - 1] + "…"
        site = f"{op.site.file.rsplit('/', 1)[-1]}:{op.site.line} {op.site.function}"
        segments = [
            Segment(
                f"{'▶' if selected else ' '} {a:>{self._index_width}} {b:>{self._index_width}}  ",
                line_style,
            ),
            Segment(f"{status:<{STATUS_WIDTH}}", status_style),
            Segment(f" {name:<{OP_WIDTH}} {site}", line_style),
        ]
        return Strip(segments).crop_extend(0, width, line_style)

    def on_click(self, event: events.Click) -> None:
        if self.cursor is None or self.cursor.position is None:
            return
        visible = self.cursor.visible()
        at = round(self.scroll_offset.y) + event.y
        if 0 <= at < len(visible):
            self.post_message(self.Clicked(Position(self.cursor.position.step, visible[at])))
