"""Element types as OpGuard stores them: names, the native kernel's kind codes, and decoding.

Traces name dtypes by torch's spelling without the ``torch.`` prefix (``"bfloat16"``). This module
does not import torch, so the analysis side can turn stored raw bits back into numbers on a
machine without it.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass
from enum import IntEnum


class Kind(IntEnum):
    """Mirror of ``opguard::Kind`` in ``csrc/fingerprint.h`` (append only)."""

    OPAQUE = 0
    BOOL = 1
    UINT = 2
    INT = 3
    FLOAT16 = 4
    BFLOAT16 = 5
    FLOAT32 = 6
    FLOAT64 = 7
    COMPLEX32 = 8
    COMPLEX64 = 9
    COMPLEX128 = 10
    F8E4M3FN = 11
    F8E4M3FNUZ = 12
    F8E5M2 = 13
    F8E5M2FNUZ = 14
    F8E8M0FNU = 15


@dataclass(frozen=True, slots=True)
class DType:
    name: str
    kind: Kind
    itemsize: int


_TABLE = [
    DType("bool", Kind.BOOL, 1),
    DType("uint8", Kind.UINT, 1),
    DType("uint16", Kind.UINT, 2),
    DType("uint32", Kind.UINT, 4),
    DType("uint64", Kind.UINT, 8),
    DType("int8", Kind.INT, 1),
    DType("int16", Kind.INT, 2),
    DType("int32", Kind.INT, 4),
    DType("int64", Kind.INT, 8),
    DType("float16", Kind.FLOAT16, 2),
    DType("bfloat16", Kind.BFLOAT16, 2),
    DType("float32", Kind.FLOAT32, 4),
    DType("float64", Kind.FLOAT64, 8),
    DType("complex32", Kind.COMPLEX32, 4),
    DType("complex64", Kind.COMPLEX64, 8),
    DType("complex128", Kind.COMPLEX128, 16),
    DType("float8_e4m3fn", Kind.F8E4M3FN, 1),
    DType("float8_e4m3fnuz", Kind.F8E4M3FNUZ, 1),
    DType("float8_e5m2", Kind.F8E5M2, 1),
    DType("float8_e5m2fnuz", Kind.F8E5M2FNUZ, 1),
    DType("float8_e8m0fnu", Kind.F8E8M0FNU, 1),
]
BY_NAME: dict[str, DType] = {d.name: d for d in _TABLE}

FLOATING_KINDS = frozenset(
    {Kind.FLOAT16, Kind.BFLOAT16, Kind.FLOAT32, Kind.FLOAT64, Kind.COMPLEX32, Kind.COMPLEX64}
    | {Kind.COMPLEX128, Kind.F8E4M3FN, Kind.F8E4M3FNUZ, Kind.F8E5M2, Kind.F8E5M2FNUZ}
    | {Kind.F8E8M0FNU}
)


def lookup(name: str, itemsize: int) -> DType:
    """The stored dtype of ``name``; unknown dtypes (quantized, bits, sub-byte) are opaque."""
    return BY_NAME.get(name) or DType(name, Kind.OPAQUE, itemsize)


def _minifloat(v: int, exp_bits: int, mant_bits: int, bias: int, fnuz: bool, ieee: bool) -> float:
    if fnuz and v == 0x80:
        return math.nan
    sign = -1.0 if v >> 7 else 1.0
    exp = (v >> mant_bits) & ((1 << exp_bits) - 1)
    mant = v & ((1 << mant_bits) - 1)
    exp_max = (1 << exp_bits) - 1
    if ieee and exp == exp_max:
        return math.nan if mant else sign * math.inf
    if not ieee and not fnuz and exp == exp_max and mant == (1 << mant_bits) - 1:
        return math.nan
    if exp == 0:
        return sign * math.ldexp(mant, 1 - bias - mant_bits)
    return sign * math.ldexp(mant + (1 << mant_bits), exp - bias - mant_bits)


def _component(raw: bytes, kind: Kind, itemsize: int) -> float | int | bool:
    if kind is Kind.BOOL:
        return raw[0] != 0
    if kind is Kind.UINT:
        return int.from_bytes(raw[:itemsize], "little")
    if kind is Kind.INT:
        return int.from_bytes(raw[:itemsize], "little", signed=True)
    if kind in (Kind.FLOAT16, Kind.COMPLEX32):
        return float(struct.unpack("<e", raw[:2])[0])
    if kind is Kind.BFLOAT16:
        return float(struct.unpack("<f", b"\0\0" + raw[:2])[0])
    if kind in (Kind.FLOAT32, Kind.COMPLEX64):
        return float(struct.unpack("<f", raw[:4])[0])
    if kind in (Kind.FLOAT64, Kind.COMPLEX128):
        return float(struct.unpack("<d", raw[:8])[0])
    if kind is Kind.F8E4M3FN:
        return _minifloat(raw[0], 4, 3, 7, False, False)
    if kind is Kind.F8E4M3FNUZ:
        return _minifloat(raw[0], 4, 3, 8, True, False)
    if kind is Kind.F8E5M2:
        return _minifloat(raw[0], 5, 2, 15, False, True)
    if kind is Kind.F8E5M2FNUZ:
        return _minifloat(raw[0], 5, 2, 16, True, False)
    if kind is Kind.F8E8M0FNU:
        return math.nan if raw[0] == 0xFF else math.ldexp(1.0, raw[0] - 127)
    raise ValueError(f"no decoder for {kind!r}")


def decode_values(raw: bytes, dtype: DType) -> list[float | int | bool | complex | None]:
    """Turns raw element bytes into Python numbers (None for opaque dtypes)."""
    size = dtype.itemsize
    out: list[float | int | bool | complex | None] = []
    for start in range(0, len(raw) - size + 1, size):
        elem = raw[start : start + size]
        if dtype.kind is Kind.OPAQUE:
            out.append(None)
        elif dtype.kind in (Kind.COMPLEX32, Kind.COMPLEX64, Kind.COMPLEX128):
            half = size // 2
            re = _component(elem[:half], dtype.kind, half)
            im = _component(elem[half:], dtype.kind, half)
            out.append(complex(float(re), float(im)))
        else:
            out.append(_component(elem, dtype.kind, size))
    return out


def element_bits(raw: bytes, itemsize: int) -> list[str]:
    """Raw element bits as fixed-width hex, most significant byte first (``0x3f800000``)."""
    return [
        "0x" + raw[i : i + itemsize][::-1].hex()
        for i in range(0, len(raw) - itemsize + 1, itemsize)
    ]
