"""Two runs' tensor entries' distance where their sketches do not give it at once: a view has no
sketch of its own (its fingerprint is derived from its base's), so its distance is its base's;
a view nothing read is bounded by the outputs of the op that moves it."""

from __future__ import annotations

from ...store import OpRecord, RankTrace, TensorRecord
from ..words.verdict import Side
from .distance import Distance, tensor_distance
from .families import keeps_every_value

MAX_VIEW_CHAIN = 16  # views (and moves) followed back to a base, a writer or a computing op


class Distances:
    """Distances of tensor entries of two traces (run A's, run B's), through views."""

    def __init__(self, traces: tuple[RankTrace, RankTrace]) -> None:
        self.traces = traces

    def between(self, ta: TensorRecord, tb: TensorRecord) -> Distance | None:
        """Two runs' entries' distance, from their sketches or their bases'."""
        return tensor_distance(ta, tb) or self._through_views(ta, tb)

    def bound_by_outputs(
        self, op_a: OpRecord, op_b: OpRecord, ta: TensorRecord, tb: TensorRecord
    ) -> Distance | None:
        """The distance of an input that has none (a view nothing read, so without a sketch of
        its own: a math attention's transposed gradient) bounded by the outputs of the aligned
        op that moves it (a ``stack``): they hold the input's difference, so it is at most
        theirs, taken relative to the input's norm in the run where it has one (A's first).
        None where that is not known."""
        moved = keeps_every_value(op_a) and keeps_every_value(op_b) and op_a.outputs
        norm = next((t.sketch.norm for t in (ta, tb) if t.sketch is not None), None)
        if not moved or not norm:
            return None
        estimate, high = 0.0, 0.0
        for oa, ob in zip(op_a.outputs, op_b.outputs, strict=False):
            output = self.between(oa, ob)
            if output is None:
                return None
            scale = (output.norm_a or 0.0) / norm  # 0 for equal outputs
            estimate, high = max(estimate, output.estimate * scale), max(high, output.high * scale)
        norm_a, norm_b = (norm, None) if ta.sketch is not None else (None, norm)
        return Distance(estimate, 0.0, high, 0.0, norm_a, norm_b, True, bound=True)

    def _through_views(self, ta: TensorRecord, tb: TensorRecord) -> Distance | None:
        """Two views' distance as their bases'. A view's fingerprint is derived from its
        base's without reading it, so it has a sketch only where it is its base in the base's
        order; a transposed or permuted view holds all of the base's values (the same distance,
        exactly), a slice a part of them (the base's distance is then an estimate: a
        difference spread like rounding is spread alike over the part). Only views of one
        geometry (shape and strides) over bases of one shape compare: their bases' sketches
        are then keyed alike."""
        if not (ta.is_view and tb.is_view and (ta.shape, ta.stride) == (tb.shape, tb.stride)):
            return None
        base_a, base_b = self.base(Side.A, ta), self.base(Side.B, tb)
        if base_a is None or base_b is None:
            return None
        return tensor_distance(base_a, base_b)

    def base(self, side: Side, view: TensorRecord, *, stats: bool = False) -> TensorRecord | None:
        """The nearest entry with a sketch (``stats``: with stats, which a view's entry never
        has) that ``view`` was made from: the tensor its producer wrote, or, where that is a
        view too, the view op's input."""

        def found(entry: TensorRecord) -> bool:
            return (entry.stats if stats else entry.sketch) is not None

        entry = view
        for _ in range(MAX_VIEW_CHAIN):
            if found(entry):
                return entry
            if entry.producer is None:
                return None
            op = self.traces[side.value].op(entry.producer[0])
            slot = entry.producer[1]
            written = op.outputs[slot] if 0 <= slot < len(op.outputs) else None
            if written is not None and found(written):
                return written
            if not op.inputs:
                return None
            entry = op.inputs[0]
        return None
