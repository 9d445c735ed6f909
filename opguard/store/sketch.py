"""A tensor's sketch: the stored field (``w``) from which two runs' relative distance is estimated.

The fingerprint says whether two tensors are bit for bit equal; the sketch says how far apart they
are. It is a count sketch of the tensor's values, computed in the same pass over memory as the
fingerprint (``csrc/fingerprint.h`` defines it for the CPU and CUDA paths alike):

- the elements, in logical (row-major) order, are cut into groups of :data:`GROUP` consecutive
  indices; group ``g`` hashes to one word ``h = fmix64(g * INDEX_KEY + SALT)``;
- element ``j`` of the group is added to bucket ``((h >> 32) * BUCKETS) >> 32`` with sign ``-1``
  where bit ``j`` of ``h`` is set, else ``+1``; the buckets and the sum of squares are
  accumulated in float64. A NaN or an infinity adds 0 to both (its bucket and the norm).

A sketch is linear in the values, so the sketch of ``a - b`` is the difference of the two runs'
sketches, and because each element's bucket and sign depend only on its logical index, the
sum of squared bucket differences estimates ``||a - b||^2`` without bias (a chi-square with about
:data:`BUCKETS` degrees of freedom once the difference spreads over many groups; exact when it
sits in one). Only floating-point tensors with at least one finite value have one (``w`` is absent
otherwise): the sketch of a tensor with non-finite values (an attention mask's ``-inf``) is that of
its finite part, and the diff compares the NaN and Inf counts apart.

Stored form (:data:`STORED_BYTES` bytes, little-endian): the L2 norm as float32, then the
:data:`BUCKETS` buckets as int32 fixed point in steps of ``2**(E - FRACTION_BITS)``, where
``2**E`` is the power of two just above the stored norm (``math.frexp``'s exponent). Runs that
differ only by rounding therefore keep their buckets to about 4e-9 of the norm, far below a
float32 rounding. A bucket outside int32's range (impossible for real data: at least 8x the
norm) is stored as :data:`SATURATED`, and such a sketch estimates nothing.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from functools import lru_cache

BUCKETS = 14
GROUP = 8  # consecutive logical elements sharing one hash word (one sign bit each)
INDEX_KEY = 0x9E3779B97F4A7C15  # as the fingerprint's (csrc/fingerprint.h: kIndexKey)
SALT = 0xD6E8FEB86659FD93  # csrc/fingerprint.h: kSketchSalt
FRACTION_BITS = 28
SATURATED = -(2**31)
_LAYOUT = struct.Struct(f"<f{BUCKETS}i")
STORED_BYTES = _LAYOUT.size  # 60


@dataclass(frozen=True)
class Sketch:
    """One tensor's sketch as stored: its norm and its buckets (dequantized)."""

    norm: float
    buckets: tuple[float, ...]
    step: float  # the quantization step of the buckets (absolute)

    @property
    def saturated(self) -> bool:
        return any(math.isnan(b) for b in self.buckets)


def scale_step(norm: float) -> float:
    """The buckets' quantization step for a stored (float32) norm."""
    return math.ldexp(1.0, math.frexp(norm)[1] - FRACTION_BITS)


@lru_cache(maxsize=4096)
def decode(raw: bytes) -> Sketch | None:
    """The stored field ``w``; None when it is not a sketch (another length). Cached: a tensor's
    sketch is read again by every bound and distance that involves it (a Sketch is frozen)."""
    if len(raw) != STORED_BYTES:
        return None
    norm, *quantized = _LAYOUT.unpack(raw)
    step = scale_step(norm)
    buckets = tuple(math.nan if q == SATURATED else q * step for q in quantized)
    return Sketch(norm=norm, buckets=buckets, step=step)


def encode(norm: float, buckets: tuple[float, ...] | list[float]) -> bytes:
    """The stored field for a norm and float64 buckets, quantized as the recorder does it (the
    recorder has its own copy in C++; this one writes synthetic traces for tests)."""
    stored_norm = struct.unpack("<f", struct.pack("<f", norm))[0]
    step = scale_step(stored_norm)
    quantized = []
    for bucket in buckets:
        q = math.floor(abs(bucket) / step + 0.5) * (1 if bucket >= 0 else -1)  # half away from 0
        quantized.append(q if -(2**31) < q < 2**31 else SATURATED)
    return _LAYOUT.pack(stored_norm, *quantized)
