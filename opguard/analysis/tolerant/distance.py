"""How far apart two runs' tensors are: the relative L2 distance ``||a - b|| / ||a||`` estimated
from the two tensors' sketches (:mod:`opguard.store.sketch`), with a 90% interval and the floor
below which the stored sketches cannot resolve a distance.

The estimate. A sketch is linear, so bucket ``k`` of ``a - b`` is ``a_k - b_k``, and each
bucket's square is an unbiased estimate of the squared norm of the elements hashed to it; their
sum ``S`` estimates ``||a - b||^2`` without bias. Once the difference is spread over many groups
of elements each bucket is close to normal with variance ``||a - b||^2 / BUCKETS``, so ``S`` is
``||a - b||^2 / BUCKETS`` times a chi-square with ``BUCKETS`` (14) degrees of freedom, and the
90% interval of the distance is ``sqrt(S)`` times ``sqrt(14 / chi2_0.95)`` to
``sqrt(14 / chi2_0.05)`` (0.77 to 1.46). A difference that sits in one group (a single element)
is measured exactly instead; the interval is then only wider than needed. The stored norms
bound the distance from below as well (``||a - b|| >= | ||a|| - ||b|| |``).

The floor. The buckets are stored in steps of about ``2**-28`` of the norm
(:func:`~opguard.store.sketch.scale_step`): each differs from its true value by at most half a
step on each side, so distances up to ``sqrt(14)`` such steps can be quantization alone and
read as "at most the floor" (about ``3e-8``, half a float32 rounding).

Torch-free; two sketches cost a few float operations.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ...store import sketch as stored
from ...store.records import TensorRecord

# Chi-square quantiles with k = 1 .. BUCKETS (14) degrees of freedom: P(X <= q) = 0.05 and 0.95.
# A tensor of G groups of elements spreads its difference over min(G, 14) buckets at most: a
# small one (a LayerNorm's statistics, a bias of a few elements) is measured by fewer
# independent buckets, and its estimate is the less certain (one group: a single signed sum of
# its elements' differences, which may nearly cancel).
CHI2 = {
    1: (0.003932, 3.8415),
    2: (0.1026, 5.9915),
    3: (0.3518, 7.8147),
    4: (0.7107, 9.4877),
    5: (1.1455, 11.0705),
    6: (1.6354, 12.5916),
    7: (2.1673, 14.0671),
    8: (2.7326, 15.5073),
    9: (3.3251, 16.9190),
    10: (3.9403, 18.3070),
    11: (4.5748, 19.6751),
    12: (5.2260, 21.0261),
    13: (5.8919, 22.3620),
    14: (6.5706, 23.6848),
}
assert max(CHI2) == stored.BUCKETS, "the quantiles above are for 14 buckets"
CHI2_05, CHI2_95 = CHI2[stored.BUCKETS]
LOW = math.sqrt(stored.BUCKETS / CHI2_95)  # the interval's lower end as a factor of sqrt(S)
HIGH = math.sqrt(stored.BUCKETS / CHI2_05)
NORM_ROUNDING = 2.0**-24  # the stored norms are float32


@dataclass(frozen=True, slots=True)
class Distance:
    """The relative distance of tensor ``b`` from tensor ``a`` (``||a - b|| / ||a||``).

    ``estimate`` is never below ``floor``: a distance the sketches cannot resolve reads as the
    floor, and ``resolved`` says whether it was above it. ``exact``: known without a sketch
    (equal fingerprints: 0)."""

    estimate: float
    low: float  # the 90% interval
    high: float
    floor: float
    norm_a: float | None  # None where no sketch was read (``exact``)
    norm_b: float | None
    resolved: bool
    exact: bool = False
    bound: bool = False  # at most ``estimate``: bounded by other tensors, not measured

    @property
    def spread(self) -> float:
        """The distance a bound built on this one starts from: the estimate, or where the
        tensor is too small for its sketch to average its difference over every bucket, the
        upper end of its interval brought to where a whole sketch's would be (its estimate may
        be an order of magnitude low)."""
        return max(self.estimate, self.high / HIGH) if not self.exact else 0.0

    def text(self) -> str:
        """``3.2e-07 (2.5e-07–4.7e-07)``, ``≤ 3.0e-08`` below the floor or for a bound, ``0``
        when equal."""
        if self.exact:
            return "0"
        if self.bound:
            return f"≤ {self.estimate:.1e}"
        if not self.resolved:
            return f"≤ {self.floor:.1e}"
        return f"{self.estimate:.1e} ({self.low:.1e}–{self.high:.1e})"

    def to_json(self) -> dict[str, float | str | bool | None]:
        return {
            "estimate": finite(self.estimate),
            "low": finite(self.low),
            "high": finite(self.high),
            "floor": self.floor,
            "norm_a": self.norm_a,
            "norm_b": self.norm_b,
            "resolved": self.resolved,
            "bound": self.bound,
        }


def finite(value: float | None) -> float | str | None:
    """A distance as JSON, which has no infinity (a tensor of norm 0 against one that is not):
    spelled ``"inf"``, as the contract's other non-finite numbers are."""
    return "inf" if value == math.inf else value


EQUAL = Distance(0.0, 0.0, 0.0, 0.0, None, None, True, exact=True)


def sketch_distance(
    a: stored.Sketch, b: stored.Sketch, numel: int | None = None
) -> Distance | None:
    """The distance of two sketches of tensors of ``numel`` elements (unknown: as many as
    fill every bucket); None when either estimates nothing (saturated)."""
    if a.saturated or b.saturated:
        return None
    squares = math.fsum((x - y) ** 2 for x, y in zip(a.buckets, b.buckets, strict=True))
    root = math.sqrt(squares)
    quantization = math.sqrt(stored.BUCKETS) * (a.step + b.step) / 2
    # The norms' own bound, less what their float32 rounding could make of equal norms.
    from_norms = max(0.0, abs(a.norm - b.norm) - NORM_ROUNDING * (a.norm + b.norm))
    if a.norm == 0.0:  # relative to nothing: equal when b is zero too, else infinitely far
        far = math.inf if b.norm > 0.0 or root > quantization else 0.0
        return Distance(far, far, far, 0.0, a.norm, b.norm, far > 0.0)
    scale = 1.0 / a.norm
    floor = quantization * scale
    resolved = root > quantization
    k = stored.BUCKETS if numel is None else max(1, min(stored.BUCKETS, -(-numel // stored.GROUP)))
    q05, q95 = CHI2[k]
    low = max(math.sqrt(k / q95) * root, from_norms) * scale if resolved else from_norms * scale
    high = max(math.sqrt(k / q05) * root * scale, floor, low)
    estimate = max(root * scale, low, floor)
    return Distance(estimate, low, high, floor, a.norm, b.norm, resolved)


def tensor_distance(a: TensorRecord, b: TensorRecord) -> Distance | None:
    """The distance of two runs' entries for one tensor: 0 exactly when their fingerprints are
    equal; else from their sketches; None (unknown, never guessed) where either has none or
    their shapes differ (a sketch is keyed by logical index: different shapes do not compare)."""
    if a.hash is not None and (a.shape, a.hash) == (b.shape, b.hash) and a.dtype == b.dtype:
        return EQUAL
    if a.shape != b.shape:
        return None
    sa, sb = a.sketch, b.sketch
    if sa is None or sb is None:
        return None
    counts = _non_finite(a), _non_finite(b)
    if None not in counts and counts[0] != counts[1]:  # a NaN or Inf in one run only
        return Distance(math.inf, math.inf, math.inf, 0.0, sa.norm, sb.norm, True)
    return sketch_distance(sa, sb, math.prod(a.shape))


def _non_finite(t: TensorRecord) -> tuple[Any, ...] | None:
    """The NaN and Inf counts of a tensor's stats (a sketch sums its finite values only)."""
    return tuple(t.stats[4:6]) if t.stats is not None and len(t.stats) >= 6 else None
