"""Answers that record: ``record`` (``opguard record`` in a child process, then the run as
``show`` summarises it) and ``hunt`` (the two passes of :mod:`opguard.hunt`). The recordings'
output never mixes with the answer, and the caller never imports torch."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..children import run_opguard
from ..hunt import Hunt, HuntError
from ..hunt import hunt as run_passes
from ..tool_registry import ToolError
from .answers import tolerance_of
from .runs import show

RECORD_SCHEMA = "opguard.record/1"
OUTPUT_TAIL = 20  # last lines of the script's stdout and stderr in the JSON answer
LINE_CHARS = 300


def record(args: dict[str, Any]) -> dict[str, Any]:
    """The ``record`` tool: ``opguard record`` in a child process whose output is captured,
    then the run's ops and steps per rank as ``opguard show`` counts them."""
    from .catalog import BY_NAME

    if not args["script"] and not args["module"]:
        raise ToolError("record needs a script (or a module)")
    child = run_opguard(BY_NAME["record"].argv(args, json=False))
    summary = show({"run": args["output"], "rank": None})
    return {
        "schema": RECORD_SCHEMA,
        "run": str(Path(args["output"]).resolve()),
        "exit_code": child.returncode,
        "status": summary["run"].get("status"),
        "ranks": summary["ranks"],
        "stdout_tail": _tail(child.stdout),
        "stderr_tail": _tail(child.stderr),
    }


def _tail(text: str) -> list[str]:
    return [line[:LINE_CHARS] for line in text.splitlines()[-OUTPUT_TAIL:]]


def hunt(args: dict[str, Any]) -> dict[str, Any]:
    """The ``hunt`` tool: what ``opguard hunt … --json --brief`` prints (the recordings'
    output goes to their log files, never into the answer)."""
    return run_hunt(args).to_json(brief=True)


def run_hunt(args: dict[str, Any], **options: Any) -> Hunt:
    """Both passes of a hunt, from the ``hunt`` tool's arguments."""
    tolerance = tolerance_of(args["tolerant"], args["noise"])
    try:
        return run_passes(
            Path(args["output"]),
            args["a"],
            args["b"],
            python=args["python"],
            overwrite=args["overwrite"],
            tolerance=tolerance,
            ray=args["ray"],
            **options,
        )
    except HuntError as exc:
        raise ToolError(str(exc)) from None
