"""The agent's chat for the TUI: a question box about the selected op or the divergence, the
answer streaming in as Markdown, and a budget meter (spent, bound of the next call, cap).

The widget opens its :class:`~opguard.agent.session.Session` in a worker thread (diffing takes
seconds on large traces, and with a model LiteLLM alone takes seconds to import), so mounting it
never blocks the debugger. Refusals and provider errors are shown in the panel, and the question stays
in the box to be asked again. It depends on the debugger only through :class:`Selected`: when
its parent has a ``selection`` reactive of that shape (the TUI's agent panel does), questions
follow the op under the cursor.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Callable
from typing import ClassVar, Protocol

from textual import work
from textual.app import ComposeResult
from textual.containers import Vertical, VerticalScroll
from textual.message import Message
from textual.widgets import Checkbox, Input, Markdown, Static

from ..analysis import diff_runs
from ..analysis.tolerant.rule import Tolerance
from ..store import Run, TraceError
from .budget import Bound, Budget, BudgetRefused
from .config import AgentSettings, ConfigError, resolve_settings
from .conversation import CallPlanned, CallSettled, Event, TextPiece, ToolAnswered
from .llm import Completion, ProviderError
from .session import HOW_TO_ENABLE, Session, open_session
from .tools import OpFocus

# What Markdown reads as markup in plain text: emphasis (``__init__``), HTML (``<module>``),
# links, entities, strikethrough; each is shown as itself when escaped with a backslash.
_MARKUP = re.compile(r"([\\*_<>\[\]&~])")


def as_markdown(text: str) -> str:
    """Plain text with `code` in backticks (the reading, a question) as Markdown that shows
    it as written: a call site's ``<module>`` or ``__init__`` is not markup. Code spans are
    kept (Markdown shows them literally)."""
    parts = text.split("`")
    for at in range(0, len(parts), 2):  # outside the code spans
        parts[at] = _MARKUP.sub(r"\\\1", parts[at])
    return "`".join(parts)


class Selected(Protocol):
    """What the chat needs of the debugger's selection (the TUI's ``AgentSelection``)."""

    rank: int
    op_a: int | None
    op_b: int | None


class AgentChat(Vertical):
    DEFAULT_CSS: ClassVar[str] = """
    AgentChat { height: 1fr; }
    AgentChat #agent-status { color: $text-muted; }
    AgentChat #agent-scroll { height: 1fr; }
    AgentChat #agent-error { color: $error; display: none; }
    AgentChat #agent-error.-shown { display: block; }
    AgentChat #agent-meter { color: $text-muted; }
    """

    def __init__(self, opener: Callable[[], Session], *, id: str | None = None) -> None:
        """``opener`` builds the session; it runs in a worker thread once mounted."""
        super().__init__(id=id)
        self.opener = opener
        self.session: Session | None = None
        self.focus_op: OpFocus | None = None
        self._bound: Bound | None = None

    @classmethod
    def for_runs(
        cls,
        run_a: Run,
        run_b: Run,
        *,
        tolerance: Tolerance | None = None,
        settings: AgentSettings | None = None,
        complete: Completion | None = None,
    ) -> AgentChat:
        """The chat about two opened runs, with settings from the environment and the config
        file unless given; ``tolerance`` (``opguard tui --tolerant``): about the difference
        beyond rounding, as the debugger shows it, not the first bitwise one."""

        def opener() -> Session:
            chosen = settings if settings is not None else resolve_settings({})
            result = diff_runs(run_a, run_b, tolerance=tolerance)
            return open_session(result, run_a, run_b, chosen, complete)

        return cls(opener)

    def compose(self) -> ComposeResult:
        # Plain text: messages quote code and errors ("[redacted]"), never Rich markup.
        yield Static("Agent: preparing the evidence…", id="agent-status", markup=False)
        with VerticalScroll(id="agent-scroll"):
            yield Markdown(id="agent-answer")
        yield Static(id="agent-error", markup=False)
        yield Static(id="agent-meter", markup=False)
        yield Checkbox("about the selected op", value=True, id="agent-about-op")
        yield Input(placeholder="Ask about the divergence", id="agent-question", disabled=True)

    def on_mount(self) -> None:
        parent = self.parent
        if parent is not None and hasattr(parent, "selection"):
            self.watch(parent, "selection", self.select)
        self._open()

    def select(self, selection: Selected | None) -> None:
        """Questions go about this op (A's when the row has one) while the box is ticked."""
        if selection is None or (selection.op_a is None and selection.op_b is None):
            self.focus_op = None
        elif selection.op_a is not None:
            self.focus_op = OpFocus("a", selection.op_a, selection.rank)
        else:
            assert selection.op_b is not None
            self.focus_op = OpFocus("b", selection.op_b, selection.rank)
        self._update_placeholder()

    # -- opening ----------------------------------------------------------------------------

    class Opened(Message):
        bubble = False

        def __init__(self, session: Session) -> None:
            super().__init__()
            self.session = session

    class OpenFailed(Message):
        bubble = False

        def __init__(self, reason: str) -> None:
            super().__init__()
            self.reason = reason

    @work(thread=True, group="agent-open", exclusive=True, exit_on_error=False)
    def _open(self) -> None:
        try:
            self.post_message(self.Opened(self.opener()))
        except (ConfigError, TraceError) as exc:
            self.post_message(self.OpenFailed(str(exc)))

    def on_agent_chat_open_failed(self, message: OpenFailed) -> None:
        self.query_one("#agent-status", Static).update("Agent: unavailable")
        self._show_error(message.reason)

    async def on_agent_chat_opened(self, message: Opened) -> None:
        session = self.session = message.session
        evidence, agent = session.evidence, session.agent
        status = self.query_one("#agent-status", Static)
        if agent is None:
            reading = "\n".join(f"- {as_markdown(line)}" for line in session.reading)
            why = (
                "The runs are identical: nothing to explain."
                if not session.result.diverged
                else HOW_TO_ENABLE
            )
            status.update(f"Agent: offline reading (evidence: {evidence.size()})")
            await self.query_one("#agent-answer", Markdown).update(f"{reading}\n\n{why}")
            return
        status.update(f"Agent: {agent.model}; evidence {evidence.tokens:,} tokens")
        self._update_meter(agent.budget)
        self.query_one("#agent-question", Input).disabled = False
        self._update_placeholder()

    # -- asking -----------------------------------------------------------------------------

    def on_input_submitted(self, event: Input.Submitted) -> None:
        question = event.value.strip()
        if question and self.session is not None and self.session.agent is not None:
            self._ask(question, self._focus())

    def on_checkbox_changed(self, event: Checkbox.Changed) -> None:
        self._update_placeholder()

    def _focus(self) -> OpFocus | None:
        return self.focus_op if self.query_one("#agent-about-op", Checkbox).value else None

    @work(group="agent-ask", exclusive=True, exit_on_error=False)
    async def _ask(self, question: str, focus: OpFocus | None) -> None:
        """Streams the answer in; a refusal or a provider error is shown, the question kept."""
        assert self.session is not None and self.session.agent is not None
        agent = self.session.agent
        box = self.query_one("#agent-question", Input)
        box.disabled = True
        self._show_error("")
        self.query_one("#agent-scroll", VerticalScroll).anchor()
        stream = Markdown.get_stream(self.query_one("#agent-answer", Markdown))
        events = agent.ask(question, focus=focus)
        heading = f"\n\n**{as_markdown(question)}**\n\n"  # written with the answer's first piece
        try:
            while (event := await asyncio.to_thread(next, events, None)) is not None:
                if isinstance(event, TextPiece):
                    await stream.write(heading + event.text)
                    heading = ""
                else:
                    self._note(event, agent.budget)
        except (BudgetRefused, ProviderError, TraceError) as exc:
            self._show_error(str(exc))
        else:
            box.value = ""
        finally:
            await stream.stop()
            box.disabled = False
            self._bound = None
            self._update_meter(agent.budget)

    def _note(self, event: Event, budget: Budget) -> None:
        """A call planned (its bound joins the meter), settled, or a tool answered."""
        if isinstance(event, CallPlanned):
            self._bound = event.bound
        elif isinstance(event, CallSettled):
            self._bound = None
        elif isinstance(event, ToolAnswered):
            self.query_one("#agent-status", Static).update(
                f"Agent: looked up {event.name} ({event.result_tokens:,} tokens)"
            )
        self._update_meter(budget)

    # -- drawing ----------------------------------------------------------------------------

    def _update_meter(self, budget: Budget) -> None:
        bound = f"this call ≤ ${self._bound.usd:.6f}" if self._bound else "no call running"
        self.query_one("#agent-meter", Static).update(
            f"${budget.spent_usd:.6f} spent · {bound} · cap ${budget.usd:g} · "
            f"{budget.spent_tokens:,}/{budget.tokens:,} tokens"
        )

    def _update_placeholder(self) -> None:
        focus = self._focus()
        about = f"op #{focus.index} of run {focus.run.upper()}" if focus else "the divergence"
        self.query_one("#agent-question", Input).placeholder = f"Ask about {about}"

    def _show_error(self, message: str) -> None:
        error = self.query_one("#agent-error", Static)
        error.update(message)
        error.set_class(bool(message), "-shown")
