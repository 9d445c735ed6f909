"""Classifying the first observed difference and following it back to its cause.

The walk in :mod:`opguard.analysis.diff` finds the first aligned pair of ops whose outputs
differ. This module explains it: if the inputs and arguments were equal the op itself is the
origin; if only a non-tensor argument or the RNG state differed it is an argument change;
otherwise it follows the producers of the differing input back until it reaches a leaf (data,
parameters), an op that exists in only one run, or a tensor changed by code OpGuard did not see.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from ..store import KernelEntry, OpRecord, RankTrace, TensorRecord, schema
from .causes import (
    ENVIRONMENT,
    KERNELS,
    UNRECORDED_GPU_WORK,
    UNVERIFIED_INPUT,
    LikelyCause,
    first_cause,
    likely_causes,
)
from .gpu_work import StreamRace, kernel_names, stream_race
from .reach import Absorbed
from .text import plain_value, short_kernel_name
from .verdict import WORDS, Cause, Kind, Side

MAX_CHAIN = 64


@dataclass(frozen=True, slots=True)
class TensorDiff:
    slot: str
    a: TensorRecord | None
    b: TensorRecord | None


@dataclass(frozen=True, slots=True)
class ArgumentDiff:
    name: str
    a: Any
    b: Any
    a_passed: bool = True  # False: the op was called without it (the op's default applied)
    b_passed: bool = True


@dataclass(frozen=True, slots=True)
class Link:
    """One hop of the producer chain: the differing input ``slot`` of ops ``a``/``b``."""

    a: OpRecord
    b: OpRecord
    slot: str


@dataclass(frozen=True, slots=True)
class WriteWindow:
    """In run ``run``, a tensor written by op ``producer`` was changed by code OpGuard did not
    record after op ``after`` (the last op that read it unchanged, or its producer) and before
    op ``before`` (the first that read it changed). ``kernels``: the GPU work launched in that
    window outside any recorded op, as (op it followed, kernels entry), the first
    ``MAX_WINDOW_KERNELS`` of ``kernels_total``."""

    run: Side
    producer: int
    after: int
    before: int
    kernels: tuple[tuple[int, KernelEntry], ...] = ()
    kernels_total: int = 0

    def text(self) -> str:
        where = f"run {self.run.name}: written by unrecorded code between op {self.after} and op {self.before}"
        if not self.kernels_total:
            return where
        return f"{where}, kernels: {unrecorded_kernels_text(self.kernels, self.kernels_total)}"

    def to_json(self) -> dict[str, Any]:
        return {
            "run": self.run.name,
            "producer": self.producer,
            "after": self.after,
            "before": self.before,
            "kernels": [{**entry.to_json(), "i": index} for index, entry in self.kernels],
            "kernels_total": self.kernels_total,
        }


MAX_WINDOW_KERNELS = 50  # unrecorded GPU launches kept per window
KERNEL_NAMES_SHOWN = 3  # distinct names in a window's text


def unrecorded_kernels_text(kernels: Sequence[tuple[int, KernelEntry]], total: int) -> str:
    """``memset ×2, my_kernel, +3 more``: the distinct names of unrecorded GPU work, in launch
    order, with how many launches the list leaves out."""
    counts = Counter(short_kernel_name(entry.name) for _, entry in kernels)
    shown = list(counts.items())[:KERNEL_NAMES_SHOWN]
    parts = [name if n == 1 else f"{name} ×{n}" for name, n in shown]
    more = total - sum(n for _, n in shown)
    return ", ".join(parts + ([f"+{more} more"] if more else []))


@dataclass
class Divergence:
    rank: int
    step: int
    kind: Kind  # origin | argument | propagated | structure
    cause: Cause  # an op-level one: origin, argument, rng, leaf, earlier-step, …
    a: OpRecord | None  # the op the verdict names in run A (the cause for structure)
    b: OpRecord | None
    observed_a: OpRecord  # the first aligned pair whose outputs differ
    observed_b: OpRecord
    outputs: list[TensorDiff]
    inputs: list[TensorDiff]
    arguments: list[ArgumentDiff]
    rng_differs: bool
    chain: list[Link] = field(default_factory=list)
    summary: str = ""
    hint: str = ""  # what the evidence suggests a person check first, when it suggests anything
    race: str = ""  # evidence of a stream race on the op that read the difference
    # unrecorded-write: where, in each run whose read differs from the write, the unrecorded
    # write happened (between two ops)
    windows: list[WriteWindow] = field(default_factory=list)
    # why, most likely first, with the evidence for each (origin, unrecorded-write)
    likely_causes: list[LikelyCause] = field(default_factory=list)

    @property
    def kernels_differ(self) -> bool:
        """The two runs launched different GPU kernels for the observed op (a classic cause of
        bitwise differences: another algorithm, TF32, a different library version)."""
        return kernel_names(self.observed_a) != kernel_names(self.observed_b)


def _by_slot(tensors: tuple[TensorRecord, ...]) -> dict[str, TensorRecord]:
    return {t.slot: t for t in tensors}


def differing_tensors(a: tuple[TensorRecord, ...], b: tuple[TensorRecord, ...]) -> list[TensorDiff]:
    """Slots whose content differs, or that exist on one side only, in slot order of A."""
    sa, sb = _by_slot(a), _by_slot(b)
    diffs = []
    for slot in [*sa, *(s for s in sb if s not in sa)]:
        ta, tb = sa.get(slot), sb.get(slot)
        if ta is None or tb is None or content_of(ta) != content_of(tb):
            diffs.append(TensorDiff(slot, ta, tb))
    return diffs


def content_of(t: TensorRecord) -> tuple[Any, ...]:
    """What two tensor entries must share to count as equal: their content key, or, where no
    fingerprint was read, their dtype and shape (an unread tensor is not a difference)."""
    key = t.content_key()
    return key if key is not None else ("unknown", t.dtype, t.shape)


def differing_arguments(a: OpRecord, b: OpRecord) -> list[ArgumentDiff]:
    da, db = dict(a.args), dict(b.args)
    return [
        ArgumentDiff(name, da.get(name), db.get(name), name in da, name in db)
        for name in [*da, *(n for n in db if n not in da)]
        if da.get(name) != db.get(name) or (name in da) != (name in db)
    ]


class Alignment(Protocol):
    """What the explainer needs of the alignment: partners of ops, and which ops were compared
    (``side`` 0 is run A, 1 is run B)."""

    def b_of(self, a_index: int) -> int | None: ...

    def a_of(self, b_index: int) -> int | None: ...

    def compared(self, index: int, side: int) -> bool: ...


class Explainer:
    """Explains the first differing aligned pair, given both traces and the alignment."""

    def __init__(self, trace_a: RankTrace, trace_b: RankTrace, alignment: Alignment) -> None:
        self.trace_a = trace_a
        self.trace_b = trace_b
        self.alignment = alignment
        # Outputs whose difference reached nothing (.reach): (op index in A, in B, slot).
        self._absorbed: set[tuple[int, int, int]] = set()

    def absorb(self, absorbed: Absorbed) -> None:
        """Notes a difference that reached nothing: an input read from it does not explain a
        later divergence."""
        for slot, tensor in enumerate(absorbed.a.outputs):
            if tensor.slot in absorbed.slots:
                self._absorbed.add((absorbed.a.index, absorbed.b.index, slot))

    def explain(self, op_a: OpRecord, op_b: OpRecord) -> Divergence:
        div, unwritten = self._observed(op_a, op_b)
        if not div.inputs:
            self._settle(div, op_a, op_b, unwritten)
        else:
            self._follow(div)
        return self._finish(div, inputs_equal=True)

    def explain_at(
        self,
        op_a: OpRecord,
        op_b: OpRecord,
        cause: Cause,
        slot: str = "",
        producers: tuple[tuple[int, int] | None, tuple[int, int] | None] = (None, None),
    ) -> Divergence:
        """The divergence at ops whose difference rounding does not explain (the tolerant
        walk, :mod:`.tolerant`), classified there instead of followed back: their inputs may
        differ, by rounding. ``cause``: ARGUMENT or RNG (a changed argument or RNG state),
        LEAF (input ``slot``, which no recorded op produced, differs beyond rounding),
        INSERTED (input ``slot`` was written by ``producers``, ops of one run only: which
        one is named as in :meth:`explain`), else ORIGIN (the op made a difference larger
        than rounding of its own)."""
        div, _ = self._observed(op_a, op_b)
        if cause in (Cause.ARGUMENT, Cause.RNG):
            div.kind, div.cause = Kind.ARGUMENT, cause
        elif cause is Cause.LEAF:
            div.kind, div.cause = Kind.PROPAGATED, Cause.LEAF
            div.chain.append(Link(op_a, op_b, slot))
        elif cause is Cause.INSERTED:
            div.chain.append(Link(op_a, op_b, slot))
            self._structure(div, *producers)
        else:
            div.kind, div.cause = Kind.ORIGIN, Cause.ORIGIN
        return self._finish(div, inputs_equal=False)

    def _observed(self, op_a: OpRecord, op_b: OpRecord) -> tuple[Divergence, list[TensorDiff]]:
        """The divergence observed at ops ``op_a``/``op_b`` before it is classified (as an
        origin), and its inputs that no recorded op wrote."""
        inputs, unwritten, arguments, rng = self._assess(op_a, op_b)
        div = Divergence(
            rank=self.trace_a.rank,
            step=op_a.step,
            kind=Kind.ORIGIN,
            cause=Cause.ORIGIN,
            a=op_a,
            b=op_b,
            observed_a=op_a,
            observed_b=op_b,
            outputs=differing_tensors(op_a.outputs, op_b.outputs),
            inputs=inputs,
            arguments=arguments,
            rng_differs=rng,
        )
        return div, unwritten

    def _finish(self, div: Divergence, *, inputs_equal: bool) -> Divergence:
        """A classified divergence's evidence: stream race, likely causes, summary and hint
        (``inputs_equal``: an origin's inputs were equal, so GPU work OpGuard did not record
        between their writes and the op may explain it; else the tolerant walk's divergence,
        whose inputs differ by rounding and whose difference is beyond it)."""
        race = self._stream_race(div)
        div.race = race.text() if race is not None else ""
        gpu_work = (
            self._unrecorded_gpu_work(div)
            if inputs_equal and div.cause is Cause.ORIGIN and not div.kernels_differ
            else ""
        )
        traces = (self.trace_a, self.trace_b)
        found = likely_causes(div, traces, race, gpu_work, beyond_rounding=not inputs_equal)
        # Beyond rounding: only another implementation of the op bears on it.
        div.likely_causes = found if inputs_equal else [c for c in found if c.kind == ENVIRONMENT]
        div.summary = summarise(div)
        div.hint = self._hint(div, gpu_work)
        return div

    def _stream_race(self, div: Divergence) -> StreamRace | None:
        """Evidence of a stream race at the op where the difference was read: in either run,
        one of its inputs was written on another stream by GPU work that had not finished when
        the op's own started (no ``wait_stream``/event between them)."""
        link = div.chain[-1] if div.chain else None
        for run, trace, op in (
            (Side.A, self.trace_a, link.a if link else div.observed_a),
            (Side.B, self.trace_b, link.b if link else div.observed_b),
        ):
            race = stream_race(run, trace, op)
            if race is not None:
                return race
        return None

    def _assess(
        self, a: OpRecord, b: OpRecord
    ) -> tuple[list[TensorDiff], list[TensorDiff], list[ArgumentDiff], bool]:
        """What differs going into ops ``a`` and ``b``: tensor inputs whose content means
        something, inputs read from memory no recorded op ever wrote (garbage, such as the
        ``torch.empty`` a parameter's in-place initialiser fills), arguments, and RNG state."""
        inputs: list[TensorDiff] = []
        unwritten: list[TensorDiff] = []
        for d in differing_tensors(a.inputs, b.inputs):
            if self._was_absorbed(d):
                continue
            never_written = (
                d.a is not None
                and d.b is not None
                and (d.a.dtype, d.a.shape) == (d.b.dtype, d.b.shape)
                and _never_written(d.a, self.trace_a)
                and _never_written(d.b, self.trace_b)
            )
            (unwritten if never_written else inputs).append(d)
        return inputs, unwritten, differing_arguments(a, b), a.rng != b.rng

    def _was_absorbed(self, d: TensorDiff) -> bool:
        pa = d.a.producer if d.a is not None else None
        pb = d.b.producer if d.b is not None else None
        return pa is not None and pb is not None and (pa[0], pb[0], pa[1]) in self._absorbed

    def _settle(
        self, div: Divergence, op_a: OpRecord, op_b: OpRecord, unwritten: list[TensorDiff]
    ) -> None:
        """Classifies ops whose meaningful tensor inputs are equal: an argument or the RNG
        state differs; else an input that no recorded op wrote differs (written by code OpGuard
        did not see); else the op itself produced different outputs (origin)."""
        if div.arguments or div.rng_differs:
            div.kind = Kind.ARGUMENT
            div.cause = Cause.RNG if div.rng_differs and not div.arguments else Cause.ARGUMENT
        elif unwritten:
            div.kind = Kind.PROPAGATED
            div.cause = Cause.UNRECORDED_WRITE
            div.chain.append(Link(op_a, op_b, unwritten[0].slot))
        else:
            div.kind, div.cause = Kind.ORIGIN, Cause.ORIGIN

    def _follow(self, div: Divergence) -> None:
        """Walks producers of the first differing input back to the earliest cause."""
        div.kind = Kind.PROPAGATED
        align = self.alignment
        op_a, op_b, inputs = div.observed_a, div.observed_b, div.inputs
        for _ in range(MAX_CHAIN):
            slot = inputs[0]
            div.chain.append(Link(op_a, op_b, slot.slot))
            pa = slot.a.producer if slot.a else None
            pb = slot.b.producer if slot.b else None
            if pa is None and pb is None:
                div.cause = Cause.LEAF
                return
            if (pa is None or not align.compared(pa[0], 0)) and (
                pb is None or not align.compared(pb[0], 1)
            ):
                div.cause = Cause.EARLIER_STEP  # produced before the compared steps (--step)
                return
            if pa is not None and pb is not None and align.b_of(pa[0]) == pb[0]:
                prod_a, prod_b = self.trace_a.op(pa[0]), self.trace_b.op(pb[0])
                out_a, out_b = _output(prod_a, pa[1]), _output(prod_b, pb[1])
                if (
                    out_a is not None
                    and out_b is not None
                    and not (out_a.is_view or out_b.is_view)
                    and out_a.content_key() is not None  # unknown: a receive still in flight
                    and content_of(out_a) == content_of(out_b)
                ):
                    div.cause = Cause.UNRECORDED_WRITE  # equal when written, different when read
                    div.windows = [
                        window
                        for run, trace, produced, reader in (
                            (Side.A, self.trace_a, pa, op_a.index),
                            (Side.B, self.trace_b, pb, op_b.index),
                        )
                        if (window := _write_window(run, trace, produced, reader)) is not None
                    ]
                    return
                inputs, unwritten, arguments, rng = self._assess(prod_a, prod_b)
                if not inputs:  # the producers differ by themselves: the cause
                    div.a, div.b = prod_a, prod_b
                    div.inputs, div.arguments, div.rng_differs = inputs, arguments, rng
                    div.chain.append(Link(prod_a, prod_b, ""))
                    self._settle(div, prod_a, prod_b, unwritten)
                    return
                op_a, op_b = prod_a, prod_b
                continue
            self._structure(div, pa, pb)
            return
        div.cause = Cause.LEAF

    def _structure(
        self, div: Divergence, pa: tuple[int, int] | None, pb: tuple[int, int] | None
    ) -> None:
        """The two runs' producers of the differing input are not partners: name the op that
        exists in one run only. A producer that has a partner elsewhere in the other run is
        not the cause (it exists in both); the other side's unpartnered op is."""
        align = self.alignment
        div.kind = Kind.STRUCTURE
        cause_a = self.trace_a.op(pa[0]) if pa is not None else None
        cause_b = self.trace_b.op(pb[0]) if pb is not None else None
        if cause_a is not None and cause_b is not None:
            a_partnered = align.b_of(cause_a.index) is not None
            b_partnered = align.a_of(cause_b.index) is not None
            if a_partnered and not b_partnered:
                cause_a = None  # B's extra op made the difference
            elif b_partnered and not a_partnered:
                cause_b = None  # A's op is missing from B
        div.a, div.b = cause_a, cause_b
        div.cause = (
            Cause.REPLACED
            if cause_a is not None and cause_b is not None
            else Cause.REMOVED
            if cause_a is not None
            else Cause.INSERTED
        )

    def _hint(self, div: Divergence, gpu_work: str) -> str:
        """Patterns a person would recognise, read from the evidence (never from names of
        scripts): gradient accumulation into a kept ``.grad``, a missing default argument; for
        an origin nothing else explains, how to find an unrecorded write (``gpu_work``: the
        unrecorded GPU work before it, if any)."""
        if div.kind is Kind.STRUCTURE:
            for op, trace, run, other in (
                (div.b, self.trace_b, "B", "A"),
                (div.a, self.trace_a, "A", "B"),
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

    def _unrecorded_gpu_work(self, div: Divergence) -> str:
        """An origin whose inputs were equal as recorded, in a run that launched GPU work
        OpGuard did not record after one of those inputs was produced and before the op read
        it: that work may have changed the input after its fingerprint was taken."""
        found = []
        for run, trace, op in (("A", self.trace_a, div.a), ("B", self.trace_b, div.b)):
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


MAX_WINDOW_SCAN = 1_000_000  # ops read to narrow an unrecorded write down


def _write_window(
    run: Side, trace: RankTrace, produced: tuple[int, int], reader: int
) -> WriteWindow | None:
    """Narrows down when a tensor changed without a recorded op: the readers of output
    ``produced`` up to op ``reader`` saw its content unchanged until one did not. None when
    every reader (``reader`` included) saw what was written."""
    written = _output(trace.op(produced[0]), produced[1])
    if written is None:
        return None
    after = produced[0]
    for op in trace.ops(produced[0] + 1, min(reader + 1, produced[0] + 1 + MAX_WINDOW_SCAN)):
        for t in op.inputs:
            if t.producer != produced or t.content_key() is None:
                continue
            if content_of(t) != content_of(written):
                kernels, total = trace.unclaimed_between(after, op.index, MAX_WINDOW_KERNELS)
                return WriteWindow(run, produced[0], after, op.index, tuple(kernels), total)
            after = op.index
    return None


def _never_written(t: TensorRecord, trace: RankTrace) -> bool:
    """Whether ``t`` was read from memory that no recorded op wrote: it is marked so, or its
    producer's output was (``torch.empty`` reached through another alias of its storage)."""
    if t.is_uninitialized:
        return True
    if t.producer is None:
        return False
    out = _output(trace.op(t.producer[0]), t.producer[1])
    return out is not None and out.is_uninitialized


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


def _output(op: OpRecord, slot: int) -> TensorRecord | None:
    return op.outputs[slot] if 0 <= slot < len(op.outputs) else None


def argument_text(d: ArgumentDiff) -> str:
    """``name: A's value (A) vs B's value (B)``; an argument not passed reads "default"."""
    a = plain_value(d.a) if d.a_passed else "default"
    b = plain_value(d.b) if d.b_passed else "default"
    return f"{d.name}: {a} (A) vs {b} (B)"


def _op_text(op: OpRecord) -> str:
    """An op and its site; a backward op that borrowed its forward op's site says so."""
    gradient = "gradient of " if op.is_backward and op.forward_index is not None else ""
    return f"{op.op} ({gradient}{op.call_site.short()})"


def summarise(div: Divergence) -> str:
    """One line a person (or a script) can act on."""
    obs = div.observed_a
    where = f"{obs.op} at {obs.call_site.short()}"
    words = WORDS[div.cause].summary
    if div.cause is Cause.ORIGIN:
        made = words.format(where=where)
        top = first_cause(div.likely_causes)  # kernels that differ always give one
        if top is None:
            return f"{made} (nondeterministic kernel, race, different kernel or hardware fault)"
        if div.kernels_differ and top.kind != KERNELS:
            a, b = kernel_names(div.observed_a), kernel_names(div.observed_b)
            return (
                f"{made}: {top.cause}; the runs launched different kernels "
                f"({', '.join(a) or 'none'} vs {', '.join(b) or 'none'})"
            )
        return f"{made}: {top.cause}"
    if div.cause is Cause.ARGUMENT:
        shown = ", ".join(argument_text(d) for d in div.arguments[:3])
        op = div.a or obs
        return words.format(op=op.op, site=op.call_site.short(), shown=shown)
    if div.cause is Cause.RNG:
        return words.format(where=where)
    if div.cause in (Cause.LEAF, Cause.EARLIER_STEP, Cause.UNRECORDED_WRITE):
        link = div.chain[-1] if div.chain else None
        last = link.a if link else obs
        how = div.race or "changed by code OpGuard did not record" + "".join(
            f"; {w.text()}" for w in div.windows
        )
        return words.format(
            slot=link.slot if link else "?",
            op=last.op,
            site=last.call_site.short(),
            step=div.step,
            how=how,
        )
    if div.cause is Cause.INSERTED and div.b is not None:
        return words.format(op=_op_text(div.b), where=where)
    if div.cause is Cause.REMOVED and div.a is not None:
        return words.format(op=_op_text(div.a), where=where)
    if div.cause is Cause.REPLACED and div.a is not None and div.b is not None:
        return words.format(a=_op_text(div.a), b=_op_text(div.b), where=where)
    return f"outputs of {where} differ"
