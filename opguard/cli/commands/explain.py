"""``opguard explain RUN_A RUN_B [--model M] [--budget USD] [--max-tokens N] [--api-base URL]
[--json]``: the first divergence explained, by an LLM under a budget or offline by rule.

Exit status as for ``diff``: 0 identical, 1 diverged, 2 error, 3 incomplete (a call the budget
refused is an error: it was not sent).
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from ...spending_limits import (
    DEFAULT_BUDGET_USD,
    DEFAULT_MAX_OUTPUT,
    DEFAULT_MAX_TOKENS,
    DEFAULT_ROUNDS,
)
from ...tools.explanation import SETTING_FLAGS, brief_report, explain_report
from .base import add_ray, add_tolerant, print_json

if TYPE_CHECKING:  # the agent is imported only when explain runs, LiteLLM only for a model
    from ...agent import Session


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "explain",
        help="explain the first divergence (an LLM under a budget, or offline rules)",
        description="Builds the evidence bundle of the first divergence and asks a model "
        "(any LiteLLM model string) to explain it, refusing any call whose worst-case cost "
        "does not fit the budget. Without a model: the bundle and the rule-based reading. "
        "Exit status: 0 identical, 1 diverged, 2 error, 3 incomplete (part of a run unreadable).",
    )
    p.add_argument("run_a", metavar="RUN_A")
    p.add_argument("run_b", metavar="RUN_B")
    p.add_argument("--rank", type=int, help="compare only this rank")
    p.add_argument("--step", type=int, help="compare only this step")
    add_tolerant(p)
    add_ray(p)
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
    report, code = explain_report(
        args.run_a,
        args.run_b,
        args.rank,
        args.step,
        flags,
        args.question,
        tolerant=args.tolerant,
        noise=args.noise,
        ray=args.ray,
        opening=None if args.json else _print_opening,
    )
    if args.json:
        print_json(brief_report(report) if args.brief else report)
    return code


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
        scope = session.result.scope()
        how = {"identical": "identical", "within-rounding": "within rounding"}.get(
            session.result.verdict, "identical as far as they could be read"
        )
        print(
            f"The runs are {how}{f' ({scope})' if scope else ''}: nothing to explain, no model asked."
        )
    else:
        print(
            f"No model configured: the reading above is OpGuard's offline answer.\n{HOW_TO_ENABLE}"
        )
