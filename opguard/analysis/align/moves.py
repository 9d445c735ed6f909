"""Ops that moved: what an op of one run computed, the other run computes too, at another point.

An alignment is monotone: when two runs compute the same things in another order (a sum taken
over the parameters reversed, two independent statements swapped), some pairs it makes read
tensors that the other run reads elsewhere, and their outputs differ although nothing was
computed differently. A *twin* is the evidence: the op of the other run, in the same step, that
is the same op (name, phase, input dtypes and shapes) and wrote an output of equal content.
Found by content, so it holds whatever the alignment paired.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

from ...store import CallSite, OpRecord, RankTrace, TensorRecord
from ..words.verdict import Side
from .steps import StepIndex

MAX_STEP_OPS = 50_000  # ops of one step decoded to find twins; a larger step is not searched
MAX_CHAIN = 64  # partial results followed back at one call site

Ref = tuple[int, int]  # (op index, output slot)
Signature = tuple[Any, ...]


def signature(op: OpRecord) -> Signature:
    """What two ops must share to be one computation: name, phase, inputs' dtypes and shapes."""
    return (op.op, op.phase, tuple((t.dtype, t.shape) for t in op.inputs))


def crossed(
    traces: tuple[RankTrace, RankTrace],
    partners: tuple[Callable[[int], int | None], Callable[[int], int | None]],
    ta: TensorRecord,
    tb: TensorRecord,
) -> bool:
    """Whether run A's input ``ta`` and run B's ``tb`` of an aligned pair were read in the
    other order: the outputs that they are were each written by a paired op (``partners``: A's
    op -> B's, B's -> A's) but are not each other's counterpart (another op, or another output
    of one op: a foreach update writes every parameter), and each input is, bit for bit, what
    its producer's partner wrote in that output in the other run. Each run then reads what the
    other reads at another point (a sum over the parameters reversed), where an op that only
    one run has (a cast) would leave the contents apart."""
    for side, tensor, other in ((0, ta, tb), (1, tb, ta)):
        produced = tensor.producer
        if produced is None or other.producer is None:
            return False
        partner = partners[side](produced[0])
        slot = produced[1]
        if partner is None or (partner, slot) == tuple(other.producer):
            return False
        op = traces[1 - side].op(partner)
        if not 0 <= slot < len(op.outputs):
            return False
        key = tensor.content_key()
        if key is None or op.outputs[slot].content_key() != key:
            return False
    return True


def call(op: OpRecord) -> tuple[Any, ...] | None:
    """What makes two ops one call: name, phase, arguments and the contents of the inputs
    (not the call site, whose file and text the two runs' scripts may word otherwise); None
    when an input's content is unknown."""
    inputs = tuple(t.content_key() for t in op.inputs)
    if None in inputs:
        return None
    return (op.op, op.phase, repr(op.args), inputs)


class Twins:
    """Twins of two traces' outputs (run A's, run B's), and of their calls, each step indexed
    on first use."""

    def __init__(self, traces: tuple[RankTrace, RankTrace]) -> None:
        self._traces = traces
        self._steps: list[StepIndex | None] = [None, None]
        # Each run's indexes of the last step asked about: the walk goes a step at a time, so
        # memory stays that of one step however long the runs are. (side -> (step, index))
        self._tables: dict[int, tuple[int, dict[Any, list[tuple[Ref, Signature]]]]] = {}
        self._calls: dict[int, tuple[int, set[int]]] = {}

    def repeated(self, side: Side, op: OpRecord) -> bool:
        """Whether the other run makes ``side``'s call ``op`` too, in the same step: the same
        op with equal arguments and inputs (:func:`call`)."""
        mine = call(op)
        return mine is not None and hash(mine) in self._calls_of(1 - side.value, op.step)

    def twin(self, side: Side, ref: Ref) -> Ref | None:
        """The output of the other run that is ``side``'s output ``ref`` computed again: same
        step, same op, equal content; None where there is none (or a view, whose content is
        its base's, or an output never read)."""
        op = self._traces[side.value].op(ref[0])
        if not 0 <= ref[1] < len(op.outputs):
            return None
        output = op.outputs[ref[1]]
        key = output.content_key()
        if key is None or output.is_view:
            return None
        mine = signature(op)
        other = 1 - side.value
        return next(
            (found for found, sig in self._table(other, op.step).get(key, ()) if sig == mine),
            None,
        )

    def _table(self, side: int, step: int) -> dict[Any, list[tuple[Ref, Signature]]]:
        """Content key -> the outputs of ``side``'s step ``step`` that hold it."""
        kept = self._tables.get(side)
        if kept is not None and kept[0] == step:
            return kept[1]
        table: dict[Any, list[tuple[Ref, Signature]]] = {}
        for op in self._step_ops(side, step):
            sig = signature(op)
            for slot, output in enumerate(op.outputs):
                key = output.content_key()
                if key is not None and not output.is_view:
                    table.setdefault(key, []).append(((op.index, slot), sig))
        self._tables[side] = (step, table)
        return table

    def _calls_of(self, side: int, step: int) -> set[int]:
        """The calls (:func:`call`) ``side``'s step ``step`` makes."""
        kept = self._calls.get(side)
        if kept is not None and kept[0] == step:
            return kept[1]
        # Hashes, not the calls: a step's worth of input keys would cost what the walk saves.
        calls = {hash(c) for c in map(call, self._step_ops(side, step)) if c is not None}
        self._calls[side] = (step, calls)
        return calls

    def _step_ops(self, side: int, step: int) -> Iterator[OpRecord]:
        """``side``'s ops of step ``step``, decoded one at a time; none where the step is too
        long to search."""
        trace = self._traces[side]
        index = self._steps[side]
        if index is None:
            index = self._steps[side] = StepIndex(trace)
        found = index.get(step)
        if found is None or found.stop - found.start > MAX_STEP_OPS:
            return iter(())
        return iter(trace.ops(found.start, found.stop))


Partner = Callable[[Side, int], "int | None"]  # (run, op index) -> the other run's op, if paired


class Reorders:
    """The aligned pairs of two traces found to be steps of a computation the runs take in
    another order (a sum over the parameters reversed), as the walk meets them. Such a pair is
    not one op in both runs: for an input that differs it reads what the other run reads at
    another point (:func:`crossed`, or a :class:`Twins` of what it reads), or a partial result
    of such a computation made at its own call site (the next term of the sum). ``partner``:
    the pairing the caller trusts (without the pairs found here)."""

    def __init__(self, traces: tuple[RankTrace, RankTrace], partner: Partner) -> None:
        self.traces = traces
        self._partner = partner
        self.twins = Twins(traces)
        self.found: tuple[set[int], set[int]] = (set(), set())  # A's op indices, B's
        self._moved: tuple[dict[int, bool], dict[int, bool]] = ({}, {})

    def find(self, op_a: OpRecord, op_b: OpRecord, *, outputs_elsewhere: bool = True) -> bool:
        """Whether aligned ops ``op_a``/``op_b`` are such a step; remembered when they are.
        ``outputs_elsewhere``: False where the caller knows that an output of one is made by
        no op of the other run's step (then neither is a call the other run makes, and the
        step is not searched)."""
        calls = outputs_elsewhere and self._crossed_calls(op_a, op_b)
        if not (calls or self._crossed_inputs(op_a, op_b)):
            return False
        self.found[0].add(op_a.index)
        self.found[1].add(op_b.index)
        return True

    def moved(self, side: Side, index: int, site: CallSite, depth: int = 0) -> bool:
        """Whether ``side``'s op ``index``, not paired, is part of such a computation read at
        call site ``site``: it computes what the other run computes elsewhere (an output has a
        twin), or it is a partial result of one made at ``site`` (a pair found here, or an op
        there reading one)."""
        if self._partner(side, index) is not None:
            return False
        op = self.traces[side.value].op(index)
        if any(self.twins.twin(side, (index, slot)) for slot in range(len(op.outputs))):
            return True
        if op.call_site != site or depth >= MAX_CHAIN:
            return False
        memo = self._moved[side.value]
        found = memo.get(index)
        if found is None:
            found = memo[index] = index in self.found[side.value] or any(
                self.moved(side, t.producer[0], site, depth + 1)
                for t in op.inputs
                if t.producer is not None
            )
        return found

    def _crossed_inputs(self, op_a: OpRecord, op_b: OpRecord) -> bool:
        """Whether an input that differs is what the other run reads at another point, or a
        partial result of a computation taken in another order."""
        differing = [
            (ta, tb)
            for ta, tb in _inputs_by_slot(op_a, op_b)
            if ta.content_key() != tb.content_key() and ta.producer and tb.producer
        ]
        return any(self._crossed(ta, tb, op_a, op_b) for ta, tb in differing)

    def _crossed_calls(self, op_a: OpRecord, op_b: OpRecord) -> bool:
        """Whether the ops read equal inputs with other arguments, each the call the other run
        makes elsewhere in the step (the backward of a sum over the parameters reversed
        expands its gradient to each parameter's shape in the other order)."""
        if op_a.args == op_b.args:
            return False
        if any(ta.content_key() != tb.content_key() for ta, tb in _inputs_by_slot(op_a, op_b)):
            return False
        return self.twins.repeated(Side.A, op_a) and self.twins.repeated(Side.B, op_b)

    def _crossed(self, ta: TensorRecord, tb: TensorRecord, op_a: OpRecord, op_b: OpRecord) -> bool:
        pa, pb = ta.producer, tb.producer
        assert pa is not None and pb is not None
        if (self._partner(Side.A, pa[0]), pa[1]) == tuple(pb):  # counterparts: not crossed
            return False
        partners = (lambda a: self._partner(Side.A, a), lambda b: self._partner(Side.B, b))
        if crossed(self.traces, partners, ta, tb):
            return True
        return self.moved(Side.A, pa[0], op_a.call_site) and self.moved(
            Side.B, pb[0], op_b.call_site
        )


class Unreordered:
    """An alignment (``b_of``, ``a_of``, ``compared``) without the pairs ``reorders`` found:
    to whoever asks for partners, they are two ops."""

    def __init__(self, alignment: Any, reorders: Reorders) -> None:
        self.base = alignment
        self.reorders = reorders

    def b_of(self, a_index: int) -> int | None:
        found = self.reorders.found[0]
        return None if a_index in found else self.base.b_of(a_index)

    def a_of(self, b_index: int) -> int | None:
        found = self.reorders.found[1]
        return None if b_index in found else self.base.a_of(b_index)

    def compared(self, index: int, side: int) -> bool:
        return bool(self.base.compared(index, side))

    def partner(self, side: Side, index: int) -> int | None:
        return self.b_of(index) if side is Side.A else self.a_of(index)


def _inputs_by_slot(op_a: OpRecord, op_b: OpRecord) -> list[tuple[TensorRecord, TensorRecord]]:
    """The inputs both ops have, by slot."""
    theirs = {t.slot: t for t in op_b.inputs}
    return [(t, theirs[t.slot]) for t in op_a.inputs if t.slot in theirs]
