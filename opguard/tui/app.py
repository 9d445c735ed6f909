"""``opguard tui``: step through two aligned runs like a debugger.

The app is thin: it holds the :class:`~opguard.tui.session.Session` (both runs, opened before
the UI starts) and shows the main screen; navigation lives in
:class:`~opguard.tui.cursor.DebugCursor`, drawing in the widgets.
"""

from __future__ import annotations

from typing import ClassVar

from textual.app import App
from textual.binding import Binding, BindingType
from textual.screen import Screen

from .cursor import DebugCursor
from .screens.help import HelpScreen
from .screens.main import AgentFactory, MainScreen
from .screens.steps import StepScreen
from .session import Session


class OpguardApp(App[None]):
    CSS_PATH = "app.tcss"
    TITLE = "opguard tui"
    ENABLE_COMMAND_PALETTE = False
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("question_mark", "help", "help", tooltip="this list of keys", id="help"),
        Binding("q", "quit", "quit", tooltip="quit", id="quit"),
    ]

    def __init__(self, session: Session, *, agent: AgentFactory | None = None) -> None:
        """``agent`` builds the widget the agent panel shows (see
        :mod:`opguard.tui.widgets.agent_panel`); without it the panel holds a placeholder.
        Runs compared by their step-level records alone (a run recorded no ops) open on the
        step list instead of the op list."""
        super().__init__()
        self.session = session
        self.main: MainScreen | StepScreen = (
            StepScreen(session, agent)
            if session.by_steps(session.ranks[0])
            else MainScreen(session, agent)
        )

    def get_default_screen(self) -> Screen[None]:
        return self.main

    @property
    def cursor(self) -> DebugCursor:
        """The cursor of the rank on screen (the op list's)."""
        assert isinstance(self.main, MainScreen)
        return self.main.cursor

    def action_help(self) -> None:
        if not isinstance(self.screen, HelpScreen):
            self.push_screen(HelpScreen([*self.main.BINDINGS, *self.BINDINGS]))
