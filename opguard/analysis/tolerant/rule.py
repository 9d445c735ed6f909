"""The rule's bound: what rounding explains of a tensor, from its sources' distance and its unit
roundoff, or a fixed relative bound (``--tolerant=REL``)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

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
