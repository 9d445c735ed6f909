"""Where the values of an input that differs were written, for the tolerant judge: by an
aligned pair (judged there), by no recorded op (a leaf), or by ops of one run only (a region,
whose own rounding and the aligned tensors it read bound what it may change). Views are
followed back to where their values were written; ops that only move values to the op that
computed them."""

from __future__ import annotations

from collections.abc import Callable

from ...store import OpRecord, RankTrace, TensorRecord
from ..align.moves import Reorders
from ..divergence.explainer import Alignment
from ..words.verdict import Side
from .distance import Distance
from .families import ESTIMATE, Bound, data_input, moves
from .judgement import Producer, Producers, Reason
from .unmeasured import Unmeasured
from .views import MAX_VIEW_CHAIN, Distances

MAX_REGION = 64  # ops of one run only followed back from an input they wrote
# The bound of an output of an op of one run only: (its run, the op, the output's position).
BoundOf = Callable[[Side, OpRecord, int], Bound]


class Sources:
    """The sources of one rank's tensors across the two runs, given the walk's alignment."""

    def __init__(
        self,
        traces: tuple[RankTrace, RankTrace],
        alignment: Alignment,
        distances: Distances,
        unmeasured: Unmeasured,
    ) -> None:
        self.traces = traces
        self.alignment = alignment
        self.distances = distances
        self.unmeasured = unmeasured
        # Aligned pairs whose tensors have other shapes: not one op in both runs (the
        # alignment paired two ops of one name, as a fused optimizer's one add with a foreach
        # optimizer's other), judged as ops of one run only (indices in A, in B).
        self._unpaired: set[tuple[int, int]] = set()
        self.reorders = Reorders(traces, self.partner)

    def reordered(self, op_a: OpRecord, op_b: OpRecord) -> bool:
        """Whether aligned ops are a step of a computation the runs take in another order
        (:class:`~..align.moves.Reorders`): their outputs are partial results that need not
        agree; what the computation makes is judged where an op at another call site reads
        it. Such a pair is unpaired."""
        if not self.reorders.find(op_a, op_b):
            return False
        self.unpair(op_a.index, op_b.index)
        return True

    def unpair(self, index_a: int, index_b: int) -> None:
        """Tells that aligned ops ``index_a``/``index_b`` are two ops, not one in both runs."""
        self._unpaired.add((index_a, index_b))

    def source(self, ta: TensorRecord, tb: TensorRecord) -> tuple[Reason | None, Producers]:
        """LEAF or STRUCTURE for an input rounding must explain by itself, with the ops that
        wrote it; None for one an aligned pair wrote (judged there). An aligned pair whose
        outputs are views was not judged (a view's values are its base's): the views are
        followed back to where their values were written, and a pair of view ops whose
        arguments differ (a slice one row later, another ``narrow``) is ARGUMENT, with the
        view ops as producers: it selects other values, a real change."""
        align = self.alignment
        for _ in range(MAX_VIEW_CHAIN):
            pa, pb = ta.producer, tb.producer
            if pa is None and pb is None:
                return Reason.LEAF, (pa, pb)
            if pa is not None and pb is not None and self.paired(pa[0], pb[0]):
                # An input entry is not marked a view where its producer's output is one (an
                # index tensor sliced from the data): the producers are read to know.
                op_a, op_b = self.traces[0].op(pa[0]), self.traces[1].op(pb[0])
                if not (_is_view(op_a, pa[1]) or _is_view(op_b, pb[1])):
                    return None, (pa, pb)
                if op_a.args != op_b.args:
                    return Reason.ARGUMENT, (pa, pb)
                if not (op_a.inputs and op_b.inputs):
                    break
                ta, tb = op_a.inputs[0], op_b.inputs[0]
                continue
            if (pa is None or not align.compared(pa[0], 0)) and (
                pb is None or not align.compared(pb[0], 1)
            ):
                return Reason.LEAF, (pa, pb)  # made before the compared steps (--step): as data
            return Reason.STRUCTURE, (pa, pb)
        return None, (ta.producer, tb.producer)

    def paired(self, index_a: int, index_b: int) -> bool:
        """Whether A's op ``index_a`` and B's ``index_b`` are one op in both runs."""
        return self.partner(Side.A, index_a) == index_b

    def partner(self, side: Side, index: int) -> int | None:
        """The other run's op that ``side``'s op ``index`` is one op with: aligned to it and
        not told apart (an unpaired pair is two ops); None where there is none."""
        other = (self.alignment.b_of if side is Side.A else self.alignment.a_of)(index)
        if other is None:
            return None
        pair = (index, other) if side is Side.A else (other, index)
        return None if pair in self._unpaired else other

    def region_bound(self, producers: Producers, bound_of: BoundOf) -> float:
        """How far apart rounding may leave an input that ops of one run only wrote (followed
        back through other such ops, and through aligned ops whose outputs are views, which
        judged nothing), in each run that has such ops: from the aligned tensors they read
        (their estimated distance, :data:`~.families.ESTIMATE` times), each op of the region
        adds what its family's bound allows (``bound_of``: a cast to bfloat16 only one run has
        rounds at bfloat16); the two runs' regions add up."""
        total = 0.0
        for side, produced in zip(Side, producers, strict=True):
            if produced is not None:
                total += self._written(side, produced, bound_of, {})
        return total

    def _written(
        self, side: Side, producer: Producer, bound_of: BoundOf, seen: dict[Producer, float]
    ) -> float:
        """The bound of the tensor ``producer`` wrote in ``side``'s run (``seen``: the region's
        tensors bounded so far; past :data:`MAX_REGION` of them, no more is followed)."""
        if producer in seen:
            return seen[producer]
        seen[producer] = 0.0
        if len(seen) > MAX_REGION:
            return 0.0
        index, slot = producer
        op = self.traces[side.value].op(index)
        other = self.partner(side, index)
        if other is not None and not self._views(side, op, other, slot):
            found = ESTIMATE * self._aligned_distance(side, index, other)
        else:
            read = max(
                (self._written(side, t.producer, bound_of, seen) for t in op.inputs if t.producer),
                default=0.0,
            )
            carried = other is not None or moves(op) or not 0 <= slot < len(op.outputs)
            found = read if carried else bound_of(side, op, slot).propagate(read)
        seen[producer] = found
        return found

    def _views(self, side: Side, op: OpRecord, other: int, slot: int) -> bool:
        """Whether output ``slot`` of the aligned pair of ``side``'s ``op`` and the other run's
        op ``other`` is a view in either run (a pair whose outputs were not judged)."""
        return _is_view(op, slot) or _is_view(self.traces[1 - side.value].op(other), slot)

    def computing(self, side: Side, producer: Producer | None) -> Producer | None:
        """The op that computed the values ``producer`` wrote: followed back through ops that
        only move values (views, copies) to the one that made them, the op to name. An op
        aligned with one of the other run is in both runs, not the region's: where the walk
        ends at one (a slice both runs take of data both made), the region's last op of one
        run only on the way is named."""
        if producer is None:
            return None
        at, named = producer, None
        for _ in range(MAX_VIEW_CHAIN):
            if self.partner(side, at[0]) is None:
                named = at
            op = self.traces[side.value].op(at[0])
            source = data_input(op) if moves(op) else 0 if _is_view(op, at[1]) else None
            written = (
                op.inputs[source].producer
                if source is not None and source < len(op.inputs)
                else None
            )
            if written is None:
                break
            at = written
        return at if named is None or self.partner(side, at[0]) is None else named

    def written_distance(self, producers: Producers) -> Distance | None:
        """The distance of the outputs an aligned pair of ops wrote (``producers``, in A and
        in B); None where they are not one op in both runs or it is not measured."""
        pa, pb = producers
        if pa is None or pb is None or not self.paired(pa[0], pb[0]):
            return None
        out_a, out_b = self.traces[0].op(pa[0]).outputs, self.traces[1].op(pb[0]).outputs
        if not (0 <= pa[1] < len(out_a) and 0 <= pb[1] < len(out_b)):
            return None
        return self.distances.between(out_a[pa[1]], out_b[pb[1]])

    def _aligned_distance(self, side: Side, index: int, other: int) -> float:
        """The largest distance between the outputs of an aligned pair: what was taken for
        an output whose distance is unknown (:class:`~.unmeasured.Unmeasured`), 0 where
        nothing was (the region's bound is then only what the region's own rounding
        explains)."""
        mine, theirs = self.traces[side.value].op(index), self.traces[1 - side.value].op(other)
        ops = (mine, theirs) if side is Side.A else (theirs, mine)
        largest = 0.0
        for slot, (ta, tb) in enumerate(zip(ops[0].outputs, ops[1].outputs, strict=False)):
            distance = self.distances.between(ta, tb)
            if distance is not None:
                largest = max(largest, distance.spread)
            elif (taken := self.unmeasured.taken((ops[0].index, slot))) is not None:
                largest = max(largest, taken[0])
        return largest


def _is_view(op: OpRecord, slot: int) -> bool:
    """Whether ``op``'s output ``slot`` is a view (its values are its base's)."""
    return 0 <= slot < len(op.outputs) and op.outputs[slot].is_view
