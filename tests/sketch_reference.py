"""The sketch (:mod:`opguard.store.sketch`) computed with numpy from a tensor's values: the
reference the recorder's C++/CUDA sketch is tested against, and how synthetic traces get one."""

from __future__ import annotations

import numpy as np

from opguard.store import sketch

_M1 = np.uint64(0xFF51AFD7ED558CCD)
_M2 = np.uint64(0xC4CEB9FE1A85EC53)


def fmix64(x: np.ndarray) -> np.ndarray:
    """Murmur3's finaliser over uint64 (as csrc/fingerprint.h's ``fmix64``)."""
    x = x ^ (x >> np.uint64(33))
    x = x * _M1
    x = x ^ (x >> np.uint64(33))
    x = x * _M2
    return x ^ (x >> np.uint64(33))


def buckets_and_signs(numel: int, first_index: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Each logical element's bucket and sign (+1/-1), for indices ``first_index ...``."""
    index = np.arange(first_index, first_index + numel, dtype=np.uint64)
    with np.errstate(over="ignore"):
        word = fmix64(
            (index >> np.uint64(3)) * np.uint64(sketch.INDEX_KEY) + np.uint64(sketch.SALT)
        )
    bucket = ((word >> np.uint64(32)) * np.uint64(sketch.BUCKETS)) >> np.uint64(32)
    negative = (word >> (index & np.uint64(sketch.GROUP - 1))) & np.uint64(1)
    return bucket.astype(np.int64), 1.0 - 2.0 * negative.astype(np.float64)


def raw_sketch(values: np.ndarray, first_index: int = 0) -> tuple[float, np.ndarray]:
    """The float64 norm and buckets of ``values`` (any float dtype, any shape: logical order);
    NaNs and infinities add 0."""
    flat = np.ascontiguousarray(values).reshape(-1).astype(np.float64)
    flat = np.where(np.isfinite(flat), flat, 0.0)
    bucket, sign = buckets_and_signs(flat.size, first_index)
    buckets = np.bincount(bucket, weights=sign * flat, minlength=sketch.BUCKETS)
    return float(np.sqrt(np.sum(flat * flat))), buckets


def stored_sketch(values: np.ndarray) -> bytes:
    """The stored field ``w`` of a tensor holding ``values``."""
    norm, buckets = raw_sketch(values)
    return sketch.encode(norm, list(buckets))
