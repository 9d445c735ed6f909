"""The rounding envelope of step-level records (``opguard diff --tolerant`` on runs recorded
with ``--steps-only``, ``opguard hunt --tolerant``): whether rounding explains how far apart two
runs' training states are at each step, and the first step, and entry, beyond it.

Two runs that differ only in how they round (another torch build, another GPU, another thread
count) part at their first step by a few roundings, and the difference then grows at the rate
the training amplifies any small perturbation: slowly where training contracts, geometrically
where it is chaotic (at the edge of stability, by tens a step while a loss spike builds), until
it saturates. A real change (another learning rate, a weight decay removed, a bug at step N)
jumps beyond that envelope at its step. An entry's difference is ``||a - b||``, estimated from
the sketches both runs' records keep of the loss, the gradients, the parameters and the buffers
(:data:`~opguard.store.schema.SKETCHED_STATE_KINDS`, :mod:`.distance`), and said relative to
``||a||``. At each step, each entry that differs must be within its envelope, which grows
from a **reference**: the entry's largest difference so far, or, where larger, its kind's (every
loss, gradient, parameter or buffer entry together, relative to their norm) at the entry's
scale, so that a small entry whose own difference happened to stay small (a bias, the loss, a
scalar that crosses zero) is allowed the drift of its kind:

- **measured** (``--noise CONTROL``: a run of run A's script with its rounding perturbed,
  ``opguard record --perturb-rounding SEED``, with ``--steps-only`` or not): :data:`STEP_SAFETY`
  times the reference of run A's differences from the control, over the steps compared so far,
  this one included, and never below one rounding. The control's trajectory is amplified as
  run A's is, step by step, so its difference is the envelope's shape whatever the model's
  growth; :data:`STEP_SAFETY` covers one draw of rounding's difference against another's.
- **analytic** (no control, or an entry or step the control does not hold): :data:`GROWTH`
  times the reference of run B's differences at the earlier steps (a growth of :data:`RATE` a
  step, as the sketches estimate it), plus one step's own rounding, :data:`STEP_ROUNDINGS`
  units: all the first differing step is allowed, as the state it started from was equal bit
  for bit. A trajectory that amplifies faster than :data:`RATE` a step (an instability) goes
  beyond it, a change smaller than what has already
  drifted is not seen, and a run computing in a coarser precision than its entries' dtype
  (bf16 autocast, TF32) parts at its first step by more: a control run measures all three.

Roundings are units ``u`` of the entry's dtype at its scale: its norm or, where larger, the
norm it would have at its kind's typical element (the root mean square of the kind's elements,
times the square root of its size): a gradient that sums to almost nothing (a bias before a
BatchNorm) rounds at the scale of its terms, which no record holds; its kind's typical element
stands for them.

What has no distance: an RNG state (bytes) and an integer tensor round nothing, so any
difference there is a real change; optimizer states keep no sketch (a step's record stays
small) and are not judged here: what changes them shows in the parameters they update, at that
step or the next. A floating-point entry without a sketch (a trace recorded before step-level
records kept them, no finite value) has no distance: it is named, the bitwise answer, never a
guess. With ``--tolerant=REL`` every entry's relative distance must be within ``REL``.

Torch-free; an entry costs one sketch distance (two with a control).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from ...store import RankTrace, TensorRecord, TraceError
from ...store.schema import SKETCHED_STATE_KINDS
from ...store.states import StateEntry, StepState
from .distance import Distance, finite, tensor_distance
from .families import ESTIMATE
from .judgement import Judged
from .rounding import dtype_unit
from .rule import Tolerance

# How fast rounding differences may grow in one step where no control run measures it: on the
# tests' models they grow by at most 1.5x a step; a training at the edge of stability amplifies
# them by 30-80x a step while it blows up (docs/TOLERANT.md): that takes a control run.
RATE = 4.0
# The envelope's factor over an entry's largest difference before: RATE, times the sketches'
# ESTIMATE (a difference estimated at two steps is a ratio of two estimates).
GROWTH = RATE * ESTIMATE
# One step's own rounding, in units of the entry's dtype at its scale: a step is thousands of
# ops. At the first differing step of the tests' pairs it was at most 14 units.
STEP_ROUNDINGS = 256.0
# The measured envelope's margin over a control run's largest difference: a control is one draw
# of rounding's difference, and where an instability amplifies one direction, draws differ: over
# seven control seeds of the tests' model at lr 0.5 (a training blowing up), one seed's entry
# (pooled with its kind's) differed by up to 7.9x another's; a real change is orders beyond.
STEP_SAFETY = 16.0
KindKey = tuple[str, str, str]  # a state entry's (kind, name, slot)


class Beyond(StrEnum):
    """Why a differing state entry is not explained (the JSON's words)."""

    DISTANCE = "distance"  # its difference is beyond its envelope
    DISCRETE = "discrete"  # an RNG state or an integer tensor, which rounding never changes
    UNKNOWN = "unknown"  # its distance is unknown (no sketch): the bitwise answer


@dataclass(frozen=True, slots=True)
class EntryJudgement:
    """A differing state entry of a step that rounding does not explain: why, its distance and
    the envelope it went beyond (both relative to run A's norm of it), which envelope that was,
    and the reference it grew from (``measured``: the control run's differences so far;
    ``before``: run B's at the earlier steps; each the entry's or its kind's at its scale)."""

    a: StateEntry
    b: StateEntry
    reason: Beyond
    distance: Distance | None = None
    limit: float | None = None
    judged_by: Judged = Judged.ANALYTIC
    measured: float | None = None
    before: float | None = None
    rounding: float | None = None  # the rounding the envelope adds (one step's, or one)

    @property
    def label(self) -> str:
        return self.a.label

    def text(self) -> str:
        """What went beyond what, in one sentence."""
        if self.reason is Beyond.DISCRETE:
            return f"{self.label} differs, and rounding changes no {self.a.tensor.dtype} value"
        if self.reason is Beyond.UNKNOWN or self.distance is None or self.limit is None:
            return (
                f"{self.label} differs and its distance is unknown (its record keeps no "
                "sketch): the bitwise answer"
            )
        return (
            f"{self.label} differs by {self.distance.text()} relative, beyond the rounding "
            f"envelope {self.limit:.1e} ({self._envelope_text()})"
        )

    def _envelope_text(self) -> str:
        rounding = self.rounding or 0.0
        if self.judged_by is Judged.FIXED:
            return "the fixed bound"
        if self.judged_by is Judged.MEASURED:
            return (
                f"{STEP_SAFETY:g}× {self.measured or 0.0:.1e}, the control run's largest "
                "difference so far, of the entry or its kind, one rounding at least"
            )
        before = self.before or 0.0
        if before == 0.0:
            return f"one step's rounding, {STEP_ROUNDINGS:g}·u: the state before it was equal"
        return (
            f"{GROWTH:g}× {before:.1e}, its largest difference before or its kind's, and one "
            f"step's rounding, {rounding:.1e}"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "entry": self.label,
            "kind": self.a.kind,
            "reason": self.reason,
            "distance": self.distance.to_json() if self.distance is not None else None,
            "envelope": finite(self.limit),
            "bound": self.judged_by,
            "measured": finite(self.measured),
            "before": finite(self.before),
            "rounding": finite(self.rounding),
            "text": self.text(),
        }


@dataclass
class StepTolerance:
    """What the envelope found on one rank's step-level records: the differing entries it
    explained (``by_control`` of them by the control run's envelope), the differing optimizer
    states it did not judge, the largest relative distance of each step judged (``drift``) and
    the steps where a distance was unknown."""

    control: bool = False
    explained: int = 0
    by_control: int = 0
    not_judged: int = 0
    without_control: int = 0  # entries judged with a control run that did not hold them
    drift: dict[int, float] = field(default_factory=dict)
    unknown_steps: set[int] = field(default_factory=set)

    def to_json(self) -> dict[str, Any]:
        return {
            "explained": self.explained,
            "by_control": self.by_control,
            "not_judged": self.not_judged,
            "without_control": self.without_control,
            "control": self.control,
        }

    def notes(self) -> list[str]:
        """What the envelope could not judge as asked, in words."""
        notes = []
        if self.not_judged:
            notes.append(
                f"--tolerant: {self.not_judged} differing optimizer-state entries not judged at "
                "the step level (their records keep no sketch; the parameters they update were)"
            )
        if self.without_control:
            notes.append(
                f"--noise: {self.without_control} differing state entries are at steps or "
                "names the control run does not hold: judged by the analytic envelope"
            )
        return notes


def envelope_text(tolerance: Tolerance) -> str:
    """The step-level rule in words, as the report states it."""
    if tolerance.rel is not None:
        return f"each state entry's relative distance ≤ {tolerance.rel:g}"
    text = (
        f"each state entry within {GROWTH:g}× its largest difference before and one step's "
        f"rounding ({STEP_ROUNDINGS:g}·u)"
    )
    if tolerance.noise is not None:
        text += f", or {STEP_SAFETY:g}× the control run's largest difference ({tolerance.noise})"
    return text


def envelope_json(tolerance: Tolerance) -> dict[str, Any]:
    """The step-level envelope's constants, as the JSON states them."""
    return {
        "growth": GROWTH,
        "step_roundings": STEP_ROUNDINGS,
        "safety": STEP_SAFETY,
        "control": tolerance.noise,
        "rel": tolerance.rel,
    }


class StepEnvelope:
    """Judges one rank's step-level records step by step, in step order (the module doc),
    keeping the largest differences so far: run B's, and the control run's."""

    def __init__(self, tolerance: Tolerance, control: RankTrace | None = None) -> None:
        self.tolerance = tolerance
        self.control = control
        self.found = StepTolerance(control=control is not None)
        self._largest = _Largest()  # run B's, at the earlier steps
        self._control_largest = _Largest()  # the control's, this step included

    def judge(
        self,
        state_a: StepState,
        state_b: StepState,
        differing: Sequence[tuple[StateEntry, StateEntry]],
    ) -> list[EntryJudgement]:
        """The entries of ``differing`` (run A's and run B's entry of each, in the order the
        step computed them) that rounding does not explain at step ``state_a.step``; their
        differences join the history either way."""
        step = state_a.step
        scales = _Scales.of(state_a)
        held = self._control_step(state_a, scales)
        beyond: list[EntryJudgement] = []
        differences: dict[KindKey, float] = {}
        largest = 0.0
        for a, b in differing:
            if a.kind == "state":  # no sketch: vouched for by the parameters they update
                self.found.not_judged += 1
                continue
            judged, difference = self._entry(a, b, scales, a.key in held)
            if difference is not None:
                differences[a.key] = difference
                largest = max(largest, _relative(difference, _norm(a.tensor)))
            if judged is None:
                self.found.explained += 1
                self.found.by_control += a.key in held
            else:
                beyond.append(judged)
                if judged.reason is Beyond.UNKNOWN:
                    self.found.unknown_steps.add(step)
        self._largest.add(differences, scales)
        self.found.drift[step] = largest
        return beyond

    def _entry(
        self, a: StateEntry, b: StateEntry, scales: _Scales, measured: bool
    ) -> tuple[EntryJudgement | None, float | None]:
        """The judgement of one differing entry (None: explained) and its difference;
        ``measured``: the control run holds the entry at this step."""
        unit = dtype_unit(a.tensor.dtype)
        if unit is None:  # bytes, integers: rounding never changes them
            return EntryJudgement(a, b, Beyond.DISCRETE), None
        distance = tensor_distance(a.tensor, b.tensor)
        if distance is None:
            return EntryJudgement(a, b, Beyond.UNKNOWN), None
        norm, difference = _norm(a.tensor), _difference(distance)
        if not distance.resolved:  # at most the sketches' floor: below any rounding
            return None, difference
        scale = scales.of_entry(a)
        rounding = unit * scale  # one rounding of the entry, absolute
        reference: float | None = None
        if self.tolerance.rel is not None:
            limit, judged_by = self.tolerance.rel * norm, Judged.FIXED
        elif measured:
            reference = max(self._control_largest.reference(a, scale), rounding)
            limit, judged_by = STEP_SAFETY * reference, Judged.MEASURED
        else:
            reference, rounding = self._largest.reference(a, scale), STEP_ROUNDINGS * rounding
            limit, judged_by = GROWTH * reference + rounding, Judged.ANALYTIC
            self.found.without_control += self.control is not None
        if difference <= limit:
            return None, difference
        relative = _relative(reference, norm) if reference is not None else None
        judged = EntryJudgement(
            a,
            b,
            Beyond.DISTANCE,
            distance,
            _relative(limit, norm),
            judged_by,
            measured=relative if judged_by is Judged.MEASURED else None,
            before=relative if judged_by is Judged.ANALYTIC else None,
            rounding=_relative(rounding, norm),
        )
        return judged, difference

    def _control_step(self, state_a: StepState, scales: _Scales) -> set[KindKey]:
        """Adds the control run's differences from run A at this step to its history; the
        entries it holds at this step (none without a control or its record of the step)."""
        if self.control is None:
            return set()
        try:
            state_c = self.control.step_state(state_a.step)
        except TraceError:  # its damage: this step is judged as without a control
            return set()
        if state_c is None:
            return set()
        theirs = state_c.by_key()
        differences = {}
        for entry in state_a.entries:
            other = theirs.get(entry.key)
            if other is not None and entry.kind in SKETCHED_STATE_KINDS:
                distance = tensor_distance(entry.tensor, other.tensor)
                if distance is not None:
                    differences[entry.key] = _difference(distance)
        self._control_largest.add(differences, scales)
        return set(differences)


@dataclass(frozen=True, slots=True)
class _Scales:
    """What one step's entries of each kind measure in run A: the kind's norm (every entry of
    it together) and its typical element (the root mean square of its elements)."""

    norms: dict[str, float]
    typical: dict[str, float]

    @classmethod
    def of(cls, state: StepState) -> _Scales:
        squares: dict[str, float] = {}
        counts: dict[str, int] = {}
        for entry in state.entries:
            sketch = entry.tensor.sketch
            if sketch is not None:
                squares[entry.kind] = squares.get(entry.kind, 0.0) + sketch.norm**2
                counts[entry.kind] = counts.get(entry.kind, 0) + _numel(entry.tensor)
        return cls(
            {kind: math.sqrt(total) for kind, total in squares.items()},
            {kind: math.sqrt(squares[kind] / counts[kind]) for kind in squares if counts[kind]},
        )

    def of_entry(self, entry: StateEntry) -> float:
        """The scale an entry rounds at: its norm, or its kind's typical element times the
        square root of its size, whichever is larger."""
        typical = self.typical.get(entry.kind, 0.0)
        return max(_norm(entry.tensor), typical * math.sqrt(_numel(entry.tensor)))


class _Largest:
    """The largest differences so far: of each entry (absolute), and of each kind as a whole
    relative to its norm (all its entries together: a small entry whose own difference
    happened to stay small, a bias, a scalar, is allowed its kind's typical drift)."""

    def __init__(self) -> None:
        self.entries: dict[KindKey, float] = {}
        self.kinds: dict[str, float] = {}

    def add(self, differences: dict[KindKey, float], scales: _Scales) -> None:
        squares: dict[str, float] = {}
        for key, difference in differences.items():
            self.entries[key] = max(self.entries.get(key, 0.0), difference)
            squares[key[0]] = squares.get(key[0], 0.0) + difference**2
        for kind, total in squares.items():
            norm = scales.norms.get(kind, 0.0)
            if norm > 0:
                self.kinds[kind] = max(self.kinds.get(kind, 0.0), math.sqrt(total) / norm)

    def reference(self, entry: StateEntry, scale: float) -> float:
        """What the entry's difference grows from: its own largest, or its kind's at its
        scale, whichever is larger."""
        return max(self.entries.get(entry.key, 0.0), self.kinds.get(entry.kind, 0.0) * scale)


def _numel(t: TensorRecord) -> int:
    return math.prod(t.shape)


def _norm(t: TensorRecord) -> float:
    return t.sketch.norm if t.sketch is not None else 0.0


def _difference(distance: Distance) -> float:
    """``||a - b||`` from a distance relative to ``||a||`` (``||b||`` where ``a`` is zero)."""
    if distance.exact:
        return 0.0
    if not distance.norm_a:
        return distance.norm_b or 0.0
    return distance.estimate * distance.norm_a


def _relative(difference: float, norm: float) -> float:
    return difference / norm if norm > 0 else math.inf if difference > 0 else 0.0


@dataclass(frozen=True, slots=True)
class EnteringState:
    """The state that entered step ``step``: the first step two runs recorded op by op (a
    ``--window``, a flight recorder's last steps), whose ops read it as leaves (no recorded op
    wrote it), as each run's step-level record of the step before holds it. Where the
    step-level records found the runs within the envelope up to that step, the op-level judge
    takes those leaves as explained (their parameters and buffers were judged, their optimizer
    states vouched for by the parameters they updated, step by step) and reads their
    distances here: a view of a leaf (``weight.t()``) has no recorded writer to follow back to,
    so the view ops of the step, which read the leaf, name its base."""

    step: int
    contents: frozenset[tuple[int | None, int | None]]  # (fingerprint in A, in B) per entry
    bases: tuple[
        dict[int | None, TensorRecord], ...
    ]  # per run: a leaf view's fingerprint -> its base

    @classmethod
    def of(cls, trace_a: RankTrace, trace_b: RankTrace, step: int) -> EnteringState | None:
        """The state entering step ``step`` of two traces; None where step ``step - 1`` has no
        record in either."""
        try:
            state_a, state_b = trace_a.step_state(step - 1), trace_b.step_state(step - 1)
        except TraceError:
            return None
        if state_a is None or state_b is None:
            return None
        theirs = state_b.by_key()
        contents = frozenset(
            (entry.tensor.hash, other.tensor.hash)
            for entry in state_a.entries
            if (other := theirs.get(entry.key)) is not None
        )
        return cls(step, contents, (_leaf_views(trace_a, step), _leaf_views(trace_b, step)))

    def holds(self, tensors: tuple[TensorRecord, TensorRecord]) -> bool:
        """Whether a leaf (each run's entry, or the base of each run's view) is this state's:
        each run's tensor is the one its step-level record holds under one name."""
        bases = self._bases(tensors)
        return bases is not None and (bases[0].hash, bases[1].hash) in self.contents

    def distance(self, tensors: tuple[TensorRecord, TensorRecord]) -> Distance | None:
        """The distance of two views of this state's leaves of one geometry, as their bases'
        (a transposed weight holds all of its values; a slice a part, the base's distance an
        estimate of its); None for anything else."""
        ta, tb = tensors
        bases = self._bases(tensors)
        if (
            bases is None
            or (ta.shape, ta.stride) != (tb.shape, tb.stride)
            or not self.holds(tensors)
        ):
            return None
        return tensor_distance(*bases)

    def _bases(
        self, tensors: tuple[TensorRecord, TensorRecord]
    ) -> tuple[TensorRecord, TensorRecord] | None:
        found = [
            t if not t.is_view else self.bases[side].get(t.hash)
            for side, t in enumerate(tensors)
            if t.producer is None
        ]
        if len(found) != 2 or found[0] is None or found[1] is None:
            return None
        return found[0], found[1]


def _leaf_views(trace: RankTrace, step: int) -> dict[int | None, TensorRecord]:
    """The views step ``step``'s ops made of leaves (tensors no recorded op wrote), by their
    fingerprint, each with the leaf it views (through views of views)."""
    bases: dict[int | None, TensorRecord] = {}
    first = trace.first_op()
    if first is None:
        return bases
    for op in trace.ops(first[0]):
        if op.step > step:
            break
        if op.step < step:
            continue
        base = op.inputs[0] if op.inputs else None
        if base is not None and base.is_view:
            base = bases.get(base.hash)
        if base is None or base.producer is not None:
            continue
        for out in op.outputs:
            if out.is_view:
                bases[out.hash] = base
    return bases
