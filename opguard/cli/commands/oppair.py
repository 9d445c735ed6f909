"""Finding one op in two runs and its captured tensors: shared by ``tensor`` and ``replay``.

Op indices are run A's; run B's op is the one the diff aligns with it (``--op-b`` overrides).
Every way this can fail is a one-line error (exit 2) that says what to do instead.
"""

from __future__ import annotations

import argparse

from ...analysis.diff import aligned_index
from ...capture_spec import CaptureSpec
from ...store import OpRecord, RankTrace
from ...store.captures import CapturedTensor
from .base import CommandError


def add_op_arguments(p: argparse.ArgumentParser, *, against: bool) -> None:
    """``--op``, ``--rank`` and, for a second run, ``--op-b``."""
    p.add_argument("--op", type=int, required=True, metavar="INDEX", help="op index in run A")
    if against:
        p.add_argument(
            "--op-b",
            type=int,
            metavar="INDEX",
            help="op index in run B (default: the op the diff aligns with A's)",
        )
    p.add_argument("--rank", type=int, default=0, help="rank (default 0)")


def op_in_b(trace_a: RankTrace, trace_b: RankTrace, index_a: int, op_b: int | None) -> OpRecord:
    """Run B's op for run A's op ``index_a``."""
    if op_b is not None:
        return trace_b.op(op_b)
    trace_a.op(index_a)  # an index past the trace fails here, with the trace's length
    index_b = aligned_index(trace_a, trace_b, index_a)
    if index_b is None:
        raise CommandError(
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
    raise CommandError(f"{trace.path.parent}: op {index} was not captured ({where})")


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
        raise CommandError(f"no captured {kind} {key!r} (captured {kind}s: {names})")
    return match[:1]
