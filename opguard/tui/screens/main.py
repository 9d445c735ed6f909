"""The debugger's main screen: header, pictures, the aligned op list and the detail pane.

The screen owns one :class:`~opguard.tui.cursor.DebugCursor` per rank and turns keys into cursor
moves; widgets only draw. Anything that may read much of a trace answers with a message: the
diff and the loss curves from a child process (:mod:`opguard.tui.background`), searches and the
next difference from a worker thread.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import ClassVar

from textual import work
from textual.app import ComposeResult
from textual.binding import Binding, BindingType
from textual.containers import Horizontal, Vertical
from textual.screen import Screen
from textual.widget import Widget
from textual.widgets import Footer, Static
from textual.worker import get_current_worker

from ...analysis import RankDiff
from ...analysis.browse.rows import RankRows, Side
from ...store import TraceError
from ..background import Comparison
from ..cursor import DebugCursor, Position, Query, Target
from ..detail import Selection, render
from ..messages import DiffReady, Found, LossReady, WorkFailed
from ..session import Session, diff_notices
from ..widgets.agent_panel import AgentPanel, AgentSelection
from ..widgets.detail_pane import DetailPane
from ..widgets.op_list import OpList
from ..widgets.pictures import Pictures
from ..widgets.prompt import Prompt
from ..widgets.run_header import RunHeader, op_position

AgentFactory = Callable[[], Widget]

# Footer groups: related keys share one short label; the help screen lists each key.
_OP = Binding.Group("op", compact=True)
_DIFF = Binding.Group("diff", compact=True)
_STEP = Binding.Group("step", compact=True)
_FRAME = Binding.Group("over/out", compact=True)
_FOLLOW = Binding.Group("follow/back", compact=True)
_SEARCH = Binding.Group("search", compact=True)
_FILTER = Binding.Group("equal/file", compact=True)
_DETAIL = Binding.Group("detail", compact=True)
_INPUTS = Binding.Group("follow input [N] of the detail pane to its producer")


def _key(
    keys: str,
    action: str,
    label: str,
    explanation: str,
    group: Binding.Group | None = None,
    *,
    show: bool = True,
) -> Binding:
    """A binding whose id is its action's name; ``label`` is for the footer, ``explanation``
    (the tooltip) for the help screen, which lists keys without one under their group."""
    ident = action.replace("_", "-").replace("(", "-").replace(")", "").replace("'", "")
    return Binding(keys, action, label, show, tooltip=explanation, id=ident, group=group)


_PROMPTS = {
    "goto": "go to: 123 (op of run A), b123 (op of run B), s4 (step 4)",
    "search": "search: part of an op name, or file.py:LINE",
}


class MainScreen(Screen[None]):
    AUTO_FOCUS = None  # keys belong to the screen's bindings, not to a widget
    BINDINGS: ClassVar[list[BindingType]] = [
        _key("j,down", "next_op", "op", "next op", _OP),
        _key("k,up", "prev_op", "op", "previous op", _OP),
        _key("pagedown", "page(1)", "page", "a page down", show=False),
        _key("pageup", "page(-1)", "page", "a page up", show=False),
        _key("n", "difference(True)", "difference", "next difference", _DIFF),
        _key("p", "difference(False)", "difference", "previous difference", _DIFF),
        _key("d", "first_divergence", "first", "jump to the first divergence"),
        _key("o", "over", "over/out", "step over: next op no deeper in the call stack", _FRAME),
        _key("u", "out", "over/out", "step out: next op shallower in the call stack", _FRAME),
        _key("f", "follow", "follow", "follow the first differing input to its producer", _FOLLOW),
        _key("b,backspace", "back", "back", "back to where the last jump started", _FOLLOW),
        *(_key(str(n), f"follow({n})", "follow", "", _INPUTS, show=False) for n in range(1, 10)),
        _key("g", "ask('goto')", "go to", "go to an op index (123, b123) or a step (s4)"),
        _key("slash", "ask('search')", "search", "search an op name or file.py:LINE", _SEARCH),
        _key("full_stop", "search_again", "search", "search again", _SEARCH),
        _key("e", "hide_equal", "filter", "hide or show equal ops", _FILTER),
        _key("t", "this_file", "filter", "only ops called from this file, or all", _FILTER),
        _key("left_square_bracket", "step(False)", "step", "previous step", _STEP),
        _key("right_square_bracket", "step(True)", "step", "next step", _STEP),
        _key("r", "rank", "rank", "switch rank"),
        _key("J", "scroll_detail(3)", "detail", "scroll the detail pane down", _DETAIL),
        _key("K", "scroll_detail(-3)", "detail", "scroll the detail pane up", _DETAIL),
        _key("a", "agent", "agent", "open or close the agent panel"),
    ]

    def __init__(self, session: Session, agent: AgentFactory | None = None) -> None:
        super().__init__()
        self.session = session
        self._agent = agent
        self.rank = session.ranks[0]
        self._cursors: dict[int, DebugCursor] = {}
        self._diffs: dict[int, RankDiff] = {}
        self._moved_by_user: set[int] = set()  # ranks where the person moved before the diff
        self._failed = ""
        self._query: Query | None = None
        self._comparison: Comparison | None = None
        self.selection: Selection | None = None

    # -- layout ---------------------------------------------------------------------------

    def compose(self) -> ComposeResult:
        yield RunHeader(id="run-header")
        yield Pictures(id="pictures")
        with Horizontal(id="body"):
            with Vertical(id="list-column"):
                yield Static(id="list-header")
                yield OpList(id="op-list")
            yield DetailPane(id="detail")
            yield AgentPanel(id="agent-panel")
        yield Prompt(id="prompt")
        yield Footer()

    def on_mount(self) -> None:
        if self._agent is not None:
            self.query_one(AgentPanel).attach(self._agent())
        self._show_rank(self.rank)

    # -- state ----------------------------------------------------------------------------

    @property
    def rows(self) -> RankRows:
        return self.session.rows(self.rank)

    @property
    def cursor(self) -> DebugCursor:
        return self._cursors[self.rank]

    def _show_rank(self, rank: int) -> None:
        rows = self.session.rows(rank)
        self.workers.cancel_group(self, "find")  # their answers are about the other rank
        self.rank = rank
        self.selection = None
        self._failed = ""
        if rank not in self._cursors:
            self._cursors[rank] = DebugCursor(rows)
            for note in self.session.notices(rank):
                self.notify(note, severity="warning", timeout=10)
        op_list = self.query_one(OpList)
        op_list.show(self.cursor, rows)
        self.query_one("#list-header", Static).update(op_list.header())
        if rank in self._diffs:
            self._apply_diff(self._diffs[rank])
        else:
            self._compare(rank)
        self._refresh()

    def _refresh(self) -> None:
        """Redraws everything that follows the cursor."""
        cursor, rows = self.cursor, self.rows
        self.query_one(OpList).sync()
        position = cursor.position
        step = position.step if position is not None else None
        self.query_one(RunHeader).show(
            self._diffs.get(self.rank),
            self._failed,
            [self.session.state(side, self.rank) for side in Side],
            self.rank,
            self.session.ranks,
            op_position(step, rows.steps, rows.steps_taken),
        )
        self.query_one(Pictures).mark(rows.steps.index(step) if step is not None else None)
        row = cursor.row
        if row is None:
            self.selection = None
            self.query_one(DetailPane).show(lambda: "This rank recorded no ops in either run.")
        elif self.selection is None or self.selection.row != row:
            mark = (
                "first divergence" if rows.is_first(row) else "cause" if rows.is_cause(row) else ""
            )
            traces = (self.session.trace(Side.A, self.rank), self.session.trace(Side.B, self.rank))
            try:
                selection = self.selection = Selection.load(row, traces, mark)
            except TraceError as exc:  # a damaged record: say so where its detail would be
                self.selection = None
                reason = f"This op cannot be read: {exc}"
                self.query_one(DetailPane).show(lambda: reason)
            else:
                self.query_one(DetailPane).show(lambda: render(selection))
        self._tell_agent()

    def _tell_agent(self) -> None:
        row = self.cursor.row
        diff = self._diffs.get(self.rank)
        self.query_one(AgentPanel).selection = AgentSelection(
            self.session.labels[0],
            self.session.labels[1],
            self.rank,
            self.cursor.position.step if self.cursor.position else None,
            row.a.index if row and row.a else None,
            row.b.index if row and row.b else None,
            diff.first if diff else None,
        )

    def _moved(self, moved: bool, otherwise: str) -> None:
        if moved:
            self._moved_by_user.add(self.rank)
            self._refresh()
        elif otherwise:
            self.notify(otherwise, timeout=3)

    # -- background work ------------------------------------------------------------------

    def _compare(self, rank: int) -> None:
        """Starts comparing ``rank`` in a child process (the verdict, per-step counts, then
        the loss curves); a comparison of another rank still running is stopped."""
        if self._comparison is not None:
            self._comparison.stop()
        runs = self.session.runs
        self._comparison = Comparison(runs[0].path, runs[1].path, rank, self.session.tolerance)
        self._relay(self._comparison, rank)

    @work(thread=True, group="compare", exclusive=True, exit_on_error=False)
    def _relay(self, comparison: Comparison, rank: int) -> None:
        """Turns what the child sends into messages (waiting on it holds no GIL)."""
        for kind, payload in comparison.results():
            if kind == "diff":
                self.post_message(DiffReady(rank, payload))
            elif kind == "loss":
                self.post_message(LossReady(rank, payload))
            else:
                self.post_message(WorkFailed("comparing the runs", payload))

    def on_unmount(self) -> None:
        if self._comparison is not None:
            self._comparison.stop()

    @work(thread=True, group="find", exclusive=True, exit_on_error=False)
    def _find(self, what: str, finder: Callable[[], Position | None], jump: bool) -> None:
        worker = get_current_worker()
        try:
            position = finder()
        except Exception as exc:
            self.post_message(WorkFailed(f"finding {what}", f"{type(exc).__name__}: {exc}"))
            return
        if not worker.is_cancelled:
            self.post_message(Found(what, position, jump))

    def on_diff_ready(self, message: DiffReady) -> None:
        self._diffs[message.rank] = message.diff
        if message.rank == self.rank:
            self._apply_diff(message.diff)
            for note in diff_notices(message.diff):
                self.notify(note, severity="warning", timeout=10)
            self._refresh()

    def _apply_diff(self, diff: RankDiff) -> None:
        rows = self.rows
        rows.set_diff(diff)
        self.selection = None  # its mark may change
        self.query_one(OpList).show(self.cursor, rows)
        self.query_one(Pictures).show_diff(rows.steps, diff)
        if self.rank not in self._moved_by_user:
            first = rows.first_divergence()
            if first is not None:
                self.cursor.move_to(self.cursor.locate(*first))
            elif diff.verdict == "within-rounding":
                self.cursor.move_to(self.cursor.find_first_differing())

    def on_loss_ready(self, message: LossReady) -> None:
        if message.rank == self.rank:
            self.query_one(Pictures).show_loss(self.rows.steps, message.series)

    def on_found(self, message: Found) -> None:
        cursor = self.cursor
        moved = (
            cursor.jump_to(message.position) if message.jump else cursor.move_to(message.position)
        )
        self._moved(moved, f"no {message.what} found")

    def on_work_failed(self, message: WorkFailed) -> None:
        if message.what == "comparing the runs":
            self._failed = f"{message.what} failed: {message.error}"
            self._refresh()
        self.notify(f"{message.what} failed: {message.error}", severity="error", timeout=10)

    def on_op_list_clicked(self, message: OpList.Clicked) -> None:
        self._moved(self.cursor.move_to(message.position), "")

    def on_prompt_answered(self, message: Prompt.Answered) -> None:
        if message.kind == "goto":
            target = Target.parse(message.value)
            if target is None:
                self.notify(
                    f"cannot go to {message.value!r}: {_PROMPTS['goto']}", severity="warning"
                )
                return
            self._moved(
                target.apply(self.cursor), f"no {target.kind} {target.number} in rank {self.rank}"
            )
        elif message.kind == "search":
            self._query = Query.parse(message.value)
            self.action_search_again()

    # -- actions --------------------------------------------------------------------------

    def action_next_op(self) -> None:
        self._moved(self.cursor.next_op(), "this is the last op")

    def action_prev_op(self) -> None:
        self._moved(self.cursor.prev_op(), "this is the first op")

    def action_page(self, pages: int) -> None:
        height = max(self.query_one(OpList).size.height - 1, 1)
        self._moved(self.cursor.move_by(pages * height), "no more rows in this step")

    def action_difference(self, forward: bool) -> None:
        what = "next difference" if forward else "previous difference"
        cursor = self.cursor
        self._find(what, lambda: cursor.find_difference(forward), False)

    def action_first_divergence(self) -> None:
        diff = self._diffs.get(self.rank)
        if diff is None:
            self.notify("still comparing the runs: the first divergence is not known yet")
        elif diff.verdict == "within-rounding":
            found = self.cursor.find_first_differing()
            self._moved(self.cursor.jump_to(found), "")
            here = "; here is the first op whose outputs differ" if found else ""
            self.notify(f"no divergence: every difference is within rounding{here}")
        elif diff.first is None and diff.state_first is not None:
            self.notify(
                f"no op-level divergence; the state first differs at step "
                f"{diff.state_first.step} (step-level records)"
            )
        elif diff.first is None:
            self.notify(f"no divergence: rank {self.rank} of both runs computes the same")
        else:
            self._moved(self.cursor.first_divergence(), "the first divergence is not in the list")

    def action_over(self) -> None:
        self._find("op to step over to", self.cursor.find_over, False)

    def action_out(self) -> None:
        self._find("op to step out to", self.cursor.find_out, False)

    def action_follow(self, number: int | None = None) -> None:
        producer = self.selection.follow(number) if self.selection is not None else None
        if producer is None:
            which = f"input [{number}]" if number is not None else "input"
            self.notify(f"no {which} of this op was produced by a recorded op", timeout=3)
            return
        self._moved(
            self.cursor.goto(producer.side, producer.index),
            f"op {producer.index} of run {producer.side.name} is not in the trace",
        )

    def action_back(self) -> None:
        self._moved(self.cursor.back(), "nowhere to go back to")

    def action_ask(self, kind: str) -> None:
        self.query_one(Prompt).ask(kind, _PROMPTS[kind])

    def action_search_again(self) -> None:
        query = self._query
        if query is None:
            self.action_ask("search")
            return
        cursor = self.cursor
        self._find(f"match for {query.text!r}", lambda: cursor.find_match(query), True)

    def action_hide_equal(self) -> None:
        self.cursor.toggle_hide_equal()
        shown = "hidden" if self.cursor.filter.hide_equal else "shown"
        self.notify(f"equal ops {shown}", timeout=2)
        self._refresh()

    def action_this_file(self) -> None:
        self.cursor.toggle_this_file()
        files = self.cursor.filter.files
        names = " / ".join(f.rsplit("/", 1)[-1] for f in files or () if f)
        self.notify(f"only ops called from {names}" if files else "ops from all files", timeout=2)
        self._refresh()

    def action_step(self, forward: bool) -> None:
        self._moved(self.cursor.next_step(forward), "no further step")

    def action_rank(self) -> None:
        ranks = self.session.ranks
        if len(ranks) == 1:
            self.notify(
                f"rank {self.rank} is the only rank both runs recorded: no other rank to switch to"
            )
            return
        rank = ranks[(ranks.index(self.rank) + 1) % len(ranks)]
        try:
            self._show_rank(rank)
        except TraceError as exc:
            self.notify(str(exc), severity="error")

    def action_scroll_detail(self, lines: int) -> None:
        detail = self.query_one(DetailPane)
        detail.scroll_to(y=detail.scroll_y + lines, animate=False)

    def action_agent(self) -> None:
        self.query_one(AgentPanel).toggle()
