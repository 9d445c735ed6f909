"""``opguard explain RUN_A RUN_B [--model M] [--budget USD] [--max-tokens N] [--api-base URL]
[--json]``: the first divergence explained, by an LLM under a budget or offline by rule.

Exit status as for ``diff``: 0 identical, 1 diverged, 2 error (a call the budget refused is an
error: it was not sent).
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from ...analysis import diff_runs
from ...spending_limits import (
    DEFAULT_BUDGET_USD,
    DEFAULT_MAX_OUTPUT,
    DEFAULT_MAX_TOKENS,
    DEFAULT_ROUNDS,
)
from ...store import Run
from .base import CommandError, print_json, tool_errors

if TYPE_CHECKING:  # the agent is imported only when explain runs, LiteLLM only for a model
    from ...agent import Agent, Event, Session

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


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "explain",
        help="explain the first divergence (an LLM under a budget, or offline rules)",
        description="Builds the evidence bundle of the first divergence and asks a model "
        "(any LiteLLM model string) to explain it, refusing any call whose worst-case cost "
        "does not fit the budget. Without a model: the bundle and the rule-based reading. "
        "Exit status: 0 identical, 1 diverged, 2 error.",
    )
    p.add_argument("run_a", metavar="RUN_A")
    p.add_argument("run_b", metavar="RUN_B")
    p.add_argument("--rank", type=int, help="compare only this rank")
    p.add_argument("--step", type=int, help="compare only this step")
    p.add_argument(
        "--model",
        metavar="M",
        help="LiteLLM model, e.g. groq/openai/gpt-oss-20b (default: $OPGUARD_MODEL, the config "
        "file, else none: the offline reading)",
    )
    p.add_argument(
        "--api-base",
        metavar="URL",
        help="an OpenAI-compatible server's base URL (default: $OPGUARD_API_BASE)",
    )
    p.add_argument(
        "--api-key",
        metavar="KEY",
        help="API key (visible to other users in the process list: prefer the provider's "
        "environment variable or the config file)",
    )
    # Flags left unset fall back to the environment and the config file (opguard.agent.config);
    # these defaults come last. The limits in force are printed before the first call.
    p.add_argument(
        "--budget",
        metavar="USD",
        help=f"most the session may spend (default: {DEFAULT_BUDGET_USD})",
    )
    p.add_argument(
        "--max-tokens",
        metavar="N",
        help=f"most prompt + output tokens in the session (default: {DEFAULT_MAX_TOKENS})",
    )
    p.add_argument(
        "--max-output",
        metavar="N",
        help=f"most output tokens of one call (default: {DEFAULT_MAX_OUTPUT})",
    )
    p.add_argument(
        "--rounds",
        metavar="N",
        help=f"most rounds of follow-up tool calls (default: {DEFAULT_ROUNDS})",
    )
    p.add_argument(
        "--input-price",
        metavar="USD",
        help="USD per million input tokens (default: LiteLLM's price for the model)",
    )
    p.add_argument(
        "--output-price",
        metavar="USD",
        help="USD per million output tokens (default: LiteLLM's price for the model)",
    )
    p.add_argument(
        "-q",
        "--question",
        help="ask this (default: what caused the first divergence, what to change or check)",
    )
    p.add_argument("--json", action="store_true", help="print one opguard.explain/1 object")
    p.add_argument(
        "--brief",
        action="store_true",
        help="with --json: leave out the evidence's JSON form (evidence_text has the same facts)",
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    flags = {name: getattr(args, name) for name in SETTING_FLAGS}
    report, code = _explain(
        args.run_a, args.run_b, args.rank, args.step, flags, args.question, echo=not args.json
    )
    if args.json:
        print_json(_brief(report) if args.brief else report)
    return code


def answer(args: dict[str, Any]) -> dict[str, Any]:
    """The ``explain`` tool: what ``opguard explain … --json --brief`` prints."""
    flags = {name: args.get(name) for name in SETTING_FLAGS}
    with tool_errors():
        report, _ = _explain(
            args["run_a"], args["run_b"], args["rank"], args["step"], flags, args["question"]
        )
    return _brief(report)


def _explain(
    path_a: str,
    path_b: str,
    rank: int | None,
    step: int | None,
    flags: dict[str, Any],
    question: str | None,
    *,
    echo: bool = False,
) -> tuple[dict[str, Any], int]:
    """The ``opguard.explain/1`` report and the exit status; ``echo`` prints the opening and
    the conversation as they happen."""
    from ...agent import BudgetRefused, ConfigError, ProviderError, open_session, resolve_settings

    with Run(path_a) as run_a, Run(path_b) as run_b:
        result = diff_runs(run_a, run_b, rank=rank, step=step)
        try:
            session = open_session(result, run_a, run_b, resolve_settings(flags))
        except ConfigError as exc:
            raise CommandError(str(exc)) from None
        report = _report(session)
        if echo:
            _print_opening(session)
        if session.agent is not None:
            transcript = _Transcript(echo=echo)
            try:
                for event in session.agent.ask(question):
                    transcript.add(event)
            except (BudgetRefused, ProviderError) as exc:
                raise CommandError(str(exc)) from None
            report["agent"] = transcript.finish(session.agent)
    return report, 1 if result.diverged else 0


def _brief(report: dict[str, Any]) -> dict[str, Any]:
    """The report without the evidence's JSON form: ``evidence_text`` holds the same facts in
    a third of the characters, written for a model to read."""
    return {k: v for k, v in report.items() if k != "evidence"}


def _report(session: Session) -> dict[str, Any]:
    from ...agent import HOW_TO_ENABLE

    return {
        "schema": SCHEMA,
        "verdict": session.result.verdict,
        "evidence": session.evidence.to_json(),
        "evidence_text": session.evidence.text,
        "agent": None,
        "how_to_enable": HOW_TO_ENABLE if session.settings.model is None else None,
    }


def _print_opening(session: Session) -> None:
    """With an agent: the bundle's size, model, prices and budget. Without: the bundle itself
    (its last section is the rule-based reading) and why no model was asked."""
    from ...agent import HOW_TO_ENABLE

    evidence, agent = session.evidence, session.agent
    if agent is not None:
        budget = agent.budget
        print(
            f"evidence: {evidence.tokens:,} tokens; asking {agent.model} at "
            f"{budget.pricing.describe()}; budget ${budget.usd:g}, {budget.tokens:,} tokens"
        )
        return
    print(evidence.text)
    print(f"evidence: {evidence.size()}")
    if not session.result.diverged:
        print("The runs are identical: nothing to explain, no model asked.")
    else:
        print(
            f"No model configured: the reading above is OpGuard's offline answer.\n{HOW_TO_ENABLE}"
        )


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
        from ...agent import CallPlanned, CallSettled, TextPiece, ToolAnswered

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
