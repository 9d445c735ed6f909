"""``opguard tui RUN_A RUN_B``: step through two aligned runs in the terminal, like a debugger.

Both runs are opened (and any that cannot be read reported as one line, exit status 2) before
Textual is imported, so bad input never meets a half-started UI.
"""

from __future__ import annotations

import argparse

from .base import TOLERANT, add_tolerant, tolerance_of


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "tui",
        help="step through two aligned runs in the terminal, like a debugger",
        description="Opens two recorded runs side by side at their first divergence. "
        "Press ? in the debugger for its keys.",
    )
    add_arguments(p)
    p.set_defaults(run=run)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The runs and options of the debugger (``opguard serve`` takes them too)."""
    parser.add_argument("run_a", metavar="RUN_A")
    parser.add_argument("run_b", metavar="RUN_B")
    add_tolerant(parser)


def arguments(args: argparse.Namespace) -> list[str]:
    """The command line of ``opguard tui`` that shows what ``args`` asks for (``opguard
    serve`` runs it for each page)."""
    tolerant = [] if args.tolerant is None else [f"{TOLERANT}={args.tolerant}"]
    return ["tui", args.run_a, args.run_b, *tolerant]


def run(args: argparse.Namespace) -> int:
    from ...tui.session import Session

    session = Session.open(args.run_a, args.run_b, tolerance_of(args))
    try:
        from ...agent.panel import AgentChat
        from ...tui.app import OpguardApp

        OpguardApp(
            session, agent=lambda: AgentChat.for_runs(*session.runs, tolerance=session.tolerance)
        ).run()
    finally:
        session.close()
    return 0
