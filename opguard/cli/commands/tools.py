"""``opguard tools [--json]``: the tools for coding agents, written to be read once."""

from __future__ import annotations

import argparse

from .base import print_json


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "tools",
        help="list the tools for coding agents (CLI --json and MCP)",
        description="Lists the tools for coding agents, with their purpose and usage: each is "
        "also an opguard command with --json, and an MCP tool (opguard mcp).",
    )
    p.add_argument("--json", action="store_true", help="name, purpose, usage, input schema")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from ...tools import GUIDE, MAX_CHARS, TOOLS

    if args.json:
        print_json(
            {
                "tools": [
                    {
                        "name": t.name,
                        "purpose": t.purpose,
                        "usage": t.usage(),
                        "input_schema": t.input_schema(),
                    }
                    for t in TOOLS
                ],
                "max_chars": MAX_CHARS,
            }
        )
        return 0
    print(GUIDE)
    for tool in TOOLS:
        print(f"{tool.name:<10} {tool.purpose}\n{'':<10} {tool.usage()}")
    return 0
