"""``opguard mcp``: serve the tools of ``opguard tools`` to a coding agent over MCP (stdio).

Register it with the agent as a stdio server whose command is ``opguard mcp`` (see docs/CODING_AGENTS.md).
"""

from __future__ import annotations

import argparse

from .base import CommandError


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "mcp",
        help="serve the tools to a coding agent over MCP (stdio)",
        description="Serves every tool that opguard tools lists over the Model Context Protocol "
        "on stdin/stdout until the client disconnects. Needs the mcp package (pip install mcp, or tools/install.sh mcp).",
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from ...tools.server import serve

    try:
        serve()
    except ImportError as exc:
        raise CommandError(str(exc)) from None
    return 0
