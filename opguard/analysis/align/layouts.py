"""Two runs of one model in different parallel layouts (TP=N against TP=1): which ops pair up,
which ops of one run are its layout's own, and which tensors hold the same logical value.

A rank of a tensor-parallel run (DTensor) records the local ops it runs on its shards, with
local shapes, the collectives DTensor issues for it, and DTensor's bookkeeping ops; it records
neither the DTensor-level op nor its placements nor the shards' offsets. This module works from
what two such traces hold:

- **alignment**: keys whose input signature holds each shape's rank, not its sizes, so that call
  site and op anchor a shard against its whole tensor (:class:`LayoutKeys`); each pair's
  shapes are then checked (:func:`relate`): equal, or one is the other split along one dimension
  by the layouts' degree (a shard);
- **partial values**: an output that a collective only its own run has reads (an all-reduce) is
  not its logical value (a partial sum has the logical shape and would look like a large
  change); the collective's output stands for it;
- **layout-only ops**: collectives only one run has, reshaping views, ops that record no
  output, and ops whose outputs only feed partial values (a replicated bias divided by the
  degree before a row-wise matmul) change no logical value; a view of a part of its input
  only one run has (a shard's slice) is a *selection*: which part it takes is not checked;
- a pair whose output is a shard of the other's cannot be compared by value until the recorder
  writes the shard's offset: it is reported as such, never guessed.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from ...store import OpRecord, RankTrace
from ...store.light import LightReader, OpColumns
from ..words.verdict import Side
from .keys import KeyTable, OpKeys
from .passes import align_step, pairs_of, records_of
from .steps import StepIndex

Shape = tuple[int, ...]
Tensor = tuple[int, int]  # (op index, output position)


class LayoutKeys(OpKeys):
    """:class:`~.keys.OpKeys` whose keys hold each input's dtype and number of dimensions, not
    its sizes: a local shard keys like the tensor it is a part of."""

    def signature(self, inputs: Any) -> tuple:
        return tuple((x.get("d"), len(x.get("s", ()))) for x in inputs)


class Relation(StrEnum):
    SAME = "same"  # equal shapes
    SHARD = "shard"  # one shape is the other split along one dimension by the degree
    OTHER = "other"  # not one tensor in two layouts


def relate(shape_a: Shape, shape_b: Shape, degree: int) -> tuple[Relation, int | None]:
    """How two aligned tensors' shapes relate, and the dimension a shard is split along. A
    shard is one of ``degree`` chunks as ``torch.chunk`` cuts them (the last may be smaller)."""
    if shape_a == shape_b:
        return Relation.SAME, None
    if len(shape_a) != len(shape_b) or degree < 2:
        return Relation.OTHER, None
    differing = [d for d, (x, y) in enumerate(zip(shape_a, shape_b, strict=True)) if x != y]
    if len(differing) == 1:
        dim = differing[0]
        whole, part = max(shape_a[dim], shape_b[dim]), min(shape_a[dim], shape_b[dim])
        chunk = -(-whole // degree)
        if part in (chunk, whole - chunk * (degree - 1)):
            return Relation.SHARD, dim
    return Relation.OTHER, None


class PairKind(StrEnum):
    COMPARABLE = "comparable"  # each output holds its logical value on both sides
    REDUCED = "reduced"  # an output is partial on one side: compared where a collective reduces it
    SHARDED = "sharded"  # an output is a shard of the other's: its offset is not recorded
    UNRELATED = "unrelated"  # output shapes that are not one tensor in two layouts


class OnlyKind(StrEnum):
    COLLECTIVE = "collective"  # a collective only this run has: layout, no value change
    NO_VALUE = "no value"  # a view of the whole input (a reshape), or an op recording no output
    SELECTION = "selection"  # a view of a part of its input: which part is not checked
    LAYOUT_INPUT = "layout input"  # its outputs feed only partial values, layout-only or unread ops
    UNREAD = "unread"  # nothing in the step reads its outputs
    STRUCTURE = "structure"  # an op only this run has whose outputs reach aligned ops


LAYOUT_ONLY = frozenset({OnlyKind.COLLECTIVE, OnlyKind.NO_VALUE, OnlyKind.LAYOUT_INPUT})
_NO_EFFECT = LAYOUT_ONLY | {OnlyKind.UNREAD}


@dataclass(frozen=True, slots=True)
class TensorPair:
    """Where each side holds one output's logical value, and whether the fingerprints agree
    (None: one of them was not read)."""

    a: Tensor
    b: Tensor
    equal: bool | None


@dataclass(frozen=True, slots=True)
class PairLayout:
    a: int  # op index in run A
    b: int  # op index in run B
    kind: PairKind
    compared: tuple[TensorPair, ...]  # the outputs compared by logical value
    reason: str  # why an output is not compared ("" when every one is)
    shards: int = 0  # outputs that are a shard of the other run's: not compared by value


@dataclass(frozen=True, slots=True)
class OnlyLayout:
    side: Side
    index: int
    kind: OnlyKind


@dataclass(frozen=True, slots=True)
class LayoutStep:
    step: int
    pairs: tuple[PairLayout, ...]
    only: tuple[OnlyLayout, ...]


def layout_degree(ranks_a: Sequence[int], ranks_b: Sequence[int]) -> int | None:
    """The layouts' degree (TP=N against TP=1: N), when one world size divides the other."""
    small, large = sorted((len(ranks_a), len(ranks_b)))
    return large // small if small and large % small == 0 else None


def rank_pairs(ranks_a: Sequence[int], ranks_b: Sequence[int]) -> list[tuple[int, int]] | None:
    """Which rank of A each rank of B is compared with: every rank against the one rank of a
    single-rank run, rank by rank for equal world sizes. None otherwise: which ranks hold one
    logical tensor then depends on the device mesh, which traces do not record."""
    if len(ranks_a) == len(ranks_b):
        return list(zip(ranks_a, ranks_b, strict=True))
    if len(ranks_a) == 1:
        return [(ranks_a[0], rank) for rank in ranks_b]
    if len(ranks_b) == 1:
        return [(rank, ranks_b[0]) for rank in ranks_a]
    return None


def layout_step(trace_a: RankTrace, trace_b: RankTrace, step: int, degree: int) -> LayoutStep:
    """One step of two ranks in different layouts: aligned pairs with what each compares, and
    the ops only one run has with whether they are the layout's own."""
    table = KeyTable()
    columns = (
        _step_columns(LightReader(trace_a, LayoutKeys(trace_a, table)), trace_a, step),
        _step_columns(LightReader(trace_b, LayoutKeys(trace_b, table)), trace_b, step),
    )
    matched = [
        (columns[0].index[i], columns[1].index[j])
        for i, j in pairs_of(align_step(*columns, records_of(trace_a, trace_b)))
    ]
    return layout_of(
        (trace_a, trace_b), step, (columns[0].index, columns[1].index), matched, degree
    )


def layout_of(
    traces: tuple[RankTrace, RankTrace],
    step: int,
    indices: tuple[Sequence[int], Sequence[int]],
    matched: Sequence[tuple[int, int]],
    degree: int,
) -> LayoutStep:
    """:func:`layout_step` of a step already aligned (the diff's walk aligns each step once):
    its ops' ``indices`` in each run and its aligned pairs (op indices in A, in B)."""
    sides = (
        _Side(traces[0], indices[0], {a for a, _ in matched}),
        _Side(traces[1], indices[1], {b for _, b in matched}),
    )
    pairs = tuple(_pair(sides, a, b, degree) for a, b in matched)
    partial = (
        {p.a for p in pairs if p.kind is PairKind.REDUCED},
        {p.b for p in pairs if p.kind is PairKind.REDUCED},
    )
    only = tuple(
        OnlyLayout(side, index, kind)
        for side in Side
        for index, kind in sides[side.value].only_kinds(partial[side.value]).items()
    )
    return LayoutStep(step, pairs, only)


def _step_columns(reader: LightReader, trace: RankTrace, step: int) -> OpColumns:
    found = StepIndex(trace).get(step)
    if found is None:
        raise ValueError(f"step {step} is not in {trace.path}")
    return reader.read(found.start, found.stop)


class _Side:
    """One run's ops of the step, decoded, with who reads each output (through views)."""

    def __init__(self, trace: RankTrace, indices: Iterable[int], matched: set[int]) -> None:
        self.ops = {index: trace.op(index) for index in indices}
        self.matched = matched
        self._readers: dict[Tensor, list[int]] = defaultdict(list)
        for op in self.ops.values():
            for entry in op.inputs:
                if entry.producer is not None:
                    self._readers[entry.producer].append(op.index)

    def unmatched(self) -> list[int]:
        return [index for index in self.ops if index not in self.matched]

    def readers(self, tensor: Tensor) -> list[int]:
        """The ops that read ``tensor``, looking through views of it."""
        found: list[int] = []
        pending = [tensor]
        while pending:
            for reader in self._readers.get(pending.pop(), ()):
                op = self.ops[reader]
                if op.outputs and all(out.is_view for out in op.outputs):
                    pending.extend((reader, k) for k in range(len(op.outputs)))
                else:
                    found.append(reader)
        return found

    def reduced(self, tensor: Tensor) -> Tensor | None:
        """The output of a collective only this run has that reads ``tensor``: its logical
        value (an all-reduce of a partial sum, an all-gather of a shard)."""
        for reader in self.readers(tensor):
            op = self.ops[reader]
            if reader not in self.matched and op.is_collective and op.outputs:
                return reader, 0
        return None

    def only_kinds(self, partial: set[int]) -> dict[int, OnlyKind]:
        """What each op only this run has is, last first: an op is the layout's input when
        every reader of its outputs is a partial value (``partial``), layout-only or unread."""
        kinds: dict[int, OnlyKind] = {}
        for index in sorted(self.unmatched(), reverse=True):
            op = self.ops[index]
            readers = [r for k in range(len(op.outputs)) for r in self.readers((index, k))]
            if op.is_collective:
                kinds[index] = OnlyKind.COLLECTIVE
            elif all(out.is_view or out.is_uninitialized for out in op.outputs):
                kinds[index] = OnlyKind.SELECTION if _selects(op) else OnlyKind.NO_VALUE
            elif not readers:
                kinds[index] = OnlyKind.UNREAD
            elif all(r in partial or kinds.get(r) in _NO_EFFECT for r in readers):
                kinds[index] = OnlyKind.LAYOUT_INPUT
            else:
                kinds[index] = OnlyKind.STRUCTURE
        return dict(sorted(kinds.items()))

    def output(self, tensor: Tensor) -> Any:
        return self.ops[tensor[0]].outputs[tensor[1]]


def _selects(op: OpRecord) -> bool:
    """Whether a view op returns a part of its input (a slice, a shard's chunk): its offset,
    an argument, decides which values the readers see (a shard loaded from the wrong offset
    enters a run through one)."""
    numel = [math.prod(entry.shape) for entry in op.inputs]
    return any(math.prod(out.shape) < max(numel, default=0) for out in op.outputs)


def _pair(sides: tuple[_Side, _Side], a: int, b: int, degree: int) -> PairLayout:
    outputs = (sides[0].ops[a].outputs, sides[1].ops[b].outputs)
    if len(outputs[0]) != len(outputs[1]):
        return PairLayout(a, b, PairKind.UNRELATED, (), "different numbers of outputs")
    compared: list[TensorPair] = []
    reasons: list[str] = []
    reduced_any = False
    for k, (out_a, out_b) in enumerate(zip(*outputs, strict=True)):
        if out_a.is_view and out_b.is_view:
            continue  # a view's data is its base's, compared where it is read
        where = [(a, k), (b, k)]
        for side in (0, 1):
            reduced = sides[side].reduced(where[side])
            if reduced is not None:
                where[side], reduced_any = reduced, True
        shape_a, shape_b = sides[0].output(where[0]).shape, sides[1].output(where[1]).shape
        relation, dim = relate(shape_a, shape_b, degree)
        if relation is Relation.SAME:
            compared.append(TensorPair(where[0], where[1], _equal(sides, where)))
        elif relation is Relation.SHARD:
            reasons.append(
                f"output {k}: {list(shape_a)} vs {list(shape_b)} is a shard along dim {dim} "
                "whose offset is not recorded"
            )
        else:
            return PairLayout(
                a, b, PairKind.UNRELATED, (), f"output {k}: {list(shape_a)} vs {list(shape_b)}"
            )
    kind = PairKind.SHARDED if reasons else PairKind.REDUCED if reduced_any else PairKind.COMPARABLE
    return PairLayout(a, b, kind, tuple(compared), "; ".join(reasons), len(reasons))


def _equal(sides: tuple[_Side, _Side], where: list[Tensor]) -> bool | None:
    out_a, out_b = sides[0].output(where[0]), sides[1].output(where[1])
    if out_a.hash is None or out_b.hash is None:
        return None
    return bool(out_a.hash == out_b.hash and out_a.dtype == out_b.dtype)
