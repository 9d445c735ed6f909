"""``opguard tui RUN_A RUN_B``: step through two aligned runs in the terminal, like a debugger.

Both runs are opened (and any that cannot be read reported as one line, exit status 2) before
Textual is imported, so bad input never meets a half-started UI.
"""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

from .base import RAY, TOLERANT, add_ray, add_tolerant, tolerance_of

if TYPE_CHECKING:
    from ...tui.session import Session


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
    add_ray(parser)


def arguments(args: argparse.Namespace) -> list[str]:
    """The command line of ``opguard tui`` that shows what ``args`` asks for (``opguard
    serve`` runs it for each page)."""
    tolerant = [] if args.tolerant is None else [f"{TOLERANT}={args.tolerant}"]
    ray = [] if args.ray is None else [f"{RAY}={args.ray}"]
    return ["tui", args.run_a, args.run_b, *tolerant, *ray]


def run(args: argparse.Namespace) -> int:
    with _session(args) as session:
        from ...agent.panel import AgentChat
        from ...tui.app import OpguardApp

        OpguardApp(
            session, agent=lambda: AgentChat.for_runs(*session.runs, tolerance=session.tolerance)
        ).run()
    return 0


@contextmanager
def _session(args: argparse.Namespace) -> Iterator[Session]:
    """Both runs opened for the debugger; with ``--ray``, compared on that cluster first and
    opened on the traces of the ranks the divergence names (read in place, or fetched)."""
    from ...tui.session import Session

    tolerance = tolerance_of(args)
    if args.ray is None:
        session = Session.open(args.run_a, args.run_b, tolerance)
        try:
            yield session
        finally:
            session.close()
        return
    from ...distributed.fetch import compared_at_hand

    with compared_at_hand(args.run_a, args.run_b, ray=args.ray, tolerance=tolerance) as found:
        _, run_a, run_b = found
        session = Session(run_a, run_b, (args.run_a, args.run_b), tolerance)
        session.rows(session.ranks[0])
        yield session
