"""The tolerant diff (``opguard diff --tolerant``): of two runs expected to differ by rounding
(another torch build or GPU, TF32, bf16 autocast, another parallel layout), the first op whose
difference rounding does not explain.

The walk is the bitwise diff's (:mod:`.diff`: the same alignment, ops in execution order); at
each aligned pair whose outputs differ, :class:`Judge` decides from the tensors' relative
distances (:mod:`.distance`) whether rounding explains it:

- a non-tensor argument that differs is rounding when it is a number within ``R * u`` of the
  other run's (a scalar computed from rounded values), else a real change (``argument``); a
  different RNG state is a real change too;
- an input that no recorded op produced (data, initial parameters), or that an op of one run
  only wrote, must be within rounding of its own: ``R * u`` for a leaf, ``A * d + R * u`` for
  a tensor written by ops of one run only, ``d`` the largest distance of the aligned tensors
  those ops read (``leaf``, ``structure``); an input an aligned op wrote was judged there,
  unless that op's output is a view (which judges nothing): views are followed back to where
  their values were written, and the ops that computed them are the ones named;
- the outputs' distance ``d_out`` (the largest) must be within ``A * d_in + R * u``, ``d_in``
  the largest distance of the inputs (0 when they are equal), ``u`` the op's unit roundoff
  (:mod:`.rounding`); else the op made the difference (``origin``, with its amplification
  ``d_out / d_in``);
- integer and bool outputs have no distance: where everything else is explained they are a
  comparison flipped by rounded values (counted, reported, explained);
- with a fixed bound (``--tolerant=REL``) every distance above is compared with ``REL``.

A tensor whose distance is needed and unknown (no sketch: a trace recorded before sketches,
no finite value; shapes that differ) is never guessed: the op is not explained, and the
bitwise answer is given for it, saying that the distance is unknown. (A view nothing read is
bounded where an op that only moves values, a ``stack``, reads it: by its outputs' distance.)

Cost: records are decoded only where fingerprints differ (as the bitwise walk decodes the first
difference), and each judgement is a few sketch distances; the walk stays linear.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from numbers import Real
from typing import Any

from ..store import OpRecord, RankTrace, TensorRecord
from .distance import EQUAL, Distance, finite, tensor_distance
from .divergence import Alignment, ArgumentDiff, Divergence, Explainer, differing_arguments
from .divergence import differing_tensors as differing
from .rounding import data_input, divides, dtype_unit, keeps_every_value, moves, op_unit
from .verdict import Cause, Kind, Side

Producer = tuple[int, int]  # (op index, output slot)
Producers = tuple[Producer | None, Producer | None]  # in A, in B

# The rule's constants: d_out <= A * d_in + R * u. A bounds how much an op may amplify its
# inputs' relative difference (a well-conditioned op: its condition number); R how many of its
# own roundings an op's output may carry relative to its norm (a reduction over K terms rounds
# about log2(K) levels deep). Measured with bench/tolerant_calibration.py (a 256-1024-10 MLP
# trained 3 steps with SGD, float32 as PyTorch computes it against every op computed in float64
# and rounded: 145 differing ops): amplification d_out/d_in median 1, max 16.5 (an addmm whose
# output is its own rounding, 3.5 u, over inputs 0.2 u apart); rounding left past 16 * d_in at
# most 3.5 u, so R = 64 leaves a factor of 18. With momentum 0.8 in run B from step 1, the
# momentum buffers' mul_ leaves 1.9e6 u (and is named as an argument change first).
A_FACTOR = 16.0
R_FACTOR = 64.0
# An op that divides by a tensor (Adam's update m / (sqrt(v) + eps), addcdiv) multiplies the
# relative difference of the elements it divides by small values: a normwise bound of 16 cannot
# hold there. Measured: AdamW's first step amplified a rounding difference 172x (CPU, math
# against flash attention, bench/tolerant_pairs.py), and foreach against fused AdamW left its
# parameters 2.0e-5 apart from gradients 1e-6 apart (~20x) two steps in. The weakest real
# change measured left 9,100 u of equal inputs (R's term), which this does not touch.
A_DIVIDING = 1024.0
DRIFT_AROUND = 5  # steps either side of the first divergence in the drift series


class Mode(StrEnum):
    AUTO = "auto"  # the rule above
    FIXED = "fixed"  # a relative bound given with --tolerant=REL


@dataclass(frozen=True, slots=True)
class Tolerance:
    """How differences are judged: the rule (``rel`` None) or a fixed relative bound."""

    rel: float | None = None
    amplification: float = A_FACTOR
    roundings: float = R_FACTOR

    @property
    def mode(self) -> Mode:
        return Mode.AUTO if self.rel is None else Mode.FIXED

    def limit(self, d_in: float, unit: float | None, dividing: bool = False) -> float:
        """What rounding explains of a tensor whose sources differ by ``d_in``, made by ops
        of which one divides by a tensor where ``dividing``."""
        if self.rel is not None:
            return self.rel
        amplification = max(self.amplification, A_DIVIDING) if dividing else self.amplification
        return amplification * d_in + self.roundings * (unit or 0.0)

    def argument(self) -> str:
        """``--tolerant``'s value that parses back to this tolerance."""
        return Mode.AUTO if self.rel is None else repr(self.rel)

    def text(self) -> str:
        if self.rel is not None:
            return f"relative distance ≤ {self.rel:g}"
        return f"d_out ≤ {self.amplification:g}·d_in + {self.roundings:g}·u"

    def to_json(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "rel": self.rel,
            "A": self.amplification,
            "R": self.roundings,
            "A_dividing": A_DIVIDING,
        }


def parse_tolerance(text: str) -> Tolerance:
    """``--tolerant``'s value: ``auto`` (the rule) or REL, a relative bound > 0; a
    :class:`ValueError` saying why anything else is not."""
    if text == Mode.AUTO:
        return Tolerance()
    try:
        rel = float(text)
    except ValueError:
        rel = math.nan
    if not (math.isfinite(rel) and rel > 0):
        raise ValueError(
            f"--tolerant takes 'auto' or a relative distance > 0 (--tolerant=1e-3), not {text!r}"
        )
    return Tolerance(rel=rel)


class Reason(StrEnum):
    """Why an aligned op's difference is not explained by rounding (the JSON's words)."""

    AMPLIFIED = "amplified"  # its outputs differ more than its inputs and rounding explain
    ARGUMENT = "argument"  # a non-tensor argument, or the RNG state, changed
    LEAF = "leaf"  # an input no recorded op produced differs beyond rounding
    STRUCTURE = "structure"  # an input ops of one run only wrote differs beyond rounding
    UNKNOWN = "unknown"  # a distance that decides it is unknown (no sketch, other shapes)


@dataclass(frozen=True, slots=True)
class Judgement:
    """An aligned pair of ops whose difference rounding does not explain: why, and the
    distances (``input``: EQUAL when the inputs are equal; None where unknown). For LEAF and
    STRUCTURE, ``slot`` is the input and ``tensor`` its distance; ``limit`` what rounding
    explains of the tensor judged (``budget`` of the outputs for AMPLIFIED)."""

    reason: Reason
    output: Distance | None
    input: Distance | None
    limit: float | None
    unit: float | None
    what: str  # one sentence: what exceeded what
    slot: str = ""
    tensor: Distance | None = None
    producers: Producers = (None, None)
    discrete_inputs: tuple[str, ...] = ()  # integer/bool inputs that differ (flips upstream)

    @property
    def amplification(self) -> float | None:
        """``d_out / d_in``; None when the inputs are equal or a distance is unknown."""
        if self.output is None or self.input is None or self.input.exact:
            return None
        return self.output.estimate / self.input.estimate if self.input.estimate else math.inf

    def amplification_text(self) -> str:
        if self.input is not None and self.input.exact:
            return "inputs equal"
        amplification = self.amplification
        return "unknown" if amplification is None else f"{amplification:.3g}×"

    def to_json(self) -> dict[str, Any]:
        output = self.output
        return {
            "reason": self.reason,
            "output": finite(output.estimate) if output is not None else None,
            "input": finite(self.input.estimate) if self.input is not None else None,
            "amplification": finite(self.amplification),
            "inputs_equal": self.input is not None and self.input.exact,
            "budget": self.limit,
            "unit": self.unit,
            "interval": [finite(output.low), finite(output.high)] if output is not None else None,
            "floor": output.floor if output is not None else None,
            "norms": {"a": output.norm_a, "b": output.norm_b} if output is not None else None,
            "slot": self.slot or None,
            "tensor": self.tensor.to_json() if self.tensor is not None else None,
            "discrete_inputs": list(self.discrete_inputs),
            "text": self.what,
        }


@dataclass
class RankTolerance:
    """What the tolerant walk found on one rank: the pairs rounding explained, the discrete
    flips among them, the first unexplained pair's judgement (beside ``RankDiff.first``), and
    the largest relative distance of each step's aligned ops (``drift``: the steps measured)."""

    explained: int = 0
    flips: int = 0
    first: Judgement | None = None
    drift: dict[int, float] = field(default_factory=dict)
    unknown_steps: set[int] = field(default_factory=set)  # a distance there was unknown

    def drift_series(
        self, steps: Sequence[int], around: int | None
    ) -> list[tuple[int, float | None]]:
        """(step, largest distance) of the compared ``steps``, those within ``DRIFT_AROUND``
        of step ``around`` when given; None for a step where a distance was unknown."""
        return [
            (step, None if step in self.unknown_steps else self.drift.get(step, 0.0))
            for step in steps
            if around is None or abs(step - around) <= DRIFT_AROUND
        ]


class Judge:
    """Judges one rank's aligned pairs whose outputs differ, in execution order (the rules:
    the module doc)."""

    def __init__(
        self,
        tolerance: Tolerance,
        traces: tuple[RankTrace, RankTrace],
        alignment: Alignment,
    ) -> None:
        self.tolerance = tolerance
        self.traces = traces
        self.alignment = alignment
        self.environments = (traces[0].environment, traces[1].environment)
        self.found = RankTolerance()
        self._first_step: int | None = None
        # Aligned pairs whose tensors have other shapes: not one op in both runs (the
        # alignment paired two ops of one name, as a fused optimizer's one add with a foreach
        # optimizer's other), judged as ops of one run only (indices in A, in B).
        self._unpaired: set[tuple[int, int]] = set()

    def measuring(self, step: int) -> bool:
        """Whether pairs of ``step`` are still judged: before the first divergence, and for
        the drift series after it."""
        return self._first_step is None or step <= self._first_step + DRIFT_AROUND

    def judge(self, op_a: OpRecord, op_b: OpRecord) -> Judgement | None:
        """None when rounding explains the difference of aligned ops ``op_a``/``op_b``."""
        if not _same_shapes(op_a, op_b):
            self._unpaired.add((op_a.index, op_b.index))
            return None
        unit = op_unit(op_a, op_b, self.environments)
        judged = self._arguments(op_a, op_b, unit)
        if judged is None:
            d_in, judged, discrete = self._inputs(op_a, op_b, unit)
            if judged is None:
                judged = self._outputs(op_a, op_b, d_in, unit, discrete)
        if judged is not None and judged.reason is Reason.UNKNOWN:
            self.found.unknown_steps.add(op_a.step)
        return judged

    def divergence(
        self, explainer: Explainer, op_a: OpRecord, op_b: OpRecord, judged: Judgement
    ) -> Divergence:
        """The first divergence at ``op_a``/``op_b``, classified by what was not explained;
        an unknown distance gives the bitwise answer."""
        self.found.first, self._first_step = judged, op_a.step
        if judged.reason is Reason.UNKNOWN:
            div = explainer.explain(op_a, op_b)
            div.summary = f"{judged.what}: the bitwise answer — {div.summary}"
            return div
        cause = {
            Reason.ARGUMENT: Cause.RNG if op_a.rng != op_b.rng else Cause.ARGUMENT,
            Reason.LEAF: Cause.LEAF,
            Reason.STRUCTURE: Cause.INSERTED,
            Reason.AMPLIFIED: Cause.ORIGIN,
        }[judged.reason]
        div = explainer.explain_at(op_a, op_b, cause, judged.slot, judged.producers)
        if div.kind is Kind.ORIGIN:  # the bitwise words say its inputs were equal
            op = div.observed_a
            div.summary = f"{op.op} at {op.call_site.short()}: {judged.what}"
        else:
            div.summary = f"{div.summary}; {judged.what}"
        return div

    def region_output(
        self,
        op_a: OpRecord,
        op_b: OpRecord,
        tensors: tuple[TensorRecord, TensorRecord],
        producers: Producers,
        what: str,
    ) -> Judgement | None:
        """Rule 2 for ``tensors`` that aligned ops ``op_a``/``op_b`` stand for but ops the
        alignment does not pair wrote (``producers``): a partial sum made whole by a
        collective one parallel layout has (:mod:`.layout_tolerant`). They must be within
        ``A * d + R * u`` of the aligned tensors those ops read; ``what`` names them in the
        judgement's sentence. None when rounding explains them."""
        ta, tb = tensors
        unit = op_unit(op_a, op_b, self.environments)
        distance = self._distance(ta, tb)
        if distance is None:
            self.found.unknown_steps.add(op_a.step)
            return _unknown(ta.slot, "output", _why_unknown(ta, tb), unit)
        self._drift(op_a, distance.estimate)
        judged = self._source_judgement(
            ta.slot, tensors, distance, Reason.STRUCTURE, producers, unit, what=what
        )
        if judged is None:
            self.found.explained += 1
        return judged

    # -- the rules -------------------------------------------------------------------------

    def _arguments(self, op_a: OpRecord, op_b: OpRecord, unit: float | None) -> Judgement | None:
        if op_a.rng != op_b.rng:
            return Judgement(
                Reason.ARGUMENT, None, None, None, unit, "the RNG state it consumed differs"
            )
        limit = self.tolerance.limit(0.0, unit)
        for arg in differing_arguments(op_a, op_b):
            distance = _argument_distance(arg)
            if distance is None or distance > limit:
                how = (
                    "not a number rounding changes"
                    if distance is None
                    else f"{distance:.2g} relative, more than rounding explains ({limit:.2g})"
                )
                return Judgement(Reason.ARGUMENT, None, None, limit, unit, f"a real change: {how}")
        return None

    def _inputs(
        self, op_a: OpRecord, op_b: OpRecord, unit: float | None
    ) -> tuple[Distance, Judgement | None, tuple[str, ...]]:
        """The largest input distance, the judgement of an input that is not explained, and
        the integer/bool inputs that differ."""
        d_in: Distance = EQUAL
        discrete: list[str] = []
        for d in differing(op_a.inputs, op_b.inputs):
            ta, tb = d.a, d.b
            if ta is None or tb is None:
                return EQUAL, _unknown(d.slot, "input", "exists in one run only", unit), ()
            if ta.is_uninitialized or tb.is_uninitialized:
                continue  # garbage in both: what it becomes is judged where it is written
            if not _floating(ta, tb):
                discrete.append(d.slot)
                continue
            distance = self._distance(ta, tb) or self._bound_by_outputs(op_a, op_b, tb)
            if distance is None:
                return EQUAL, _unknown(d.slot, "input", _why_unknown(ta, tb), unit), ()
            source, producers = self._source(ta, tb)
            if source is not None:
                judged = self._source_judgement(d.slot, (ta, tb), distance, source, producers, unit)
                if judged is not None:
                    return EQUAL, judged, ()
            if d_in.exact or distance.estimate > d_in.estimate:
                d_in = distance
        return d_in, None, tuple(discrete)

    def _distance(self, ta: TensorRecord, tb: TensorRecord) -> Distance | None:
        """Two runs' entries' distance, from their sketches or their bases'."""
        return tensor_distance(ta, tb) or self._through_views(ta, tb)

    def _bound_by_outputs(
        self, op_a: OpRecord, op_b: OpRecord, tb: TensorRecord
    ) -> Distance | None:
        """The distance of an input that has none (a view nothing read, so without a sketch of
        its own: a math attention's transposed gradient) bounded by the outputs of the aligned
        op that moves it (a ``stack``): they hold the input's difference, so it is at most
        theirs, taken relative to the input's norm in run B. None where that is not known."""
        moved = keeps_every_value(op_a) and keeps_every_value(op_b) and op_a.outputs
        if not moved or tb.sketch is None or not tb.sketch.norm:
            return None
        norm, estimate, high = tb.sketch.norm, 0.0, 0.0
        for oa, ob in zip(op_a.outputs, op_b.outputs, strict=False):
            output = self._distance(oa, ob)
            if output is None:
                return None
            scale = (output.norm_a or 0.0) / norm  # 0 for equal outputs
            estimate, high = max(estimate, output.estimate * scale), max(high, output.high * scale)
        return Distance(estimate, 0.0, high, 0.0, None, norm, True, bound=True)

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
        base_a, base_b = self._base(Side.A, ta), self._base(Side.B, tb)
        if base_a is None or base_b is None:
            return None
        return tensor_distance(base_a, base_b)

    def _base(self, side: Side, view: TensorRecord) -> TensorRecord | None:
        """The nearest entry with a sketch that ``view`` was made from: the tensor its
        producer wrote, or, where that is a view too, the view op's input."""
        entry = view
        for _ in range(MAX_VIEW_CHAIN):
            if entry.sketch is not None:
                return entry
            if entry.producer is None:
                return None
            op = self.traces[side.value].op(entry.producer[0])
            slot = entry.producer[1]
            written = op.outputs[slot] if 0 <= slot < len(op.outputs) else None
            if written is not None and written.sketch is not None:
                return written
            if not op.inputs:
                return None
            entry = op.inputs[0]
        return None

    def _source(self, ta: TensorRecord, tb: TensorRecord) -> tuple[Reason | None, Producers]:
        """LEAF or STRUCTURE for an input rounding must explain by itself, with the ops that
        wrote it; None for one an aligned pair wrote (judged there). An aligned pair whose
        outputs are views was not judged (a view's values are its base's): the views are
        followed back to where their values were written."""
        align = self.alignment
        for _ in range(MAX_VIEW_CHAIN):
            pa, pb = ta.producer, tb.producer
            if pa is None and pb is None:
                return Reason.LEAF, (pa, pb)
            if pa is not None and pb is not None and self._paired(pa[0], pb[0]):
                if not (ta.is_view or tb.is_view):  # without decoding the producers
                    return None, (pa, pb)
                op_a, op_b = self.traces[0].op(pa[0]), self.traces[1].op(pb[0])
                if not (_is_view(op_a, pa[1]) or _is_view(op_b, pb[1])):
                    return None, (pa, pb)
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

    def _paired(self, index_a: int, index_b: int) -> bool:
        """Whether A's op ``index_a`` and B's ``index_b`` are one op in both runs."""
        return self._partner(Side.A, index_a) == index_b

    def _partner(self, side: Side, index: int) -> int | None:
        """The other run's op that ``side``'s op ``index`` is one op with: aligned to it and
        not told apart (an unpaired pair is two ops); None where there is none."""
        other = (self.alignment.b_of if side is Side.A else self.alignment.a_of)(index)
        if other is None:
            return None
        pair = (index, other) if side is Side.A else (other, index)
        return None if pair in self._unpaired else other

    def _source_judgement(
        self,
        slot: str,
        tensors: tuple[TensorRecord, TensorRecord],
        distance: Distance,
        source: Reason,
        producers: Producers,
        unit: float | None,
        what: str = "",
    ) -> Judgement | None:
        own = max((u for t in tensors if (u := dtype_unit(t.dtype)) is not None), default=None)
        if source is Reason.LEAF:
            limit = self.tolerance.limit(0.0, own)
            what = f"input '{slot}', which no recorded op produced"
        else:
            region, region_unit, dividing = self._region(producers)
            unit = max((u for u in (unit, region_unit) if u is not None), default=None)
            limit = self.tolerance.limit(region, unit, dividing)
            what = what or f"input '{slot}', written by ops of one run only"
        if distance.estimate <= limit:
            return None
        return Judgement(
            source,
            None,
            None,
            limit,
            own if source is Reason.LEAF else unit,
            f"{what}, differs by {distance.text()} relative, more than rounding explains "
            f"({limit:.2g})",
            slot=slot,
            tensor=distance,
            producers=(
                self._computing(Side.A, producers[0]),
                self._computing(Side.B, producers[1]),
            ),
        )

    def _region(self, producers: Producers) -> tuple[float, float | None, bool]:
        """Of the ops of one run only that wrote an input (followed back through other such
        ops, and through aligned ops whose outputs are views, which judged nothing): the
        largest distance of the aligned ops' outputs they read, the coarsest unit roundoff of
        their own tensors (a cast to bfloat16 only one run has rounds at bfloat16), and
        whether one of them divides by a tensor."""
        largest, unit, dividing = 0.0, None, False
        for side, produced in zip(Side, producers, strict=True):
            if produced is None:
                continue
            trace = self.traces[side.value]
            pending, seen = [produced], {produced[0]}
            while pending and len(seen) <= MAX_REGION:
                index, slot = pending.pop()
                op = trace.op(index)
                other = self._partner(side, index)
                if other is not None and not self._views(side, op, other, slot):
                    largest = max(largest, self._aligned_distance(side, index, other))
                    continue
                if other is None and not moves(op):
                    dividing = dividing or divides(op.op)
                    for t in (*op.inputs, *op.outputs):
                        own = dtype_unit(t.dtype)
                        if own is not None and (unit is None or own > unit):
                            unit = own
                for t in op.inputs:
                    if t.producer is not None and t.producer[0] not in seen:
                        seen.add(t.producer[0])
                        pending.append(t.producer)
        return largest, unit, dividing

    def _views(self, side: Side, op: OpRecord, other: int, slot: int) -> bool:
        """Whether output ``slot`` of the aligned pair of ``side``'s ``op`` and the other run's
        op ``other`` is a view in either run (a pair whose outputs were not judged)."""
        return _is_view(op, slot) or _is_view(self.traces[1 - side.value].op(other), slot)

    def _computing(self, side: Side, producer: Producer | None) -> Producer | None:
        """The op that computed the values ``producer`` wrote: followed back through ops that
        only move values (views, copies) to the one that made them, the op to name."""
        for _ in range(MAX_VIEW_CHAIN):
            if producer is None:
                return None
            op = self.traces[side.value].op(producer[0])
            source = data_input(op) if moves(op) else 0 if _is_view(op, producer[1]) else None
            if source is None or source >= len(op.inputs) or op.inputs[source].producer is None:
                return producer
            producer = op.inputs[source].producer
        return producer

    def _aligned_distance(self, side: Side, index: int, other: int) -> float:
        """The largest distance between the outputs of an aligned pair (0 where unknown: the
        region's bound is then only what the region's own rounding explains)."""
        mine, theirs = self.traces[side.value].op(index), self.traces[1 - side.value].op(other)
        ops = (mine, theirs) if side is Side.A else (theirs, mine)
        largest = 0.0
        for ta, tb in zip(ops[0].outputs, ops[1].outputs, strict=False):
            distance = self._distance(ta, tb)
            if distance is not None:
                largest = max(largest, distance.estimate)
        return largest

    def _outputs(
        self,
        op_a: OpRecord,
        op_b: OpRecord,
        d_in: Distance,
        unit: float | None,
        discrete: tuple[str, ...],
    ) -> Judgement | None:
        d_out: Distance | None = None
        flips = 0
        for d in differing(op_a.outputs, op_b.outputs):
            ta, tb = d.a, d.b
            if ta is None or tb is None:
                return _unknown(d.slot, "output", "exists in one run only", unit, d_in)
            if ta.is_view or tb.is_view:
                continue  # a view's data is its base's, judged where it is read
            if not _floating(ta, tb):
                flips += 1
                continue
            distance = tensor_distance(ta, tb)
            if distance is None:
                return _unknown(d.slot, "output", _why_unknown(ta, tb), unit, d_in)
            if d_out is None or distance.estimate > d_out.estimate:
                d_out = distance
        returned = _returned_distance(op_a.returned, op_b.returned)
        if returned is not None and (d_out is None or returned.estimate > d_out.estimate):
            d_out = returned
        elif returned is None and op_a.returned != op_b.returned:
            flips += 1
        dividing = divides(op_a.op) or divides(op_b.op)
        budget = self.tolerance.limit(0.0 if d_in.exact else d_in.estimate, unit, dividing)
        if d_out is not None:
            self._drift(op_a, d_out.estimate)
            if d_out.estimate > budget:
                return Judgement(
                    Reason.AMPLIFIED,
                    d_out,
                    d_in,
                    budget,
                    unit,
                    _amplified_text(d_out, d_in, budget, self.tolerance),
                    discrete_inputs=discrete,
                )
        self.found.explained += 1
        self.found.flips += flips
        return None

    def _drift(self, op_a: OpRecord, distance: float) -> None:
        """Keeps ``distance`` as its step's drift where it is the step's largest so far."""
        drift = self.found.drift
        drift[op_a.step] = max(drift.get(op_a.step, 0.0), distance)


MAX_REGION = 64  # ops of one run only followed back from an input they wrote
MAX_VIEW_CHAIN = 16  # views (and moves) followed back to a base, a writer or a computing op


def _amplified_text(d_out: Distance, d_in: Distance, budget: float, tolerance: Tolerance) -> str:
    """What exceeded what, in words."""
    if tolerance.rel is not None:
        return f"outputs differ by {d_out.text()} relative, more than {tolerance.rel:g}"
    source = (
        "its inputs are equal"
        if d_in.exact
        else f"{d_out.estimate / d_in.estimate if d_in.estimate else math.inf:.3g}× its "
        f"inputs' {d_in.text()}"
    )
    return (
        f"outputs differ by {d_out.text()} relative, {source}; rounding explains up to {budget:.2g}"
    )


def _same_shapes(op_a: OpRecord, op_b: OpRecord) -> bool:
    """Whether two aligned ops read and write tensors of the same shapes, in order (their
    dtypes may differ: one op computed at two precisions)."""
    return [t.shape for t in op_a.inputs] == [t.shape for t in op_b.inputs] and [
        t.shape for t in op_a.outputs
    ] == [t.shape for t in op_b.outputs]


def _is_view(op: OpRecord, slot: int) -> bool:
    """Whether ``op``'s output ``slot`` is a view (its values are its base's)."""
    return 0 <= slot < len(op.outputs) and op.outputs[slot].is_view


def _floating(ta: TensorRecord, tb: TensorRecord) -> bool:
    return dtype_unit(ta.dtype) is not None or dtype_unit(tb.dtype) is not None


def _why_unknown(ta: TensorRecord, tb: TensorRecord) -> str:
    if ta.shape != tb.shape:
        return f"has other shapes ({list(ta.shape)} vs {list(tb.shape)})"
    without = [name for name, t in (("A", ta), ("B", tb)) if t.sketch is None]
    runs = " and ".join(without)
    return (
        f"has no sketch in run {runs} (a trace recorded before sketches, no finite value, "
        "or no readable storage)"
    )


def _unknown(
    slot: str, role: str, why: str, unit: float | None, d_in: Distance | None = None
) -> Judgement:
    return Judgement(
        Reason.UNKNOWN,
        None,
        d_in,
        None,
        unit,
        f"distance unknown: {role} '{slot}' {why}",
        slot=slot,
    )


def _argument_distance(arg: ArgumentDiff) -> float | None:
    """The relative difference of two runs' values of a numeric argument (the largest over a
    list of numbers); None for anything else (a bool, a string, an argument not passed)."""
    if not (arg.a_passed and arg.b_passed):
        return None
    return _value_distance(arg.a, arg.b)


def _value_distance(a: Any, b: Any) -> float | None:
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        if len(a) != len(b):
            return None
        parts = [_value_distance(x, y) for x, y in zip(a, b, strict=True)]
        return (
            None if any(p is None for p in parts) else max((p or 0.0 for p in parts), default=0.0)
        )
    if a == b and type(a) is type(b):
        return 0.0
    if not _is_number(a) or not _is_number(b):
        return None
    scale = max(abs(a), abs(b))
    return abs(a - b) / scale if scale else 0.0


def _is_number(value: Any) -> bool:
    return isinstance(value, Real) and not isinstance(value, bool) and math.isfinite(value)


def _returned_distance(a: Any, b: Any) -> Distance | None:
    """An op's returned floats (``.item()``) as a distance; None for other values."""
    if not (isinstance(a, float) and isinstance(b, float) and a != b):
        return None
    if not (math.isfinite(a) and math.isfinite(b)):
        return None
    distance = abs(a - b) / abs(a) if a else math.inf
    return Distance(distance, distance, distance, 0.0, abs(a), abs(b), True)
