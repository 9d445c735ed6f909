"""``opguard ops | op | producers | source | kernels … [--json]``: the tools that have no older
command, each a subcommand whose arguments are built from its entry in :mod:`opguard.tools`
(so the command line and the MCP schema cannot disagree)."""

from __future__ import annotations

import argparse
import json
from typing import Any

from .base import call_tool, print_json

COMMANDS = ("ops", "op", "producers", "source", "kernels")
PREFIX = "arg_"  # a tool's arguments apart from the command's own (run, tool, json)
_TYPES: dict[str, Any] = {"integer": int, "number": float, "string": str}


def register(sub: argparse._SubParsersAction) -> None:
    from ...tools import BY_NAME

    for name in COMMANDS:
        tool = BY_NAME[name]
        p = sub.add_parser(
            name,
            help=tool.purpose[0].lower() + tool.purpose[1:].rstrip("."),
            description=f"{tool.purpose} Usage: {tool.usage()}",
        )
        for param in tool.all_params:
            dest = PREFIX + param.name
            if param.flag is None:
                p.add_argument(dest, metavar=param.name.upper(), type=_TYPES[param.kind])
            elif param.kind == "boolean":
                p.add_argument(param.flag, dest=dest, action="store_true", help=param.help)
            else:
                p.add_argument(
                    param.flag,
                    dest=dest,
                    metavar=param.name.upper(),
                    type=_TYPES[param.kind],
                    choices=param.choices or None,
                    help=param.help,
                )
        p.add_argument("--json", action="store_true", help="one line of JSON (default: indented)")
        p.set_defaults(run=run, tool=name)


def run(args: argparse.Namespace) -> int:
    from ...tools import BY_NAME

    tool = BY_NAME[args.tool]
    given = {p.name: getattr(args, PREFIX + p.name) for p in tool.all_params}
    answer = call_tool(tool.name, given)
    if args.json:
        print_json(answer)
    else:
        print(json.dumps(answer, indent=2, default=str))
    return 0
