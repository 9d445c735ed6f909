"""``opguard ops | op | producers | source | kernels … [--json]``: the tools that have no older
command, each a subcommand whose arguments are built from its entry in :mod:`opguard.tools`
(so the command line and the MCP schema cannot disagree)."""

from __future__ import annotations

import argparse
import json

from .base import call_tool, print_json

COMMANDS = ("ops", "op", "producers", "source", "kernels")
PREFIX = "arg_"  # a tool's arguments apart from the command's own (run, tool, json)


def register(sub: argparse._SubParsersAction) -> None:
    from ...tools import BY_NAME

    for name in COMMANDS:
        tool = BY_NAME[name]
        p = sub.add_parser(
            name,
            help=_summary(tool.purpose),
            description=f"{tool.purpose} Prints JSON: indented, or on one line with --json.",
        )
        for param in tool.all_params:
            param.add_to(p, PREFIX + param.name)
        p.add_argument("--json", action="store_true", help="one line of JSON (default: indented)")
        p.set_defaults(run=run, tool=name)


def _summary(purpose: str) -> str:
    """A tool's purpose as one entry of the command list: its first clause, lower-cased
    as the list's other entries are (unless it starts with an acronym, "GPU")."""
    clause = purpose.rstrip(".")
    for end in (": ", " ("):
        clause = clause.split(end, 1)[0]
    return clause if clause[1:2].isupper() else clause[0].lower() + clause[1:]


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
