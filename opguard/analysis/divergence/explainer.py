"""Classifying the first observed difference and following it back to its cause.

The walk in :mod:`opguard.analysis.diff` finds the first aligned pair of ops whose outputs
differ. The :class:`Explainer` classifies it: if the inputs and arguments were equal the op
itself is the origin; if only a non-tensor argument or the RNG state differed it is an argument
change; otherwise it follows the producers of the differing input back until it reaches a leaf
(data, parameters), an op that exists in only one run, or a tensor changed by code OpGuard did
not see. :mod:`.findings` then adds the evidence for it.
"""

from __future__ import annotations

from typing import Protocol

from ...store import OpRecord, RankTrace, TensorRecord
from ..align.moves import Reorders, Unreordered, crossed
from ..words.verdict import Cause, Kind, Side
from .findings import add_findings
from .model import (
    MAX_WINDOW_KERNELS,
    MAX_WINDOW_SCAN,
    ArgumentDiff,
    Divergence,
    Link,
    TensorDiff,
    WriteWindow,
    content_of,
    differing_arguments,
    differing_tensors,
)
from .reach import Absorbed

MAX_CHAIN = 64


class Alignment(Protocol):
    """What the explainer needs of the alignment: partners of ops, and which ops were compared
    (``side`` 0 is run A, 1 is run B)."""

    def b_of(self, a_index: int) -> int | None: ...

    def a_of(self, b_index: int) -> int | None: ...

    def compared(self, index: int, side: int) -> bool: ...


class Explainer:
    """Explains the first differing aligned pair, given both traces and the alignment."""

    def __init__(
        self,
        trace_a: RankTrace,
        trace_b: RankTrace,
        alignment: Alignment,
        *,
        reorders: bool = False,
    ) -> None:
        """``reorders``: find the pairs that are steps of a computation the runs take in
        another order (:meth:`reordered`, the bitwise walk); to the explanation they are two
        ops."""
        self.trace_a = trace_a
        self.trace_b = trace_b
        self.reorders: Reorders | None = None
        if reorders:
            unreordered = Unreordered(alignment, Reorders((trace_a, trace_b), self._partner))
            self.reorders, alignment = unreordered.reorders, unreordered
        self.alignment = alignment
        # Outputs whose difference reached nothing (.reach): (op index in A, in B, slot).
        self._absorbed: set[tuple[int, int, int]] = set()

    def _partner(self, side: Side, index: int) -> int | None:
        align = self.alignment
        return align.b_of(index) if side is Side.A else align.a_of(index)

    def reordered(self, op_a: OpRecord, op_b: OpRecord, *, outputs_elsewhere: bool = True) -> bool:
        """Whether the differing aligned ops are a step of a computation the runs take in
        another order (a sum over the parameters reversed): their partial results are not a
        divergence; where its result differs, the first op reading it names it.
        ``outputs_elsewhere``: as :meth:`~..align.moves.Reorders.find` takes it."""
        return self.reorders is not None and self.reorders.find(
            op_a, op_b, outputs_elsewhere=outputs_elsewhere
        )

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
        return add_findings(div, (self.trace_a, self.trace_b), inputs_equal=True)

    def explain_at(
        self,
        op_a: OpRecord,
        op_b: OpRecord,
        cause: Cause,
        slot: str = "",
        producers: tuple[tuple[int, int] | None, tuple[int, int] | None] = (None, None),
    ) -> Divergence:
        """The divergence at ops whose difference rounding does not explain (the tolerant
        walk, :mod:`opguard.analysis.tolerant`), classified there instead of followed back: their inputs may
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
        return add_findings(div, (self.trace_a, self.trace_b), inputs_equal=False)

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
                    if _other_views(slot):  # equal data read through other views: no write
                        made_a = _view_maker(self.trace_a, pa, op_a.index, slot.a)
                        made_b = _view_maker(self.trace_b, pb, op_b.index, slot.b)
                        if made_a is not None or made_b is not None:
                            self._structure(div, made_a, made_b)
                            return
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
        """The two runs' producers of the differing input (of the chain's last link) are not
        partners: name the op that exists in one run only. A producer that has a partner
        elsewhere in the other run is not the cause (it exists in both); the other side's
        unpartnered op is. Where both have partners elsewhere, nothing exists in one run only:
        the reading ops take, in each run, what the other run computes at another point (a sum
        in another order, reordered statements: :func:`~..align.moves.crossed`), and they are
        named."""
        align = self.alignment
        div.kind = Kind.STRUCTURE
        cause_a = self.trace_a.op(pa[0]) if pa is not None else None
        cause_b = self.trace_b.op(pb[0]) if pb is not None else None
        if cause_a is not None and cause_b is not None:
            a_partnered = align.b_of(cause_a.index) is not None
            b_partnered = align.a_of(cause_b.index) is not None
            if div.chain and self._crossed(div.chain[-1]):
                link = div.chain[-1]
                div.a, div.b, div.cause = link.a, link.b, Cause.REORDERED
                return
            if self._moved(cause_a, cause_b, div.chain[-1] if div.chain else None):
                div.a, div.b, div.cause = cause_a, cause_b, Cause.REORDERED
                inputs, _, arguments, rng = self._assess(cause_a, cause_b)
                if arguments and not inputs:  # calls in another order: their arguments differ
                    div.arguments, div.rng_differs = arguments, rng
                    div.chain.append(Link(cause_a, cause_b, ""))
                    self._settle(div, cause_a, cause_b, [])
                return
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

    def _moved(self, cause_a: OpRecord, cause_b: OpRecord, link: Link | None) -> bool:
        """Whether both runs' producers of the link's input are the results of a computation
        the runs take in another order (:meth:`reordered` found it)."""
        if self.reorders is None or link is None:
            return False
        return self.reorders.moved(Side.A, cause_a.index, cause_a.call_site) and (
            self.reorders.moved(Side.B, cause_b.index, cause_b.call_site)
        )

    def _crossed(self, link: Link) -> bool:
        """Whether the link's differing input was read in the other order in the two runs."""
        ta = next((t for t in link.a.inputs if t.slot == link.slot), None)
        tb = next((t for t in link.b.inputs if t.slot == link.slot), None)
        if ta is None or tb is None:
            return False
        traces = (self.trace_a, self.trace_b)
        return crossed(traces, (self.alignment.b_of, self.alignment.a_of), ta, tb)


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


def _other_views(slot: TensorDiff) -> bool:
    """Whether the runs read the differing input through views of other shapes or strides (a
    weight and its transpose ``W.T``): a view's fingerprint is its base's seen through its
    geometry, so equal data read through other views differs without any write."""
    a, b = slot.a, slot.b
    return (
        a is not None
        and b is not None
        and (a.is_view or b.is_view)
        and (a.shape, a.stride) != (b.shape, b.stride)
    )


def _view_maker(
    trace: RankTrace, produced: tuple[int, int], reader: int, tensor: TensorRecord | None
) -> tuple[int, int] | None:
    """The output that is view ``tensor`` of output ``produced``, read by op ``reader``: made by
    the last op between them that read that output and returned a view of the geometry read;
    None where ``tensor`` is not a view or no recorded op made it."""
    if tensor is None or not tensor.is_view:
        return None
    geometry = (tensor.dtype, tensor.shape, tensor.stride)
    ops = trace.ops(max(produced[0] + 1, reader - MAX_WINDOW_SCAN), reader)
    for op in reversed(list(ops)):
        if any(t.producer == produced for t in op.inputs):
            for slot, out in enumerate(op.outputs):
                if out.is_view and (out.dtype, out.shape, out.stride) == geometry:
                    return op.index, slot
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


def _output(op: OpRecord, slot: int) -> TensorRecord | None:
    return op.outputs[slot] if 0 <= slot < len(op.outputs) else None
