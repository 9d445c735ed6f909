"""The debugger's screen for a rank recorded at step level only (``--steps-only``): the header
with the verdict, the steps as a list (the op list would be empty), and the selected step's
state entries compared in the detail pane.

As on the main screen, the diff runs in a child process (:mod:`opguard.tui.background`); until
it answers, the list is there and every step can be compared by selecting it.
"""

from __future__ import annotations

from typing import ClassVar

from rich.console import RenderableType
from rich.text import Text
from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.widgets import Footer, OptionList, Static
from textual.widgets.option_list import Option

from ...analysis import RankDiff
from ...analysis.browse.rows import Side
from ...store import TraceError
from ..background import Comparison
from ..messages import DiffReady, WorkFailed
from ..session import Session
from ..step_detail import render_step
from ..step_records import EQUAL, FIRST, ONLY_A, ONLY_B, StepRecords
from ..widgets.agent_panel import AgentPanel, AgentSelection
from ..widgets.detail_pane import DetailPane
from ..widgets.run_header import RunHeader
from .main import AgentFactory

STATUS_WIDTH = 8
_STATUS_STYLE = {FIRST: "bold reverse red", EQUAL: "dim", ONLY_A: "magenta", ONLY_B: "green"}


class StepScreen(Screen[None]):
    AUTO_FOCUS = "#step-list"
    BINDINGS: ClassVar[list[BindingType]] = [
        Binding("j", "move(1)", "step", tooltip="next step", id="next-step"),
        Binding("k", "move(-1)", "step", tooltip="previous step", id="previous-step"),
        Binding("d", "first_divergence", "first", tooltip="jump to the first differing step"),
        Binding("r", "rank", "rank", tooltip="switch rank", id="rank"),
        Binding("a", "agent", "agent", tooltip="open or close the agent panel", id="agent"),
    ]

    def __init__(self, session: Session, agent: AgentFactory | None = None) -> None:
        super().__init__()
        self.session = session
        self._agent = agent
        self._comparison: Comparison | None = None
        self._diffs: dict[int, RankDiff] = {}
        self._open(session.ranks[0])

    def _open(self, rank: int) -> None:
        """Shows ``rank``: its steps, and its diff once known."""
        self.rank = rank
        traces = (self.session.trace(Side.A, rank), self.session.trace(Side.B, rank))
        self.records = StepRecords(*traces)
        self.diff = self._diffs.get(rank)
        if self.diff is not None:
            self.records.set_diff(self.diff)
        self._failed = ""
        self.step: int | None = self.records.steps[0] if self.records.steps else None

    def compose(self) -> ComposeResult:
        yield RunHeader(id="run-header")
        with Horizontal(id="body"):
            with Vertical(id="list-column"):
                yield Static(f"  {'step':>8}  status", id="list-header")
                yield OptionList(id="step-list")
            yield DetailPane(id="detail")
            yield AgentPanel(id="agent-panel")
        yield Footer()

    def on_mount(self) -> None:
        if self._agent is not None:
            self.query_one(AgentPanel).attach(self._agent())
        self._show()

    def _show(self) -> None:
        """Draws the rank just opened, and compares it in a child process unless done."""
        for note in self.session.notices(self.rank):
            self.notify(note, severity="warning", timeout=10)
        steps = self.query_one(OptionList)
        steps.clear_options()
        steps.add_options(self._options())
        if self.diff is None:
            if self._comparison is not None:
                self._comparison.stop()
            self._comparison = Comparison(
                self.session.runs[0].path, self.session.runs[1].path, self.rank
            )
            self._relay(self._comparison, self.rank)
        self._select(self.records.first if self.records.first is not None else self.step)

    def on_unmount(self) -> None:
        if self._comparison is not None:
            self._comparison.stop()

    def _options(self) -> list[Option]:
        options = []
        for step in self.records.steps:
            status = self.records.status(step)
            line = Text(f"{step:>8}  ")
            line.append(f"{status:<{STATUS_WIDTH}}", _STATUS_STYLE.get(status, ""))
            options.append(Option(line, id=str(step)))
        return options

    @work(thread=True, group="compare", exclusive=True, exit_on_error=False)
    def _relay(self, comparison: Comparison, rank: int) -> None:
        for kind, payload in comparison.results():
            if kind == "diff":
                self.post_message(DiffReady(rank, payload))
            elif kind == "error":
                self.post_message(WorkFailed("comparing the runs", payload))

    def on_diff_ready(self, message: DiffReady) -> None:
        self._diffs[message.rank] = message.diff
        if message.rank != self.rank:
            return
        self.diff = message.diff
        self.records.set_diff(message.diff)
        steps = self.query_one(OptionList)
        steps.clear_options()
        steps.add_options(self._options())
        for note in message.diff.notes:
            self.notify(note, severity="warning", timeout=10)
        first = self.records.first
        self._select(first if first is not None else self.step)

    def on_work_failed(self, message: WorkFailed) -> None:
        self._failed = f"{message.what} failed: {message.error}"
        self.notify(self._failed, severity="error", timeout=10)
        self._refresh()

    def on_option_list_option_highlighted(self, event: OptionList.OptionHighlighted) -> None:
        if event.option.id is not None and int(event.option.id) != self.step:
            self.step = int(event.option.id)
            self._refresh()

    def _select(self, step: int | None) -> None:
        steps = self.query_one(OptionList)
        if step is not None:
            steps.highlighted = self.records.steps.index(step)
        self.step = step
        self._refresh()

    def _refresh(self) -> None:
        step = self.step
        position = "" if step is None else f"step {step}"
        if step is not None:
            position += f" ({self.records.steps.index(step) + 1} of {len(self.records.steps)})"
        self.query_one(RunHeader).show(
            self.diff,
            self._failed,
            [self.session.state(side, self.rank) for side in Side],
            self.rank,
            self.session.ranks,
            position,
        )
        self.query_one(DetailPane).show(self._detail)
        self.query_one(AgentPanel).selection = AgentSelection(
            *self.session.labels, self.rank, step, None, None, None
        )

    def _detail(self) -> RenderableType:
        step = self.step
        if step is None:
            return Text("Neither run recorded a step.")
        try:
            comparison = self.records.compare(step)
        except TraceError as exc:
            return Text(f"This step cannot be read: {exc}")
        first = self.diff.state_first if self.diff is not None else None
        return render_step(step, comparison, first, self.records.only_in(step))

    def action_move(self, by: int) -> None:
        steps = self.query_one(OptionList)
        if by > 0:
            steps.action_cursor_down()
        else:
            steps.action_cursor_up()

    def action_first_divergence(self) -> None:
        first = self.records.first
        if self.diff is None:
            self.notify("still comparing the runs: the first differing step is not known yet")
        elif first is None:
            self.notify(f"no divergence: rank {self.rank}'s state is equal in every step")
        else:
            self._select(first)

    def action_rank(self) -> None:
        ranks = self.session.ranks
        if len(ranks) == 1:
            self.notify(f"rank {self.rank} is the only rank both runs recorded")
            return
        self._open(ranks[(ranks.index(self.rank) + 1) % len(ranks)])
        self._show()

    def action_agent(self) -> None:
        self.query_one(AgentPanel).toggle()
