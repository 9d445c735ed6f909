"""Helpers shared by the subcommands."""

from __future__ import annotations

import json
import sys
from typing import Any


class CommandError(Exception):
    """A command cannot run with the input it was given (one line, exit status 2)."""


def call_tool(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """The answer of tool ``name`` (:mod:`opguard.tools`, imported only now); its errors are
    the command's."""
    from ...tools import BY_NAME, ToolError

    try:
        return BY_NAME[name].call(arguments)
    except ToolError as exc:
        raise CommandError(str(exc)) from None


def print_json(obj: Any) -> None:
    json.dump(obj, sys.stdout, separators=(",", ":"), default=str)
    sys.stdout.write("\n")


def parse_range(text: str) -> tuple[int, int | None]:
    """``START:END`` (END exclusive, either side optional) or a single index."""
    try:
        if ":" in text:
            start, _, end = text.partition(":")
            return int(start or 0), int(end) if end else None
        index = int(text)
        return index, index + 1
    except ValueError:
        raise CommandError(f"--ops takes START:END or an index, not {text!r}") from None
