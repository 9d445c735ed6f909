"""Ops that moved: what an op of one run computed, the other run computes too, at another point.

An alignment is monotone: when two runs compute the same things in another order (a sum taken
over the parameters reversed, two independent statements swapped), some pairs it makes read
tensors that the other run reads elsewhere, and their outputs differ although nothing was
computed differently. A *twin* is the evidence: the op of the other run, in the same step, that
is the same op (name, phase, input dtypes and shapes) and wrote an output of equal content.
Found by content, so it holds whatever the alignment paired.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ...store import OpRecord, RankTrace, TensorRecord
from ..words.verdict import Side
from .steps import StepIndex

MAX_STEP_OPS = 50_000  # ops of one step decoded to find twins; a larger step is not searched

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
    other order: the ops that wrote them are each paired with another op (``partners``: A's
    op -> B's, B's -> A's), and each input is, bit for bit, what its producer's partner wrote
    in the other run. Each run then reads what the other reads at another point (a sum over
    the parameters reversed), where an op that only one run has (a cast) would leave the
    contents apart."""
    for side, tensor, other in ((0, ta, tb), (1, tb, ta)):
        produced = tensor.producer
        if produced is None or other.producer is None:
            return False
        partner = partners[side](produced[0])
        if partner is None or partner == other.producer[0]:
            return False
        op = traces[1 - side].op(partner)
        slot = produced[1]
        if not 0 <= slot < len(op.outputs):
            return False
        key = tensor.content_key()
        if key is None or op.outputs[slot].content_key() != key:
            return False
    return True


class Twins:
    """Twins of two traces' outputs (run A's, run B's), each step indexed on first use."""

    def __init__(self, traces: tuple[RankTrace, RankTrace]) -> None:
        self._traces = traces
        self._steps: list[StepIndex | None] = [None, None]
        self._tables: dict[tuple[int, int], dict[Any, list[tuple[Ref, Signature]]]] = {}

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
        table = self._tables.get((side, step))
        if table is None:
            table = self._tables[(side, step)] = {}
            trace = self._traces[side]
            index = self._steps[side]
            if index is None:
                index = self._steps[side] = StepIndex(trace)
            found = index.get(step)
            if found is not None and found.stop - found.start <= MAX_STEP_OPS:
                for op in trace.ops(found.start, found.stop):
                    sig = signature(op)
                    for slot, output in enumerate(op.outputs):
                        key = output.content_key()
                        if key is not None and not output.is_view:
                            table.setdefault(key, []).append(((op.index, slot), sig))
        return table
