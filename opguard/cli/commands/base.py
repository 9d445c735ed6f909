"""Helpers shared by the subcommands."""

from __future__ import annotations

import json
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

# `python -c` puts the working directory first on sys.path, where a source checkout of OpGuard
# would shadow the installed package; a child command still runs in this directory.
CHILD = "import sys; sys.path[:1] = [p for p in sys.path[:1] if p]; from opguard.cli import main; main()"
ERROR_PREFIX = "opguard: error: "


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


@contextmanager
def tool_errors() -> Iterator[None]:
    """A command's one-line errors, raised as the tool's (a tool handler that reuses command
    code)."""
    from ...tools import ToolError

    try:
        yield
    except CommandError as exc:
        raise ToolError(str(exc)) from None


def child_command(argv: list[str]) -> subprocess.CompletedProcess[str]:
    """``opguard ARGV`` in a child process of this interpreter, output captured: how a tool
    runs a command that imports torch or runs a script, so the caller (the MCP server) never
    does and the child's output never mixes with the answer. Its one-line error, if it gave
    one, is raised as the tool's."""
    from ...tools import ToolError

    child = subprocess.run([sys.executable, "-c", CHILD, *argv], capture_output=True, text=True)
    last = child.stderr.rstrip().rsplit("\n", 1)[-1]
    if child.returncode == 2 and last.startswith(ERROR_PREFIX):
        raise ToolError(last.removeprefix(ERROR_PREFIX))
    return child


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
