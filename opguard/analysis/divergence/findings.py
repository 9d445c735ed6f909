"""The evidence of a classified divergence: a stream race where the difference was read, the
likely causes of an origin, the one-line summary and what to check first (the hint).

:mod:`.explainer` decides *what* the divergence is (origin, argument, propagated, structure);
this module gathers what the traces say about *why*, for every front end to show.
"""

from __future__ import annotations

from ...store import OpRecord, RankTrace, schema
from ..words.text import plain_value
from ..words.verdict import Cause, Kind, Side
from .causes import ENVIRONMENT, UNRECORDED_GPU_WORK, UNVERIFIED_INPUT, likely_causes
from .gpu_work import StreamRace, stream_race
from .model import (
    MAX_WINDOW_KERNELS,
    MAX_WINDOW_SCAN,
    Divergence,
    unrecorded_kernels_text,
)
from .summary import summarise

Traces = tuple[RankTrace, RankTrace]  # run A's, run B's


def add_findings(div: Divergence, traces: Traces, *, inputs_equal: bool) -> Divergence:
    """A classified divergence's evidence: stream race, likely causes, summary and hint
    (``inputs_equal``: an origin's inputs were equal, so GPU work OpGuard did not record
    between their writes and the op may explain it; else the tolerant walk's divergence,
    whose inputs differ by rounding and whose difference is beyond it)."""
    race = _stream_race(div, traces)
    div.race = race.text() if race is not None else ""
    gpu_work = (
        _unrecorded_gpu_work(div, traces)
        if inputs_equal and div.cause is Cause.ORIGIN and not div.kernels_differ
        else ""
    )
    found = likely_causes(div, traces, race, gpu_work, beyond_rounding=not inputs_equal)
    # Beyond rounding: only another implementation of the op bears on it.
    div.likely_causes = found if inputs_equal else [c for c in found if c.kind == ENVIRONMENT]
    div.summary = summarise(div)
    div.hint = _hint(div, traces, gpu_work)
    return div


def _stream_race(div: Divergence, traces: Traces) -> StreamRace | None:
    """Evidence of a stream race at the op where the difference was read: in either run,
    one of its inputs was written on another stream by GPU work that had not finished when
    the op's own started (no ``wait_stream``/event between them)."""
    link = div.chain[-1] if div.chain else None
    for run, trace, op in (
        (Side.A, traces[0], link.a if link else div.observed_a),
        (Side.B, traces[1], link.b if link else div.observed_b),
    ):
        race = stream_race(run, trace, op)
        if race is not None:
            return race
    return None


def _hint(div: Divergence, traces: Traces, gpu_work: str) -> str:
    """Patterns a person would recognise, read from the evidence (never from names of
    scripts): gradient accumulation into a kept ``.grad``, a missing default argument; for
    an origin nothing else explains, how to find an unrecorded write (``gpu_work``: the
    unrecorded GPU work before it, if any)."""
    if div.kind is Kind.STRUCTURE:
        for op, trace, run, other in (
            (div.b, traces[1], "B", "A"),
            (div.a, traces[0], "A", "B"),
        ):
            kept = _accumulated_from(op, trace) if op is not None else None
            if kept is not None:
                return (
                    f"run {run}'s backward accumulated into a gradient kept from step "
                    f"{kept} where run {other} started from a fresh one: is "
                    f"optimizer.zero_grad() missing in run {run} (or is the gradient "
                    "accumulation intended)?"
                )
    if div.cause is Cause.ARGUMENT:
        defaulted = [d for d in div.arguments if not (d.a_passed and d.b_passed)]
        if defaulted:
            d = defaulted[0]
            run = "A" if not d.a_passed else "B"
            return (
                f"run {run} did not pass '{d.name}' (the op's default applied), the other "
                f"run passed {plain_value(d.b if run == 'A' else d.a)}"
            )
    # An unrecorded write is what to check first only when nothing else explains an origin.
    top = div.likely_causes[0].kind if div.cause is Cause.ORIGIN and div.likely_causes else ""
    if top == UNRECORDED_GPU_WORK:
        return gpu_work
    if top == UNVERIFIED_INPUT:
        return (
            "CPU ops give equal outputs for equal inputs: unless this one is "
            "nondeterministic, code OpGuard does not record (an extension writing through a "
            "pointer, a NumPy view, a .data write) may have changed an input after its "
            "producer's fingerprint was taken; record both runs with --verify-inputs to "
            "find where"
        )
    return ""


def _unrecorded_gpu_work(div: Divergence, traces: Traces) -> str:
    """An origin whose inputs were equal as recorded, in a run that launched GPU work
    OpGuard did not record after one of those inputs was produced and before the op read
    it: that work may have changed the input after its fingerprint was taken."""
    found = []
    for run, trace, op in (("A", traces[0], div.a), ("B", traces[1], div.b)):
        produced = [(t.producer[0], t.slot) for t in op.inputs if t.producer] if op else []
        if op is None or not produced:
            continue
        first, slot = min(produced)
        start = max(first, op.index - MAX_WINDOW_SCAN)
        kernels, total = trace.unclaimed_between(start, op.index, MAX_WINDOW_KERNELS)
        if total:
            found.append(
                f"run {run} launched GPU work OpGuard did not record "
                f"({unrecorded_kernels_text(kernels, total)}) after op {first}, which "
                f"produced input '{slot}', and before this op"
            )
    if not found:
        return ""
    return (
        "; ".join(found) + ": it may have written the input after its fingerprint was "
        "taken; record both runs with --verify-inputs to find where"
    )


def _accumulated_from(op: OpRecord, trace: RankTrace) -> int | None:
    """The step in which the tensor a backward op updated in place (``self``) was made, when
    that is an earlier step: autograd adding a new gradient into a ``.grad`` nobody reset."""
    if op.phase != "backward" or not any(t.flags & schema.FLAG_WRITTEN for t in op.outputs):
        return None
    target = next((t for t in op.inputs if t.slot == "self"), None)
    if target is None or target.producer is None:
        return None
    made = trace.op(target.producer[0]).step
    return made if made < op.step else None
