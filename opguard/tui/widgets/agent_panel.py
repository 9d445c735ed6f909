"""Where the agent's chat lives: a collapsible panel the agent module mounts its widget into.

The debugger knows nothing of agents. It keeps :attr:`AgentPanel.selection` up to date (the
runs, rank and op under the cursor, and the first divergence), so a chat widget can watch it
(``self.watch(panel, "selection", callback)``) to ground its questions, and it toggles the panel
with a key. An agent front end attaches itself with :meth:`AgentPanel.attach`, or is built by the
``agent`` factory given to :class:`opguard.tui.app.OpguardApp`.
"""

from __future__ import annotations

from dataclasses import dataclass

from textual.app import ComposeResult
from textual.containers import Vertical
from textual.reactive import var
from textual.widget import Widget
from textual.widgets import Static

from ...analysis import Divergence


@dataclass(frozen=True, slots=True)
class AgentSelection:
    """What the debugger is looking at, for an agent to talk about."""

    run_a: str
    run_b: str
    rank: int
    step: int | None
    op_a: int | None  # op index in run A of the selected row
    op_b: int | None
    divergence: Divergence | None  # the rank's first divergence, once the diff has run


class AgentPanel(Vertical):
    selection: var[AgentSelection | None] = var(None)  # watchable; never redraws the panel

    def compose(self) -> ComposeResult:
        yield Static(
            "Agent\n\nNo agent is attached. An agent front end mounts its chat here "
            "(AgentPanel.attach).",
            id="agent-placeholder",
        )

    def attach(self, widget: Widget) -> None:
        """Replaces the placeholder (or a previous agent widget) with ``widget``."""
        self.remove_children()
        self.mount(widget)

    def toggle(self) -> bool:
        """Opens or closes the panel; returns whether it is open now."""
        self.toggle_class("-open")
        return self.has_class("-open")
