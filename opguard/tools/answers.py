"""Handlers of the tools that read traces: ops around an index (both runs, aligned), one op in
both runs, the producers of its inputs, source around its call, its kernels, and the diff.

Each takes the checked arguments and returns a JSON object, or :class:`~opguard.tool_registry.Pages` when
the answer is a list that can grow with the trace. Answers say each thing once: a tensor equal in
both runs is shown for run A only, a table of ops names its columns once.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

from ..analysis.browse.lookup import input_tensor, source_around
from ..analysis.browse.rows import RankRows, Row, Side
from ..analysis.contract import brief_json, to_json
from ..analysis.divergence.model import differing_arguments, differing_tensors
from ..analysis.tolerant.rule import Tolerance, parse_tolerance
from ..analysis.words.text import VALUES_SHOWN
from ..distributed.driver import compare_runs
from ..store import OpRecord, RankTrace, Run, TensorRecord
from ..tool_registry import Pages, ToolError

SOURCE_MAX = 20  # lines on each side of the call line
CONTEXT_ROWS = 3  # rows shown before the op when no offset is given
ROW_COLUMNS = ["a", "b", "status", "op", "site_a", "site_b"]


@dataclass(frozen=True, slots=True)
class Pair:
    """Both runs' traces of one rank, and their aligned rows."""

    trace_a: RankTrace
    trace_b: RankTrace
    rows: RankRows

    def trace(self, side: Side) -> RankTrace:
        return self.trace_a if side is Side.A else self.trace_b

    def row_of(self, side: Side, index: int) -> Row:
        """The aligned row holding op ``index`` of run ``side``."""
        row = self.rows.row_of(side, index)
        if row is None:
            trace = self.trace(side)
            raise ToolError(
                f"run {side.name} has no op {index} on rank {trace.rank} (it {trace.describe_ops()})"
            )
        return row


@contextmanager
def _runs(*paths: str) -> Iterator[list[Run]]:
    with ExitStack() as stack:
        yield [stack.enter_context(Run(path)) for path in paths]


def _rank(given: int | None, *runs: Run) -> int:
    """``given``, or the lowest rank every run recorded."""
    shared = sorted(set.intersection(*(set(r.ranks) for r in runs)))
    if given is not None:
        return given
    if not shared:
        raise ToolError("no rank recorded in " + ("both runs" if len(runs) > 1 else "the run"))
    return shared[0]


@contextmanager
def _pair(args: dict[str, Any]) -> Iterator[Pair]:
    with _runs(args["run_a"], args["run_b"]) as (run_a, run_b):
        rank = _rank(args["rank"], run_a, run_b)
        trace_a, trace_b = run_a.rank(rank), run_b.rank(rank)
        yield Pair(trace_a, trace_b, RankRows(trace_a, trace_b))


@contextmanager
def _trace(args: dict[str, Any]) -> Iterator[RankTrace]:
    with _runs(args["run"]) as (run,):
        yield run.rank(_rank(args["rank"], run))


def _side(args: dict[str, Any]) -> Side:
    return Side.A if args["side"] == "a" else Side.B


# -- ops around an index ----------------------------------------------------------------------


def ops(args: dict[str, Any]) -> Pages:
    """The aligned rows of the step holding the op, a page at a time; by default the page
    starts a few rows before the op."""
    side, index = _side(args), args["index"]
    with _pair(args) as pair:
        focus = pair.row_of(side, index)
        step = pair.rows.step_of(side, index)
        assert step is not None  # row_of found it
        rows = list(pair.rows.rows(step))
    at = rows.index(focus)
    if args["changed"]:  # the page then starts at the first changed row from the op on
        at = sum(1 for r in rows[:at] if r.status.differs)
        rows = [r for r in rows if r.status.differs]

    def render(offset: int, limit: int) -> dict[str, Any]:
        return {
            "rank": pair.trace_a.rank,
            "step": step,
            "rows_in_step": len(rows),
            "columns": ROW_COLUMNS,
            "rows": [_row(r) for r in rows[offset : offset + limit]],
        }

    return Pages(len(rows), render, start=max(min(at, len(rows) - 1) - CONTEXT_ROWS, 0))


def _row(row: Row) -> list[Any]:
    site_a = row.a.site.short() if row.a else None
    site_b = row.b.site.short() if row.b else None
    return [
        row.a.index if row.a else None,
        row.b.index if row.b else None,
        row.status.value,
        row.shown.name,
        site_a,
        site_b if site_b != site_a else None,
    ]


# -- one op in both runs ------------------------------------------------------------------------


def op(args: dict[str, Any]) -> Pages:
    """The op and its partner: where each was called, arguments (what differs apart), and its
    tensors a page at a time, run B's only where they differ from run A's."""
    side = _side(args)
    with _pair(args) as pair:
        row = pair.row_of(side, args["index"])
        op_a = pair.trace_a.op(row.a.index) if row.a else None
        op_b = pair.trace_b.op(row.b.index) if row.b else None
        rank = pair.trace_a.rank
    shown = op_a or op_b
    assert shown is not None
    tensors = _tensor_pairs(op_a, op_b)
    head: dict[str, Any] = {
        "rank": rank,
        "status": row.status.value,
        "op": shown.op,
        "step": shown.step,
        "phase": shown.phase,
        "a": _where(op_a),
        "b": _where(op_b),
        **_arguments(op_a, op_b),
    }
    kernels = {k: len(o.kernels) for k, o in (("a", op_a), ("b", op_b)) if o and o.kernels}
    if kernels:
        head["kernels"] = kernels

    def render(offset: int, limit: int) -> dict[str, Any]:
        return {**head, "tensors_total": len(tensors), "tensors": tensors[offset : offset + limit]}

    return Pages(len(tensors), render)


def _where(op: OpRecord | None) -> dict[str, Any] | None:
    if op is None:
        return None
    out: dict[str, Any] = {"index": op.index, "call_site": op.call_site.to_json()}
    line = op.call_site.source_line()
    if line:
        out["source"] = line
    if op.forward_index is not None:
        out["forward_index"] = op.forward_index
    return out


def _arguments(op_a: OpRecord | None, op_b: OpRecord | None) -> dict[str, Any]:
    """Arguments both runs passed alike once; those that differ with both values; whether the
    RNG state a random op consumed differs."""
    if op_a is None or op_b is None:
        only = op_a or op_b
        assert only is not None
        return {"args": dict(only.args)} if only.args else {}
    differ = differing_arguments(op_a, op_b)
    names = {d.name for d in differ}
    out: dict[str, Any] = {"args": {k: v for k, v in op_a.args if k not in names}}
    if differ:
        out["args_differ"] = [{"name": d.name, "a": d.a, "b": d.b} for d in differ]
    if op_a.rng is not None or op_b.rng is not None:
        out["rng_state_differs"] = op_a.rng != op_b.rng
    return out


def _tensor_pairs(op_a: OpRecord | None, op_b: OpRecord | None) -> list[dict[str, Any]]:
    out = []
    for io in ("in", "out"):
        sa = _slots(op_a, io)
        sb = _slots(op_b, io)
        differing = {d.slot for d in differing_tensors(tuple(sa.values()), tuple(sb.values()))}
        for slot in [*sa, *(s for s in sb if s not in sa)]:
            ta, tb = sa.get(slot), sb.get(slot)
            entry: dict[str, Any] = {"io": io, "slot": slot}
            if op_a is not None and op_b is not None:
                entry["equal"] = slot not in differing
            paired = ta is not None and tb is not None
            if ta is not None:
                entry["a"] = _tensor(ta, values=slot in differing or not paired)
            if tb is not None:
                if ta is None or slot in differing:
                    entry["b"] = _tensor(tb, values=True)
                elif tb.producer != ta.producer and tb.producer is not None:
                    entry["b"] = {"producer": list(tb.producer)}
            out.append(entry)
    return out


def _tensor(t: TensorRecord, *, values: bool) -> dict[str, Any]:
    """A tensor without its slot (the entry has it); with ``values``, its first few values (to
    8 digits) and their bits: where two runs differ they show how, where they agree the
    fingerprint and stats say enough."""
    out = t.to_json()
    del out["slot"]
    for key in ("values", "bits"):
        if key in out and values:
            out[key] = [_short(v) for v in out[key][:VALUES_SHOWN]]
        elif key in out:
            del out[key]
    if "stats" in out:
        out["stats"] = {k: _short(v) for k, v in out["stats"].items()}
    return out


def _short(value: Any) -> Any:
    return float(f"{value:.8g}") if isinstance(value, float) else value


def _slots(op: OpRecord | None, io: str) -> dict[str, TensorRecord]:
    if op is None:
        return {}
    return {t.slot: t for t in (op.inputs if io == "in" else op.outputs)}


# -- producers --------------------------------------------------------------------------------


def producers(args: dict[str, Any]) -> dict[str, Any]:
    """Follows an input back through the ops that produced it, in both runs at once: ``slot``
    first (by default the first input that differs), then at each producer its first differing
    input, until a leaf, a pair of producers that are not aligned partners, producers whose
    inputs are equal (where the difference starts), or ``depth`` hops."""
    side = _side(args)
    with _pair(args) as pair:
        row = pair.row_of(side, args["index"])
        op_a = pair.trace_a.op(row.a.index) if row.a else None
        op_b = pair.trace_b.op(row.b.index) if row.b else None
        start = op_a or op_b
        assert start is not None
        answer: dict[str, Any] = {
            "rank": pair.trace_a.rank,
            "from": {
                "a": row.a.index if row.a else None,
                "b": row.b.index if row.b else None,
                "op": start.op,
            },
        }
        hops: list[dict[str, Any]] = []
        slot = args["slot"]
        for _ in range(args["depth"]):
            if slot is None:
                slot = _first_differing_input(op_a, op_b)
                if slot is None:
                    answer["end"] = "inputs equal: the difference starts at this op"
                    break
            hop, op_a, op_b, end = _hop(pair, op_a, op_b, slot)
            hops.append(hop)
            if end:
                answer["end"] = end
                break
            slot = None
        else:
            answer["end"] = f"depth {args['depth']} reached: call again from the last hop"
    answer["hops"] = hops
    return answer


def _first_differing_input(op_a: OpRecord | None, op_b: OpRecord | None) -> str | None:
    if op_a is None or op_b is None:
        return None
    diffs = differing_tensors(op_a.inputs, op_b.inputs)
    return diffs[0].slot if diffs else None


def _hop(
    pair: Pair, op_a: OpRecord | None, op_b: OpRecord | None, slot: str
) -> tuple[dict[str, Any], OpRecord | None, OpRecord | None, str]:
    """One step back through input ``slot``: the producers, and why the walk ends there ('' if
    it goes on)."""
    hop: dict[str, Any] = {"slot": slot}
    made: list[OpRecord | None] = []
    outputs: list[TensorRecord | None] = []
    for name, op, trace in (("a", op_a, pair.trace_a), ("b", op_b, pair.trace_b)):
        producer = input_tensor(op, slot).producer if op is not None else None
        made.append(trace.op(producer[0]) if producer else None)
        outputs.append(_output(made[-1], producer[1]) if producer else None)
        hop[name] = _producer_ref(made[-1], producer[1]) if producer else None
    prod_a, prod_b = made
    if prod_a is None and prod_b is None:
        return (
            hop,
            None,
            None,
            f"leaf: no recorded op produced input '{slot}' (data, a parameter, or a tensor made before recording)",
        )
    if prod_a is None or prod_b is None or pair.rows.partner(Side.A, prod_a.index) != prod_b.index:
        hop["aligned"] = False
        return (
            hop,
            prod_a,
            prod_b,
            "the producers are not aligned partners: an op inserted, removed or replaced (see the ops tool around them)",
        )
    hop["aligned"] = True
    out_a, out_b = outputs
    equal = out_a is not None and out_b is not None and not differing_tensors((out_a,), (out_b,))
    hop["output_equal"] = equal
    if equal:
        return (
            hop,
            prod_a,
            prod_b,
            f"input '{slot}' was equal when produced: it changed in between (in place, by code not recorded) or does not differ",
        )
    if _first_differing_input(prod_a, prod_b) is None:
        what = [d.name for d in differing_arguments(prod_a, prod_b)]
        rng = prod_a.rng != prod_b.rng
        why = (
            f"argument(s) {', '.join(what)} differ"
            if what
            else "the RNG state it consumed differs"
            if rng
            else "equal inputs and arguments gave different outputs (kernel, race, hardware)"
        )
        return hop, prod_a, prod_b, f"cause: this producer's tensor inputs are equal; {why}"
    return hop, prod_a, prod_b, ""


def _output(op: OpRecord | None, slot: int) -> TensorRecord | None:
    return op.outputs[slot] if op is not None and 0 <= slot < len(op.outputs) else None


def _producer_ref(op: OpRecord | None, output: int) -> dict[str, Any] | None:
    if op is None:
        return None
    return {
        "index": op.index,
        "output": output,
        "op": op.op,
        "step": op.step,
        "phase": op.phase,
        "site": op.call_site.short(),
    }


# -- one run: source, kernels -----------------------------------------------------------------


def source(args: dict[str, Any]) -> dict[str, Any]:
    """Source lines around the op's call site (from the file when it still matches the
    recording, else the lines the trace kept), and the user stack that led there."""
    with _trace(args) as trace:
        op = trace.op(args["index"])
        stack = [site.short() for site in trace.stack(op.stack_id)]
    site = op.call_site
    view = source_around(site, args["before"], args["after"])
    answer: dict[str, Any] = {
        "index": op.index,
        "op": op.op,
        **site.to_json(),
        "lines": [[n, text] for n, text in view.rows],
    }
    if not view.from_file:
        answer["note"] = "only the lines the trace kept: the file is not here or has changed"
    if op.forward_index is not None:
        answer["note_backward"] = f"a backward op: the call site of forward op #{op.forward_index}"
    answer["stack"] = stack
    return answer


UNRECORDED_SHOWN = 20  # GPU launches by unrecorded code shown after an op's kernels


def kernels(args: dict[str, Any]) -> Pages:
    """GPU work the op launched (kernels, memcpys, memsets), as recorded, and apart from it
    the GPU work code OpGuard did not record launched after the op (``unrecorded_after``)."""
    with _trace(args) as trace:
        op = trace.op(args["index"])
    found = [k.to_json() for k in op.kernels]
    unrecorded = [k.to_json() for k in op.unclaimed_kernels]

    def render(offset: int, limit: int) -> dict[str, Any]:
        out: dict[str, Any] = {
            "index": op.index,
            "op": op.op,
            "total": len(found),
            "kernels": found[offset : offset + limit],
        }
        if not found:
            out["note"] = "none recorded: a CPU op, or a run recorded without kernel tracing"
        if unrecorded:  # launched after the op, outside any recorded op; not paged
            out["unrecorded_after"] = unrecorded[:UNRECORDED_SHOWN]
            out["unrecorded_after_total"] = len(unrecorded)
        return out

    return Pages(len(found), render)


# -- the diff ---------------------------------------------------------------------------------


def tolerance_of(tolerant: str | None, noise: str | None = None) -> Tolerance | None:
    """The ``tolerant`` and ``noise`` arguments of the diff and explain tools: None (bit for
    bit), ``auto`` (with a control run, ``noise``) or a relative bound; a :class:`ToolError`
    for anything else."""
    if tolerant is None:
        if noise is not None:
            raise ToolError("--noise is a floor for --tolerant's rule: add --tolerant")
        return None
    try:
        return parse_tolerance(tolerant, noise)
    except ValueError as exc:
        raise ToolError(str(exc)) from None


def diff(args: dict[str, Any]) -> Pages:
    """The ``opguard.diff/1`` object (``brief``: without ops given twice); the per-step lists
    of its ranks are the pages."""
    tolerance = tolerance_of(args["tolerant"], args["noise"])
    found = compare_runs(
        args["run_a"],
        args["run_b"],
        ray=args["ray"],
        rank=args["rank"],
        step=args["step"],
        tolerance=tolerance,
    )
    whole = to_json(found)
    if args["brief"]:
        whole = brief_json(whole)
    steps = [r.pop("steps") for r in whole["ranks"]]

    def render(offset: int, limit: int) -> dict[str, Any]:
        ranks = [
            {**r, "steps": s[offset : offset + limit]}
            for r, s in zip(whole["ranks"], steps, strict=True)
        ]
        return {**whole, "ranks": ranks}

    return Pages(max((len(s) for s in steps), default=0), render)
