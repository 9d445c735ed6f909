"""The key help: every binding of the main screen and the app, read from the bindings
themselves so the list cannot drift from what the keys do."""

from __future__ import annotations

from collections.abc import Iterable
from typing import ClassVar

from rich.table import Table
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import VerticalScroll
from textual.screen import ModalScreen
from textual.widgets import Static


class HelpScreen(ModalScreen[None]):
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("escape,q,question_mark", "dismiss", "close help", id="close-help")
    ]

    def __init__(self, bindings: Iterable[BindingType]) -> None:
        super().__init__()
        self._keys = [b for b in bindings if isinstance(b, Binding)]

    def compose(self) -> ComposeResult:
        table = Table(title="opguard tui — keys", box=None, title_style="bold", padding=(0, 2))
        table.add_column("key", style="bold cyan", no_wrap=True)
        table.add_column("does")
        for keys, does in self._rows():
            table.add_row(keys, does)
        with VerticalScroll(id="help-box"):
            yield Static(table)
            yield Static("Esc, q or ? closes this help.", id="help-close")

    def _rows(self) -> list[tuple[str, str]]:
        """One row per binding; bindings without a tooltip share one row, their group's."""
        rows: list[tuple[str, str]] = []
        shared: Binding.Group | None = None
        for binding in self._keys:
            keys = " / ".join(
                self.app.get_key_display(Binding(k, "")) for k in binding.key.split(",")
            )
            if binding.tooltip or binding.group is None:
                rows.append((keys, binding.tooltip or binding.description))
                shared = None
            elif binding.group is shared:
                rows[-1] = (f"{rows[-1][0]} {keys}", rows[-1][1])
            else:
                rows.append((keys, binding.group.description))
                shared = binding.group
        return rows
