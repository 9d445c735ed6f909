"""The tolerant judge: at each aligned pair whose outputs differ, whether rounding explains it
(the rules: :mod:`opguard.analysis.tolerant`), and the first divergence where it does not."""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from functools import partial
from numbers import Real
from typing import Any

from ...store import OpRecord, RankTrace, TensorRecord
from ..divergence.explainer import Alignment, Explainer
from ..divergence.model import ArgumentDiff, Divergence, differing_arguments
from ..divergence.model import differing_tensors as differing
from ..words.verdict import Cause, Kind, Side
from . import families
from .distance import EQUAL, Distance, tensor_distance
from .envelope import EnteringState
from .families import Bound, divides
from .judgement import (
    DRIFT_AROUND,
    Judged,
    Judgement,
    Producers,
    RankTolerance,
    Reason,
    Unjudged,
)
from .noise import NoiseFloor
from .rounding import coarsest, dtype_unit, op_unit, units
from .rule import ARGUMENT_ROUNDINGS, NOISE_SAFETY, Tolerance
from .sources import Sources
from .unmeasured import Unmeasured
from .views import Distances

# A float an op handed to Python (``.item()``): the value of its input, moved.
RETURNED = Bound("move", 1.0, 0.0)


@dataclass(frozen=True, slots=True)
class Taken:
    """An input whose distance is unknown, taken at what rounding allows the ops that wrote it
    (``allowed``; None where nothing bounds it): its ``source`` and ``producers`` as
    :meth:`Sources.source` gives them, and its note (:class:`~.unmeasured.Unmeasured`)."""

    slot: str
    why: str
    source: Reason | None
    producers: Producers
    allowed: float | None
    note: int


@dataclass
class Inputs:
    """What an aligned pair's differing inputs say: the largest distance (``d_in``), the
    judgement of one rounding does not explain, the integer/bool inputs that differ, and the
    inputs whose distance is unknown (``taken``)."""

    d_in: Distance = EQUAL
    judged: Judgement | None = None
    discrete: tuple[str, ...] = ()
    taken: list[Taken] = field(default_factory=list)

    @property
    def blocked(self) -> bool:
        """Whether an input is bounded by nothing: the pair's outputs judge nothing then."""
        return any(t.allowed is None for t in self.taken)


class Judge:
    """Judges one rank's aligned pairs whose outputs differ, in execution order (the rules:
    the module doc)."""

    def __init__(
        self,
        tolerance: Tolerance,
        traces: tuple[RankTrace, RankTrace],
        alignment: Alignment,
        noise: NoiseFloor | None = None,
        entering: EnteringState | None = None,
    ) -> None:
        self.tolerance = tolerance
        self.traces = traces
        self.alignment = alignment
        self.noise = noise  # --noise: run A's distances from the control run
        # the state entering the first step recorded op by op, within the step-level envelope
        self.entering = entering
        self.environments = (traces[0].environment, traces[1].environment)
        self.found = RankTolerance()
        self._first_step: int | None = None
        self.distances = Distances(traces)
        self.unmeasured = Unmeasured(self.found)
        self.sources = Sources(traces, alignment, self.distances, self.unmeasured)

    def measuring(self, step: int) -> bool:
        """Whether pairs of ``step`` are still judged: before the first divergence, and for
        the drift series after it."""
        return self._first_step is None or step <= self._first_step + DRIFT_AROUND

    def judge(self, op_a: OpRecord, op_b: OpRecord) -> Judgement | None:
        """None when rounding explains the difference of aligned ops ``op_a``/``op_b``, or
        when it is judged by what it feeds (:attr:`left_open`)."""
        self.unmeasured.begin()
        if not _same_shapes(op_a, op_b):
            self.sources.unpair(op_a.index, op_b.index)
            return None
        if self.sources.reordered(op_a, op_b):
            return None
        unit = op_unit(op_a, op_b, self.environments)
        judged = self._arguments(op_a, op_b, unit)
        if judged is not None:
            return judged
        inputs = self._inputs(op_a, op_b, unit, _judges_outputs(op_a, op_b))
        if inputs.judged is not None or inputs.blocked:
            return inputs.judged  # blocked: judged by what it feeds (its inputs were noted)
        judged = self._outputs(op_a, op_b, inputs, unit)
        return judged if judged is None else self._taken_judgement(judged, inputs.taken)

    @property
    def left_open(self) -> bool:
        """Whether the pair judged last left a differing tensor of unknown distance that no
        measured output judged yet (the walk asks whether its difference reaches anything)."""
        return self.unmeasured.left_open

    def reached_nothing(self) -> None:
        """The difference of the pair judged last reached nothing: its open tensors need no
        judging."""
        self.unmeasured.reached_nothing()

    def divergence(
        self, explainer: Explainer, op_a: OpRecord, op_b: OpRecord, judged: Judgement
    ) -> Divergence:
        """The first divergence at ``op_a``/``op_b``, classified by what was not explained."""
        self.found.first, self._first_step = judged, op_a.step
        view_a, view_b = judged.producers
        if judged.reason is Reason.ARGUMENT and view_a is not None and view_b is not None:
            op_a, op_b = self.traces[0].op(view_a[0]), self.traces[1].op(view_b[0])
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
        collective one parallel layout has (:mod:`.layout_judge`). They must be within what
        those ops' bounds allow from the aligned tensors they read; ``what`` names them in the
        judgement's sentence. None when rounding explains them."""
        ta, tb = tensors
        unit = op_unit(op_a, op_b, self.environments)
        distance = self.distances.between(ta, tb)
        if distance is None:  # judged by what reads it, as any tensor whose distance is unknown
            self._note(op_a, op_b, ta.slot, "output", _why_unknown(ta, tb), None)
            return None
        self._drift(op_a, distance.estimate)
        judged = self._source_judgement(
            ta.slot, tensors, distance, Reason.STRUCTURE, producers, unit, None, what=what
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
        rel = self.tolerance.rel
        limit = rel if rel is not None else ARGUMENT_ROUNDINGS * (unit or 0.0)
        for arg in differing_arguments(op_a, op_b):
            distance = _argument_distance(arg)
            if distance is None or distance > limit:
                how = (
                    _not_rounded(arg)
                    if distance is None
                    else f"{distance:.2g} relative, more than rounding explains ({limit:.2g})"
                )
                return Judgement(Reason.ARGUMENT, None, None, limit, unit, f"a real change: {how}")
        return None

    def _inputs(self, op_a: OpRecord, op_b: OpRecord, unit: float | None, judging: bool) -> Inputs:
        """The pair's differing inputs (:class:`Inputs`). An input whose distance is unknown
        is not judged: it is taken at what rounding allows the ops that wrote it
        (:meth:`_allowed`), and noted; where the pair's outputs judge nothing (``judging``
        False: views, whose values are judged where they are read), it is left to their
        readers."""
        found = Inputs()
        discrete: list[str] = []
        for d in differing(op_a.inputs, op_b.inputs):
            ta, tb = d.a, d.b
            if ta is None or tb is None:
                if judging:
                    found.taken.append(self._take(op_a, op_b, d.slot, "exists in one run only"))
                continue
            if ta.is_uninitialized or tb.is_uninitialized:
                continue  # garbage in both: what it becomes is judged where it is written
            source, producers = self.sources.source(ta, tb)
            if source is Reason.ARGUMENT:
                found.judged = self._view_arguments(d.slot, producers)
                if found.judged is not None:
                    return found
                source = None
            if not _floating(ta, tb):
                discrete.append(d.slot)
                continue
            distance = self.distances.between(ta, tb) or self.distances.bound_by_outputs(
                op_a, op_b, ta, tb
            )
            if distance is None and self.entering is not None:  # a view of that state
                distance = self.entering.distance((ta, tb))
            if distance is None:
                if not judging:
                    continue
                taken = self._take(
                    op_a, op_b, d.slot, _why_unknown(ta, tb), source, producers, (ta, tb)
                )
                found.taken.append(taken)
                if taken.allowed is None:
                    continue
                distance = _at_most(taken.allowed)
            elif source is not None:
                found.judged = self._source_judgement(
                    d.slot, (ta, tb), distance, source, producers, unit, op_a
                )
                if found.judged is not None:
                    return found
            if found.d_in.exact or distance.spread > found.d_in.spread:
                found.d_in = distance
        found.discrete = tuple(discrete)
        return found

    def _take(
        self,
        op_a: OpRecord,
        op_b: OpRecord,
        slot: str,
        why: str,
        source: Reason | None = None,
        producers: Producers = (None, None),
        tensors: tuple[TensorRecord, TensorRecord] | None = None,
    ) -> Taken:
        """Input ``slot`` of ``op_a``/``op_b``, whose distance is unknown (``why``), taken
        at what rounding allows the ops that wrote it, and noted (once: an output already
        noted unmeasured where it was written keeps its note)."""
        allowed, note = (
            self._allowed(source, producers, tensors) if tensors is not None else (None, None)
        )
        if note is None:
            note = self._note(op_a, op_b, slot, "input", why, allowed)
        return Taken(slot, why, source, producers, allowed, note)

    def _allowed(
        self,
        source: Reason | None,
        producers: Producers,
        tensors: tuple[TensorRecord, TensorRecord],
    ) -> tuple[float | None, int | None]:
        """What rounding allows an input whose distance is unknown, from where its values
        were written (:meth:`Sources.source`): ops of one run only, what their bounds allow
        from the aligned tensors they read (rule 2); a leaf, a rounding of its dtype; an
        aligned pair, its output's distance (the input's values are its output's, selected
        alike: the views between are aligned and made with the same arguments), or what was
        taken for that output where it was not measured either, with its note. None where
        nothing bounds it."""
        rel = self.tolerance.rel
        if source is Reason.STRUCTURE:
            bound = rel if rel is not None else self.sources.region_bound(producers, self._bound_of)
            return bound, None
        if source is Reason.LEAF:
            return self.tolerance.limit(0.0, coarsest(tensors)), None
        taken = self.unmeasured.taken(producers[0])
        if taken is not None:
            return taken
        written = self.sources.written_distance(producers)
        return (written.spread if written is not None else None), None

    def _note(
        self,
        op_a: OpRecord,
        op_b: OpRecord,
        slot: str,
        role: str,
        why: str,
        allowed: float | None,
    ) -> int:
        """Notes tensor ``slot`` of ``op_a``/``op_b`` as not judged (before the first
        divergence: after it only the drift is measured; -1 then)."""
        if self.found.first is not None:
            return -1
        return self.unmeasured.note(Unjudged(op_a.step, (op_a, op_b), slot, role, why, allowed))

    def _taken_judgement(self, judged: Judgement, taken: list[Taken]) -> Judgement:
        """A pair whose outputs rounding does not explain with an input taken at what
        rounding allows its writers (its distance unknown): where ops of one run only, or
        no recorded op, wrote it, the difference may have been made there, before the pair
        that shows it: those ops are named (``structure``, ``leaf``), the pair as where it
        was first seen."""
        named = next(
            (t for t in taken if t.source is Reason.STRUCTURE),
            next((t for t in taken if t.source is Reason.LEAF), None),
        )
        if named is None or named.source is None or judged.reason is not Reason.AMPLIFIED:
            return judged
        assert named.allowed is not None
        writers = "ops of one run only" if named.source is Reason.STRUCTURE else "no recorded op"
        what = (
            f"input '{named.slot}', which {writers} wrote, is not measured ({named.why}); "
            f"taken at what rounding allows there ({named.allowed:.2g}), the op's {judged.what}"
        )
        return replace(
            judged,
            reason=named.source,
            what=what,
            slot=named.slot,
            producers=(
                self.sources.computing(Side.A, named.producers[0]),
                self.sources.computing(Side.B, named.producers[1]),
            ),
        )

    def _view_arguments(self, slot: str, producers: Producers) -> Judgement | None:
        """Rule 1 at the aligned view ops that made input ``slot`` (``producers``): other
        arguments select other values. The judgement names the view ops."""
        pa, pb = producers
        assert pa is not None and pb is not None
        view_a, view_b = self.traces[0].op(pa[0]), self.traces[1].op(pb[0])
        judged = self._arguments(view_a, view_b, op_unit(view_a, view_b, self.environments))
        if judged is None:
            return None
        what = f"input '{slot}' is a view made with other arguments: {judged.what}"
        return replace(judged, what=what, slot=slot, producers=producers)

    def _source_judgement(
        self,
        slot: str,
        tensors: tuple[TensorRecord, TensorRecord],
        distance: Distance,
        source: Reason,
        producers: Producers,
        unit: float | None,
        reader: OpRecord | None,
        what: str = "",
    ) -> Judgement | None:
        """Rule 2 for an input (of ``reader``, run A's op reading it) that no aligned op
        wrote: a leaf (made by code no record shows: data, a tensor made before recording)
        within the fallback rule's rounding of its dtype, a region's output within the bound
        of the ops of one run only that wrote it (:meth:`Sources.region_bound`)."""
        own = coarsest(tensors)
        rel = self.tolerance.rel
        if source is Reason.LEAF and self.entering and self.entering.holds(tensors):
            return None  # the training state as the step began: judged at the step level
        if source is Reason.LEAF:
            analytic = self.tolerance.limit(0.0, own)
            what = f"input '{slot}', which no recorded op produced"
        else:
            analytic = (
                rel if rel is not None else self.sources.region_bound(producers, self._bound_of)
            )
            what = what or f"input '{slot}', written by ops of one run only"
        measured = self.noise.input(reader, slot) if self.noise and reader else None
        limit, judged_by = self._limit(analytic, measured)
        if distance.estimate <= limit:
            return None
        return Judgement(
            source,
            None,
            None,
            limit,
            own if source is Reason.LEAF else unit,
            f"{what}, differs by {distance.text()} relative, more than rounding explains "
            f"({limit:.2g}){_by(judged_by, measured)}",
            slot=slot,
            tensor=distance,
            producers=(
                self.sources.computing(Side.A, producers[0]),
                self.sources.computing(Side.B, producers[1]),
            ),
            judged_by=judged_by,
            measured=measured,
        )

    def _outputs(
        self, op_a: OpRecord, op_b: OpRecord, inputs: Inputs, unit: float | None
    ) -> Judgement | None:
        """Rule 3: each output within its bound; the one most beyond it is named. An output
        whose distance is unknown is judged by what reads it: what its bound allows is kept
        for them (:class:`~.unmeasured.Unmeasured`). The inputs taken at what rounding allows
        (their distance unknown) are judged here where an output is measured."""
        d_in, discrete = inputs.d_in, inputs.discrete
        spread = d_in.spread
        positions = {t.slot: at for at, t in enumerate(op_a.outputs)}
        worst: Judgement | None = None
        largest: Distance | None = None
        flips, by_floor = 0, False
        unmeasured: list[tuple[str, str, int | None, float | None]] = []
        for d in differing(op_a.outputs, op_b.outputs):
            ta, tb = d.a, d.b
            if ta is None or tb is None:
                unmeasured.append((d.slot, "exists in one run only", None, None))
                continue
            if ta.is_view or tb.is_view:
                continue  # a view's data is its base's, judged where it is read
            if ta.is_uninitialized or tb.is_uninitialized:
                continue  # garbage (of other dtypes): judged where it is written
            if not _floating(ta, tb):
                flips += 1
                continue
            found = self._bound(Side.A, (op_a, op_b), ta, tb)
            position = positions[d.slot]
            analytic = self._analytic(found, spread)
            distance = tensor_distance(ta, tb)
            if distance is None:
                unmeasured.append((d.slot, _why_unknown(ta, tb), position, analytic))
                continue
            if largest is None or distance.estimate > largest.estimate:
                largest = distance
            measured = self.noise.output(op_a, position) if self.noise is not None else None
            if distance.estimate <= analytic:
                continue
            limit, judged_by = self._limit(analytic, measured)
            if distance.estimate <= limit:
                by_floor = True
                continue
            judged = Judgement(
                Reason.AMPLIFIED,
                distance,
                d_in,
                limit,
                unit,
                _amplified_text(distance, d_in, limit, self.tolerance, found.family)
                + _by(judged_by, measured),
                discrete_inputs=discrete,
                family=found.family,
                judged_by=judged_by,
                measured=measured,
            )
            if worst is None or _excess(judged) > _excess(worst):
                worst = judged
        returned = _returned_distance(op_a.returned, op_b.returned)
        if returned is not None:
            largest = returned if largest is None else max(largest, returned, key=_estimate)
            budget = self._analytic(RETURNED, spread)
            if worst is None and returned.estimate > budget:
                worst = Judgement(
                    Reason.AMPLIFIED,
                    returned,
                    d_in,
                    budget,
                    unit,
                    _amplified_text(returned, d_in, budget, self.tolerance, RETURNED.family),
                    discrete_inputs=discrete,
                    family=RETURNED.family,
                    judged_by=self._limit(budget, None)[1],
                )
        elif op_a.returned != op_b.returned:
            flips += 1
        taken = tuple(t.note for t in inputs.taken)
        if largest is not None:
            self._drift(op_a, largest.estimate)
            self.unmeasured.judged(taken, (op_a, op_b))
        for slot, why, at, allowed in unmeasured:
            upstream = () if largest is not None else taken
            note = Unjudged(op_a.step, (op_a, op_b), slot, "output", why, allowed)
            if self.found.first is None:
                written = (op_a.index, at) if at is not None else None
                self.unmeasured.output(note, written, upstream)
        if worst is not None:
            return worst
        if unmeasured and largest is None:
            return None  # nothing measured: judged by what reads its outputs
        self.found.explained += 1
        self.found.flips += flips
        self.found.measured += by_floor
        return None

    def _analytic(self, found: Bound, d_in: float) -> float:
        """What ``found`` explains from inputs ``d_in`` apart, or ``--tolerant=REL``."""
        return self.tolerance.rel if self.tolerance.rel is not None else found.limit(d_in)

    def _limit(self, analytic: float, measured: float | None) -> tuple[float, Judged]:
        """The larger of the analytic bound and the measured floor, and which it is."""
        if self.tolerance.rel is not None:
            return analytic, Judged.FIXED
        if measured is not None and NOISE_SAFETY * measured > analytic:
            return NOISE_SAFETY * measured, Judged.MEASURED
        return analytic, Judged.ANALYTIC

    def _bound(
        self, side: Side, ops: tuple[OpRecord, ...], out: TensorRecord, *others: TensorRecord
    ) -> Bound:
        """The bound of output ``out`` of ``ops[0]``, read from ``side``'s record of it
        (``ops``: an aligned pair, or one op of one run; ``others``: the output in the other
        run): its family's, or the fallback rule's."""
        found = units(ops, (out, *others), self.environments)
        if found is not None:
            other = (ops[1], partial(self.distances.base, Side.B)) if len(ops) > 1 else None
            base = partial(self.distances.base, side)
            bounded = families.bound(ops[0], out, found, base, other)
            if bounded is not None:
                return bounded
        dividing = any(divides(op.op) for op in ops)
        return self.tolerance.fallback(found.op if found is not None else None, dividing)

    def _bound_of(self, side: Side, op: OpRecord, slot: int) -> Bound:
        """The bound of output ``slot`` of ``side``'s op ``op``, an op of one run only."""
        return self._bound(side, (op,), op.outputs[slot])

    def _drift(self, op_a: OpRecord, distance: float) -> None:
        """Keeps ``distance`` as its step's drift where it is the step's largest so far."""
        drift = self.found.drift
        drift[op_a.step] = max(drift.get(op_a.step, 0.0), distance)


def _estimate(distance: Distance) -> float:
    return distance.estimate


def _excess(judged: Judgement) -> float:
    """How far beyond its limit a judged output is (its distance over the limit)."""
    if judged.output is None or not judged.limit:
        return math.inf
    return judged.output.estimate / judged.limit


def _by(judged_by: Judged, measured: float | None) -> str:
    """Which bound said it, where the measured floor did."""
    if judged_by is not Judged.MEASURED or measured is None:
        return ""
    return f" (measured: {NOISE_SAFETY:g}× the control run's {measured:.2g})"


def _amplified_text(
    d_out: Distance, d_in: Distance, budget: float, tolerance: Tolerance, family: str
) -> str:
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
        f"outputs differ by {d_out.text()} relative, {source}; rounding explains up to "
        f"{budget:.2g} ({family} bound)"
    )


def _same_shapes(op_a: OpRecord, op_b: OpRecord) -> bool:
    """Whether two aligned ops read and write tensors of the same shapes, in order (their
    dtypes may differ: one op computed at two precisions)."""
    return [t.shape for t in op_a.inputs] == [t.shape for t in op_b.inputs] and [
        t.shape for t in op_a.outputs
    ] == [t.shape for t in op_b.outputs]


def _judges_outputs(op_a: OpRecord, op_b: OpRecord) -> bool:
    """Whether the outputs of an aligned pair judge anything: an output that differs and is
    a view in neither run, or a returned value (a view's values are its base's, judged where
    they are read)."""
    views = all(
        d.a is not None and d.b is not None and (d.a.is_view or d.b.is_view)
        for d in differing(op_a.outputs, op_b.outputs)
    )
    return not views or op_a.returned != op_b.returned


def _at_most(allowed: float) -> Distance:
    """A distance taken at what rounding allows (``allowed``), not measured: equal where
    rounding allows nothing (values only moved)."""
    if not allowed:
        return EQUAL
    return Distance(allowed, 0.0, allowed, 0.0, None, None, True, bound=True)


def _floating(ta: TensorRecord, tb: TensorRecord) -> bool:
    return dtype_unit(ta.dtype) is not None or dtype_unit(tb.dtype) is not None


def _why_unknown(ta: TensorRecord, tb: TensorRecord) -> str:
    """Why two runs' entries of a tensor have no distance, in words."""
    if ta.shape != tb.shape:
        return f"other shapes ({list(ta.shape)} vs {list(tb.shape)})"
    views = [name for name, t in (("A", ta), ("B", tb)) if t.sketch is None and t.is_view]
    plain = [name for name, t in (("A", ta), ("B", tb)) if t.sketch is None and not t.is_view]
    parts = []
    if views:
        parts.append(
            f"a view in run {' and '.join(views)} (its values were not read, and its base's "
            "sketch is keyed in the base's order)"
        )
    if plain:
        parts.append(
            f"no sketch in run {' and '.join(plain)} (recorded before sketches, no finite "
            "value, or no readable storage)"
        )
    return "; ".join(parts) or "a sketch that estimates nothing (saturated)"


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
    if not _is_number(a) or not _is_number(b) or (_is_integer(a) and _is_integer(b)):
        return None  # an integer (a slice's bounds, an index) is no rounded value
    scale = max(abs(a), abs(b))
    return abs(a - b) / scale if scale else 0.0


def _is_integer(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _not_rounded(arg: ArgumentDiff) -> str:
    """Why an argument that differs is no rounding, in words."""
    values = [v for v in (arg.a, arg.b) if v is not None]
    flat = [x for v in values for x in (v if isinstance(v, (list, tuple)) else [v])]
    if arg.a_passed and arg.b_passed and flat and all(_is_integer(x) for x in flat):
        return "rounding changes no integer"
    return "not a number rounding changes"


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
