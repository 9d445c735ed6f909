"""Helpers shared by the subcommands."""

from __future__ import annotations

import argparse
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


def directory_name(text: str) -> str:
    """An argparse type for a directory to write: an empty name is refused, not read as the
    working directory (which is what a path made of it would mean)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty name is not a directory")
    return text


def print_json(obj: Any) -> None:
    json.dump(obj, sys.stdout, separators=(",", ":"), default=str)
    sys.stdout.write("\n")


def parse_range(text: str) -> tuple[int, int | None]:
    """``START:END`` (END exclusive, either side optional) or a single index, as ``--ops``
    takes it: indices from 0, END past START."""
    try:
        if ":" in text:
            start_text, _, end_text = text.partition(":")
            start, end = int(start_text or 0), int(end_text) if end_text else None
        else:
            start = int(text)
            end = start + 1
    except ValueError:
        raise CommandError(f"--ops takes START:END or an index, not {text!r}") from None
    if start < 0 or (end is not None and end < 0):
        raise CommandError(f"--ops takes op indices from 0, not {text!r}")
    if end is not None and end <= start:
        raise CommandError(f"--ops {text}: END must be past START (END is exclusive)")
    return start, end
