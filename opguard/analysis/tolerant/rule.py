"""How differences are judged: the rule (per-family bounds, :mod:`.families`, with a measured
noise floor where a control run is given) or a fixed relative bound (``--tolerant=REL``); and
the fallback rule for an op the family table cannot bound."""

from __future__ import annotations

import math
from dataclasses import dataclass
from enum import StrEnum
from typing import Any

from .families import ESTIMATE, FLIP_DENSITY, RHO_EXACT, RHO_LIBM, SPREAD, Bound

# The fallback rule, d_out <= A * d_in + R * u, for an op outside the family table (or whose
# family cannot read what it needs: a trace without stats). A and A_dividing are the earlier
# rule's measured amplifications (bench/tolerant_calibration.py: a 256-1024-10 MLP, float32
# against float64, amplified rounding at most 16.5x; AdamW's first step 172x, CPU, math against
# flash attention, and foreach against fused AdamW ~20x, so 1024 for an op dividing by a
# tensor whose smallest element is not recorded). R is a library function's rounding
# (RHO_LIBM) twice over: an unknown op may do a few of them.
A_FACTOR = 16.0
A_DIVIDING = 1024.0
R_FACTOR = 2 * RHO_LIBM
# A non-tensor argument that differs by a few roundings of the op's precision is a scalar Python
# computed from rounded values (a schedule from a rounded loss): a library function's rounding.
ARGUMENT_ROUNDINGS = RHO_LIBM
# The measured floor: a pair is rounding where it is within NOISE_SAFETY times the distance the
# control run (the same script, its rounding perturbed) has from run A at that op. Rounding
# differences of one kind (another thread count) and another (the control's one-ulp noise)
# differ in size by a factor of a few; a real change is orders of magnitude beyond either.
NOISE_SAFETY = 8.0


class Mode(StrEnum):
    AUTO = "auto"  # the rule above
    FIXED = "fixed"  # a relative bound given with --tolerant=REL


@dataclass(frozen=True, slots=True)
class Tolerance:
    """How differences are judged: the rule (``rel`` None) or a fixed relative bound;
    ``noise``: the control run whose distance from run A at each op is the measured floor
    (``--noise CONTROL``)."""

    rel: float | None = None
    amplification: float = A_FACTOR
    roundings: float = R_FACTOR
    noise: str | None = None

    @property
    def mode(self) -> Mode:
        return Mode.AUTO if self.rel is None else Mode.FIXED

    def limit(self, d_in: float, unit: float | None, dividing: bool = False) -> float:
        """What the fallback rule explains of a tensor whose sources differ by ``d_in``, made
        by ops of which one divides by a tensor where ``dividing``."""
        if self.rel is not None:
            return self.rel
        return self.fallback(unit, dividing).limit(d_in)

    def fallback(self, unit: float | None, dividing: bool) -> Bound:
        """The fallback rule as a bound (its amplification holds the sketches' estimate
        factor, as the measured constants did)."""
        amplification = max(self.amplification, A_DIVIDING) if dividing else self.amplification
        return Bound("fallback", amplification / ESTIMATE, self.roundings * (unit or 0.0))

    def argument(self) -> str:
        """``--tolerant``'s value that parses back to this tolerance."""
        return Mode.AUTO if self.rel is None else repr(self.rel)

    def text(self) -> str:
        if self.rel is not None:
            return f"relative distance ≤ {self.rel:g}"
        rule = "per-op bounds by family (d_out ≤ 4·κ·d_in + ρ)"
        if self.noise is not None:
            rule += f", or ≤ {NOISE_SAFETY:g}× the control run's distance ({self.noise})"
        return rule

    def to_json(self) -> dict[str, Any]:
        return {
            "mode": self.mode,
            "rel": self.rel,
            "A": self.amplification,
            "R": self.roundings,
            "A_dividing": A_DIVIDING,
            "rule": "families" if self.rel is None else "fixed",
            "constants": {
                "estimate": ESTIMATE,
                "rho_exact": RHO_EXACT,
                "rho_libm": RHO_LIBM,
                "spread": SPREAD,
                "flip_density": FLIP_DENSITY,
                "argument": ARGUMENT_ROUNDINGS,
            },
            "noise": (
                {"control": self.noise, "safety": NOISE_SAFETY} if self.noise is not None else None
            ),
        }


def parse_tolerance(text: str, noise: str | None = None) -> Tolerance:
    """``--tolerant``'s value: ``auto`` (the rule) or REL, a relative bound > 0, with
    ``--noise``'s control run; a :class:`ValueError` saying why anything else is not."""
    if text == Mode.AUTO:
        return Tolerance(noise=noise)
    try:
        rel = float(text)
    except ValueError:
        rel = math.nan
    if not (math.isfinite(rel) and rel > 0):
        raise ValueError(
            f"--tolerant takes 'auto' or a relative distance > 0 (--tolerant=1e-3), not {text!r}"
        )
    if noise is not None:
        raise ValueError(
            "--noise measures a floor for the rule's bounds: not with a fixed --tolerant=REL"
        )
    return Tolerance(rel=rel)
