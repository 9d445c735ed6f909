"""Answers about one op in two runs from its captured tensors: ``tensor`` (element by element)
and ``replay`` (the op run again), and finding the op and its captures in both runs.

Op indices are run A's; run B's op is the one the diff aligns with it (``op_b`` overrides).
Every way this can fail is a one-line :class:`ToolError` that says what to do instead. Never
imports torch: ``replay`` runs ``opguard replay`` in a child process.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from ..analysis.align.step_pairs import aligned_index
from ..capture_spec import CaptureSpec
from ..children import run_opguard
from ..store import OpRecord, RankTrace, Run
from ..store.captures import INPUT, OUTPUT, CapturedTensor
from ..tool_registry import ToolError

if TYPE_CHECKING:
    from ..analysis.elementwise import ElementwiseDiff

TENSOR_SCHEMA = "opguard.tensor/1"
REPLAY_SCHEMA = "opguard.replay/1"


def op_in_b(trace_a: RankTrace, trace_b: RankTrace, index_a: int, op_b: int | None) -> OpRecord:
    """Run B's op for run A's op ``index_a``."""
    if op_b is not None:
        return trace_b.op(op_b)
    trace_a.op(index_a)  # an index past the trace fails here, with the trace's length
    index_b = aligned_index(trace_a, trace_b, index_a)
    if index_b is None:
        raise ToolError(
            f"op {index_a} of run A has no aligned op in run B (it exists only in A); "
            "name B's op with --op-b"
        )
    return trace_b.op(index_b)


def captured(trace: RankTrace, index: int) -> list[CapturedTensor]:
    """The captured tensors of op ``index``; an error naming the captured ops when none."""
    found = trace.captures(index)
    if found:
        return found
    trace.op(index)  # no such op: say that rather than "not captured"
    ops = trace.captured_ops()
    where = (
        f"captured ops: {CaptureSpec.of_indices(ops).text}"
        if ops
        else "this run captured no op; re-record it with --capture, or use opguard capture"
    )
    raise ToolError(f"{trace.path.parent}: op {index} was not captured ({where})")


def select(tensors: list[CapturedTensor], direction: str, key: str | None) -> list[CapturedTensor]:
    """The captured inputs or outputs (``direction``: ``x`` or ``y``); ``key`` picks one by
    position or slot name."""
    chosen = [t for t in tensors if t.direction == direction]
    if key is None:
        return chosen
    match = [t for t in chosen if t.slot == key or (key.isdigit() and t.position == int(key))]
    if not match:
        names = ", ".join(f"{t.position} ({t.slot})" for t in chosen) or "none"
        kind = "input" if direction == "x" else "output"
        raise ToolError(f"no captured {kind} {key!r} (captured {kind}s: {names})")
    return match[:1]


# -- tensor ---------------------------------------------------------------------------------------


def tensor(args: dict[str, Any]) -> dict[str, Any]:
    """The ``tensor`` tool: what ``opguard tensor … --json`` prints."""
    op_a, op_b, diffs = compare_tensors(
        args["run_a"], args["run_b"], args["rank"], args["index"], args["op_b"],
        args["input"], args["output"],
    )  # fmt: skip
    return tensor_json(args["run_a"], args["run_b"], args["rank"], op_a, op_b, diffs)


def compare_tensors(
    path_a: str,
    path_b: str,
    rank: int,
    index: int,
    index_b: int | None,
    input_: str | None,
    output: str | None,
) -> tuple[OpRecord, OpRecord, list[ElementwiseDiff]]:
    from ..analysis.elementwise import compare

    if input_ is not None and output is not None:
        raise ToolError("give --input or --output, not both")
    with Run(path_a) as run_a, Run(path_b) as run_b:
        trace_a, trace_b = run_a.rank(rank), run_b.rank(rank)
        op_a = trace_a.op(index)
        op_b = op_in_b(trace_a, trace_b, index, index_b)
        direction, key = (INPUT, input_) if input_ is not None else (OUTPUT, output)
        chosen_a = select(captured(trace_a, op_a.index), direction, key)
        by_label = {t.label: t for t in captured(trace_b, op_b.index)}
        if not chosen_a:
            raise ToolError(f"op {op_a.index} of run A has no captured tensor of that kind")
        diffs = []
        for tensor in chosen_a:
            other = by_label.get(tensor.label)
            if other is None:
                raise ToolError(f"run B did not capture {tensor.label} of op {op_b.index}")
            diffs.append(compare(tensor, other))
    return op_a, op_b, diffs


def tensor_json(
    path_a: str,
    path_b: str,
    rank: int,
    op_a: OpRecord,
    op_b: OpRecord,
    diffs: list[ElementwiseDiff],
) -> dict[str, Any]:
    return {
        "schema": TENSOR_SCHEMA,
        "runs": {"a": path_a, "b": path_b},
        "rank": rank,
        "a": {"index": op_a.index, "op": op_a.op},
        "b": {"index": op_b.index, "op": op_b.op},
        "tensors": [d.to_json() for d in diffs],
    }


# -- replay ---------------------------------------------------------------------------------------


def replay(args: dict[str, Any]) -> dict[str, Any]:
    """The ``replay`` tool: ``opguard replay … --json`` in a child process (it imports torch and
    runs the op; the caller, such as the MCP server, does neither)."""
    from .catalog import BY_NAME

    child = run_opguard(BY_NAME["replay"].argv(args))
    try:
        return dict(json.loads(child.stdout))
    except ValueError:
        last = (child.stderr.strip().splitlines() or ["no output"])[-1]
        raise ToolError(f"replay failed (exit status {child.returncode}): {last}") from None


def hex_results(result: tuple[int | None, ...]) -> list[str | None]:
    return [None if h is None else f"{h:016x}" for h in result]


def _error(e: Any) -> dict[str, float] | None:
    return None if e is None else {"max_abs": e.max_abs, "rel": e.rel}


def replay_json(report: Any, run: str, rank: int, against: str | None) -> dict[str, Any]:
    return {
        "schema": REPLAY_SCHEMA,
        "run": run,
        "rank": rank,
        "op": {"index": report.op.index, "op": report.op.op},
        "times": report.times,
        "devices": [
            {
                "device": d.device,
                "results": [hex_results(r) for r in d.results],
                "distinct": len(set(d.results)),
                "deterministic": d.deterministic,
            }
            for d in report.devices
        ],
        "deterministic": report.deterministic,
        "recorded_a": hex_results(report.recorded_a),
        "matches_a": report.matches_a,
        "against": against,
        "b": {"index": report.op_b.index, "op": report.op_b.op} if report.op_b else None,
        "recorded_b": hex_results(report.recorded_b) if report.recorded_b is not None else None,
        "matches_b": report.matches_b,
        "b_inputs_equal": report.b_inputs_equal,
        "b_arguments_differ": [{"name": d.name, "a": d.a, "b": d.b} for d in report.b_arguments],
        "inputs_faithful": report.inputs_faithful,
        "suspect_devices": report.suspects,
        "reference": {
            "device": "cpu",
            "dtype": "float64",
            "error": report.reference_error,
            "outputs": [
                {"slot": r.slot, "replay": _error(r.replay), "a": _error(r.a), "b": _error(r.b)}
                for r in report.reference
            ],
        },
        "findings": report.findings(),
    }
