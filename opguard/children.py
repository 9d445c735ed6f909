"""``opguard`` commands run in child processes (a tool that imports torch or runs a script, a
hunt's recordings), and the one line a command says when it refuses its input.

Torch-free and below every front end, so the tools, the hunt and the CLI share one prefix and
one way to start a child, and none of them imports another's code to do it."""

from __future__ import annotations

import subprocess
import sys

ERROR_PREFIX = "opguard: error: "  # how every command starts its one-line error (exit status 2)
# `python -c` puts the working directory first on sys.path, where a source checkout of OpGuard
# would shadow the installed package; the child still runs in this directory.
CHILD = (
    "import runpy, sys; sys.path[:1] = [p for p in sys.path[:1] if p]; "
    "runpy.run_module('opguard', run_name='__main__')"
)


class Refused(Exception):
    """The child command refused its input: its one line, without the prefix."""


def run_opguard(argv: list[str]) -> subprocess.CompletedProcess[str]:
    """``opguard ARGV`` in a child process of this interpreter, its output captured (so it never
    mixes with the caller's); :class:`Refused` when it refused its input."""
    child = subprocess.run([sys.executable, "-c", CHILD, *argv], capture_output=True, text=True)
    said = refusal(child.returncode, child.stderr)
    if said is not None:
        raise Refused(said)
    return child


def refusal(code: int, output: str) -> str | None:
    """The one-line error of a command that refused its input (exit status 2, the prefix on
    its last line), without the prefix; None for anything else."""
    last = output.rstrip().rsplit("\n", 1)[-1]
    return last.removeprefix(ERROR_PREFIX) if code == 2 and last.startswith(ERROR_PREFIX) else None
