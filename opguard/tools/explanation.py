"""The ``explain`` answer: the evidence of the first divergence, the offline reading, and with a
model its answer under the budget (the ``opguard.explain/1`` object). The agent is imported only
when it runs, LiteLLM only for a model."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ..distributed.fetch import compared_at_hand
from ..tool_registry import ToolError
from .answers import tolerance_of

if TYPE_CHECKING:
    from ..agent import Agent, Event, Session

SCHEMA = "opguard.explain/1"
SETTING_FLAGS = (
    "model",
    "api_base",
    "api_key",
    "budget",
    "max_tokens",
    "max_output",
    "rounds",
    "input_price",
    "output_price",
)


def explain(args: dict[str, Any]) -> dict[str, Any]:
    """The ``explain`` tool: what ``opguard explain … --json --brief`` prints."""
    flags = {name: args.get(name) for name in SETTING_FLAGS}
    report, _ = explain_report(
        args["run_a"],
        args["run_b"],
        args["rank"],
        args["step"],
        flags,
        args["question"],
        tolerant=args["tolerant"],
        noise=args["noise"],
        ray=args["ray"],
    )
    return brief_report(report)


def explain_report(
    path_a: str,
    path_b: str,
    rank: int | None,
    step: int | None,
    flags: dict[str, Any],
    question: str | None,
    *,
    tolerant: str | None = None,
    noise: str | None = None,
    ray: str | None = None,
    opening: Callable[[Session], None] | None = None,
) -> tuple[dict[str, Any], int]:
    """The ``opguard.explain/1`` report and the exit status. ``tolerant``: ``--tolerant``'s
    value (the diff judges differences against rounding), ``noise`` its control run; ``ray``:
    compared on that Ray cluster, the evidence read from the traces it needs. With
    ``opening`` (the CLI's printing of the bundle or the limits), the conversation is printed
    as it happens too."""
    from ..agent import BudgetRefused, ConfigError, ProviderError, open_session, resolve_settings

    tolerance = tolerance_of(tolerant, noise)
    with compared_at_hand(path_a, path_b, ray=ray, rank=rank, step=step, tolerance=tolerance) as (
        result,
        run_a,
        run_b,
    ):
        try:
            session = open_session(result, run_a, run_b, resolve_settings(flags))
        except ConfigError as exc:
            raise ToolError(str(exc)) from None
        report = _report(session)
        if opening is not None:
            opening(session)
        if session.agent is not None:
            transcript = _Transcript(echo=opening is not None)
            try:
                for event in session.agent.ask(question):
                    transcript.add(event)
            except (BudgetRefused, ProviderError) as exc:
                raise ToolError(str(exc)) from None
            report["agent"] = transcript.finish(session.agent)
    return report, result.exit_status


def brief_report(report: dict[str, Any]) -> dict[str, Any]:
    """The report without the evidence's JSON form: ``evidence_text`` holds the same facts in
    a third of the characters, written for a model to read."""
    return {k: v for k, v in report.items() if k != "evidence"}


def _report(session: Session) -> dict[str, Any]:
    from ..agent import HOW_TO_ENABLE

    return {
        "schema": SCHEMA,
        "verdict": session.result.verdict,
        "evidence": session.evidence.to_json(),
        "evidence_text": session.evidence.text,
        "agent": None,
        "how_to_enable": HOW_TO_ENABLE if session.settings.model is None else None,
    }


class _Transcript:
    """The conversation as it happens: printed line by line when ``echo``, and kept for
    ``--json``."""

    def __init__(self, *, echo: bool) -> None:
        self.echo = echo
        self._mid_line = False
        self.answer: list[str] = []
        self.calls: list[dict[str, Any]] = []
        self.tools: list[dict[str, Any]] = []

    def add(self, event: Event) -> None:
        from ..agent import CallPlanned, CallSettled, TextPiece, ToolAnswered

        if isinstance(event, TextPiece):
            self.answer.append(event.text)
            self._stream(event.text)
        elif isinstance(event, CallPlanned):
            b = event.bound
            self.calls.append(
                {"bound_usd": b.usd, "prompt_tokens": b.prompt_tokens, "max_output": b.max_output}
            )
            self._print(
                f"· call {event.number}: at most ${b.usd:.6f} ({b.prompt_tokens:,} prompt + "
                f"{b.max_output:,} output tokens); left ${event.left_usd:.6f}, "
                f"{event.left_tokens:,} tokens"
            )
        elif isinstance(event, CallSettled):
            c = event.charge
            self.calls[-1].update(
                input_tokens=c.prompt_tokens,
                output_tokens=c.completion_tokens,
                usd=c.usd,
                estimated=c.estimated,
            )
            estimated = " (estimated: the provider reported no usage)" if c.estimated else ""
            self._print(
                f"· call {event.number}: ${c.usd:.6f} ({c.prompt_tokens:,} input + "
                f"{c.completion_tokens:,} output tokens){estimated}"
            )
        elif isinstance(event, ToolAnswered):
            self.tools.append(
                {"name": event.name, "arguments": event.arguments, "tokens": event.result_tokens}
            )
            self._print(f"· tool {event.name} {event.arguments} -> {event.result_tokens:,} tokens")

    def finish(self, agent: Agent) -> dict[str, Any]:
        budget = agent.budget
        self._print(f"· {budget.describe()}")
        return {
            "model": agent.model,
            "pricing": budget.pricing.to_json(),
            "answer": "".join(self.answer),
            "calls": self.calls,
            "tools": self.tools,
            "spent_usd": budget.spent_usd,
            "spent_tokens": budget.spent_tokens,
            "budget_usd": budget.usd,
            "max_tokens": budget.tokens,
        }

    def _stream(self, text: str) -> None:
        """A piece of the answer, as it arrives."""
        if self.echo and text:
            sys.stdout.write(text)
            sys.stdout.flush()
            self._mid_line = not text.endswith("\n")

    def _print(self, line: str) -> None:
        """A line of its own (ending a streamed line first)."""
        if self.echo:
            sys.stdout.write(("\n" if self._mid_line else "") + line + "\n")
            sys.stdout.flush()
            self._mid_line = False
