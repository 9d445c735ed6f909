"""What the tolerant walk says of an aligned pair rounding does not explain (:class:`Judgement`,
its :class:`Reason`), of a tensor whose distance is unknown (:class:`Unjudged`), and what it
found on one rank (:class:`RankTolerance`)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from enum import StrEnum
from typing import Any

from ...store import OpRecord
from .distance import Distance, finite

Producer = tuple[int, int]  # (op index, output slot)
Producers = tuple[Producer | None, Producer | None]  # in A, in B
DRIFT_AROUND = 5  # steps either side of the first divergence in the drift series
UNJUDGED_SHOWN = 5  # tensors whose distance is unknown kept as examples, per rank


class Judged(StrEnum):
    """Which bound judged a pair (the JSON's words)."""

    ANALYTIC = "analytic"  # the family's bound (or the fallback rule) from the recorded norms
    MEASURED = "measured"  # the control run's distance times the safety factor (--noise)
    FIXED = "fixed"  # --tolerant=REL


class Reason(StrEnum):
    """Why an aligned op's difference is not explained by rounding (the JSON's words)."""

    AMPLIFIED = "amplified"  # its outputs differ more than its inputs and rounding explain
    ARGUMENT = "argument"  # a non-tensor argument, or the RNG state, changed
    LEAF = "leaf"  # an input no recorded op produced differs beyond rounding
    STRUCTURE = "structure"  # an input ops of one run only wrote differs beyond rounding


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
    family: str | None = None  # the op family whose bound judged it (families.py)
    judged_by: Judged = Judged.ANALYTIC
    measured: float | None = None  # the control run's distance there (--noise), where known

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
            "bound": self.judged_by,
            "family": self.family,
            "measured": finite(self.measured),
        }


@dataclass(frozen=True, slots=True)
class Unjudged:
    """A differing tensor whose distance is unknown (no sketch: a view whose base's sketch does
    not give it, a tensor with no finite value, a trace recorded before sketches; other
    shapes): input or output ``slot`` (``role``) of ``ops`` (run A's, run B's), why, and what
    was taken for it instead: what rounding allows the ops that wrote it (``allowed``; None
    where nothing bounds it). It is judged by what it feeds: ``judged_by`` is the aligned pair
    whose measured outputs were judged with it taken so (None: judged by nothing, or its
    difference reached nothing: ``reached_nothing``, no reader's output changed with it)."""

    step: int
    ops: tuple[OpRecord, OpRecord]
    slot: str
    role: str  # "input" or "output"
    why: str
    allowed: float | None
    judged_by: tuple[OpRecord, OpRecord] | None = None
    reached_nothing: bool = False

    def text(self) -> str:
        """One line: which tensor, why, and what judged it."""
        op_a, op_b = self.ops
        where = f"{self.role} '{self.slot}' of {op_a.op} #{op_a.index}/#{op_b.index}"
        taken = (
            "nothing bounds it"
            if self.allowed is None
            else f"taken at what rounding allows there ({self.allowed:.2g})"
        )
        by = self.judged_by
        judged = (
            "its difference reached nothing"
            if self.reached_nothing
            else "judged by nothing"
            if by is None
            else "judged by that op's outputs"
            if by == self.ops
            else f"judged by {by[0].op} #{by[0].index}/#{by[1].index}, which reads it"
        )
        return f"step {self.step}, {where}: {self.why}; {taken}, {judged}"


@dataclass
class RankTolerance:
    """What the tolerant walk found on one rank: the pairs rounding explained, the discrete
    flips among them, the first unexplained pair's judgement (beside ``RankDiff.first``), and
    the largest relative distance of each step's aligned ops (``drift``: the steps measured),
    and the differing tensors whose distance was unknown before the first divergence
    (``unjudged``: the first few; ``judged_by_nothing``: how many no measured output judged)."""

    explained: int = 0
    flips: int = 0
    measured: int = 0  # of the explained, those the measured floor explained (--noise)
    first: Judgement | None = None
    drift: dict[int, float] = field(default_factory=dict)
    unknown_steps: set[int] = field(default_factory=set)  # a distance there was unknown
    unjudged: list[Unjudged] = field(default_factory=list)
    unjudged_count: int = 0
    judged_by_nothing: int = 0

    def drift_series(
        self, steps: Sequence[int], around: int | None
    ) -> list[tuple[int, float | None]]:
        """(step, largest distance) of the compared ``steps``, those within ``DRIFT_AROUND``
        of step ``around`` when given; None for a step where a distance was unknown and none
        was measured."""
        return [
            (step, self.drift.get(step, None if step in self.unknown_steps else 0.0))
            for step in steps
            if around is None or abs(step - around) <= DRIFT_AROUND
        ]


def not_judged_text(found: Sequence[RankTolerance]) -> str:
    """What was not judged, for the reports: how many differing tensors had no distance, how
    many of them nothing judged, and the first (empty when there were none)."""
    count = sum(t.unjudged_count for t in found)
    if not count:
        return ""
    nothing = sum(t.judged_by_nothing for t in found)
    first = next(t.unjudged[0] for t in found if t.unjudged)
    by_nothing = f", {nothing} of them by nothing" if nothing else ""
    return (
        f"{count} differing tensor(s) whose distance is unknown, judged by what they "
        f"feed{by_nothing} (first: {first.text()})"
    )
