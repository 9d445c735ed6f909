"""The conversation with the model: the evidence and a question go in, an answer streams out,
and every call is bounded, admitted and charged by the session's :class:`Budget`.

:meth:`Agent.ask` is a generator of events (a call planned with its bound, text pieces, tool
answers, a call settled with its cost), so the CLI prints them and the TUI panel draws them from
the same loop. The model may ask for more through the follow-up tools for a bounded number of
rounds; the last call offers no tools, so it has to answer.
"""

from __future__ import annotations

from collections.abc import Generator, Iterator
from dataclasses import dataclass
from typing import Any

from .budget import Bound, Budget, Charge
from .config import AgentSettings
from .evidence import Evidence
from .llm import (
    Completion,
    ProviderError,
    Reply,
    Request,
    assistant_message,
    count_tokens,
    tool_arguments,
)
from .tools import TOOLS, OpFocus, TraceTools

SYSTEM = """\
You explain why two recordings of a PyTorch training run, A and B, stopped computing the same \
thing. OpGuard recorded every op of both with bitwise fingerprints, aligned them and found the \
first divergence; the evidence it gives you is all it found. Name the most likely cause in the \
user's code or environment, the line to change or check, and how sure you are. Ground every \
claim in the evidence. Use the tools (op indices are the #N of the evidence) only when the \
evidence does not settle the question. Answer in a few short paragraphs of Markdown."""
DEFAULT_QUESTION = "What caused the first divergence, and what should I change or check?"


@dataclass(frozen=True, slots=True)
class CallPlanned:
    """Shown before a call is sent: its bound and what is left of the budget."""

    number: int
    bound: Bound
    left_usd: float
    left_tokens: int


@dataclass(frozen=True, slots=True)
class TextPiece:
    text: str


@dataclass(frozen=True, slots=True)
class ToolAnswered:
    name: str
    arguments: str
    result_tokens: int


@dataclass(frozen=True, slots=True)
class CallSettled:
    number: int
    charge: Charge


Event = CallPlanned | TextPiece | ToolAnswered | CallSettled


class Agent:
    def __init__(
        self,
        evidence: Evidence,
        settings: AgentSettings,
        budget: Budget,
        tools: TraceTools,
        complete: Completion,
    ) -> None:
        assert settings.model is not None
        self.model = settings.model
        self.settings = settings
        self.evidence = evidence
        self.budget = budget
        self.tools = tools
        self.complete = complete
        self.messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]

    def ask(self, question: str | None = None, *, focus: OpFocus | None = None) -> Iterator[Event]:
        """Asks ``question`` (the default: explain the divergence), about op ``focus`` when
        given. Raises BudgetRefused before a call that might not fit (it is not sent) and
        ProviderError when a call fails; either way the conversation is left as it was before
        the question, so it can be asked again."""
        start = len(self.messages)
        self.messages.append({"role": "user", "content": self._content(question, focus)})
        try:
            yield from self._converse()
        except BaseException:
            del self.messages[start:]
            raise

    def _content(self, question: str | None, focus: OpFocus | None) -> str:
        parts = []
        if len(self.messages) == 1:  # the first question carries the evidence
            parts.append(f"Evidence:\n{self.evidence.text}")
        if focus is not None:
            parts.append(f"The question is about this op:\n{self.tools.describe(focus)}")
        parts.append(f"Question: {question or DEFAULT_QUESTION}")
        return "\n\n".join(parts)

    def _converse(self) -> Iterator[Event]:
        for round_ in range(self.settings.rounds + 1):
            tools = TOOLS if round_ < self.settings.rounds else None
            prompt = count_tokens(self.model, messages=self.messages, tools=tools)
            bound = self.budget.bound(prompt, self.settings.max_output)
            number = len(self.budget.charges) + 1
            yield CallPlanned(number, bound, self.budget.left_usd, self.budget.left_tokens)
            self.budget.admit(bound)
            reply = yield from self._call(tools)
            yield CallSettled(number, self._charge(prompt, reply))
            if tools is None or not reply.tool_calls:
                self.messages.append(assistant_message(Reply(reply.text)))
                return
            self.messages.append(assistant_message(reply))
            for call in reply.tool_calls:
                result = self.tools.call(call.name, tool_arguments(call))
                self.messages.append({"role": "tool", "tool_call_id": call.id, "content": result})
                yield ToolAnswered(call.name, call.arguments, count_tokens(self.model, text=result))

    def _call(self, tools: list[dict[str, Any]] | None) -> Generator[Event, None, Reply]:
        request = Request(
            model=self.model,
            messages=list(self.messages),
            tools=tools,
            max_output=self.settings.max_output,
            api_base=self.settings.api_base,
            api_key=self.settings.api_key,
        )
        reply = None
        for item in self.complete(request):
            if isinstance(item, Reply):
                reply = item
            else:
                yield TextPiece(item)
        if reply is None:
            raise ProviderError("the provider's answer ended without a reply")
        return reply

    def _charge(self, prompt: int, reply: Reply) -> Charge:
        """The provider's usage; counted here (and marked estimated) when it reported none."""
        if reply.usage is not None:
            usage = reply.usage
            return self.budget.charge(usage.prompt_tokens, usage.completion_tokens, estimated=False)
        written = reply.text + "".join(c.name + c.arguments for c in reply.tool_calls)
        return self.budget.charge(prompt, count_tokens(self.model, text=written), estimated=True)
