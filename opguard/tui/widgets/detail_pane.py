"""The detail pane: the selected op of both runs (see :mod:`opguard.tui.detail`)."""

from __future__ import annotations

from collections.abc import Callable

from rich.console import RenderableType
from textual.app import ComposeResult
from textual.containers import VerticalScroll
from textual.timer import Timer
from textual.widgets import Static

# Drawing the pane (tables, highlighted source) costs more than a key press may: while keys
# come faster than this, only the op list follows them and the pane catches up after.
SETTLE_SECONDS = 0.06


class DetailPane(VerticalScroll, can_focus=False):
    """Scrolls with the mouse or J / K; keys stay with the op list's navigation."""

    def __init__(self, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self._pending: Callable[[], RenderableType] | None = None
        self._timer: Timer | None = None

    def compose(self) -> ComposeResult:
        yield Static(id="detail-body")

    def show(self, content: Callable[[], RenderableType]) -> None:
        """Shows what ``content`` builds, once keys have paused for a moment."""
        self._pending = content
        if self._timer is None:
            self._timer = self.set_timer(SETTLE_SECONDS, self._draw)
        else:
            self._timer.reset()

    @property
    def drawn(self) -> bool:
        """Whether the pane shows the latest content (no draw waits for keys to pause): what
        a script driving the app waits for before reading the screen."""
        return self._pending is None

    def _draw(self) -> None:
        self._timer = None
        if self._pending is not None:
            content, self._pending = self._pending, None
            self.query_one("#detail-body", Static).update(content())
            self.scroll_home(animate=False)
