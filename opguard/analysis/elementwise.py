"""How two captured tensors differ, element by element (``opguard tensor``).

A fingerprint says *that* two tensors differ; the pattern of the differences says *why*: a few
ULPs in scattered elements is reduction order, a whole row of garbage is a race or a bad GPU,
every element off by one factor is a changed scale, zeros in different places is a different
mask. This module measures the differences (count, absolute and relative error, distance in
units in the last place) and where they are, and names the pattern in one line.

Elements are compared by their bits, as the fingerprint compares them. Numbers are decoded with
numpy from the stored bytes (bfloat16 and the float8 types included), never with torch.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from .. import dtypes
from ..dtypes import Kind
from ..store.captures import CapturedTensor

FIRST_SHOWN = 8
MAX_BINS = 32
FEW_ULP = 16
SMOOTH_REL = 1e-2
CONSTANT_SPREAD = 1e-3
WHOLE_SLICE = 0.9
BLOCKS = " ▁▂▃▄▅▆▇█"

_UINT = {1: np.uint8, 2: np.uint16, 4: np.uint32, 8: np.uint64}
_FLOAT_VIEW = {Kind.FLOAT16: np.float16, Kind.FLOAT32: np.float32, Kind.FLOAT64: np.float64}
_COMPLEX = {
    Kind.COMPLEX32: Kind.FLOAT16,
    Kind.COMPLEX64: Kind.FLOAT32,
    Kind.COMPLEX128: Kind.FLOAT64,
}
_MINIFLOATS = (Kind.F8E4M3FN, Kind.F8E4M3FNUZ, Kind.F8E5M2, Kind.F8E5M2FNUZ, Kind.F8E8M0FNU)


@dataclass(frozen=True)
class Elements:
    """A captured tensor's elements: raw bits (unsigned ints) and their numbers (float64).
    Complex tensors carry a trailing axis of 2 (real, imaginary)."""

    dtype: dtypes.DType
    bits: np.ndarray
    values: np.ndarray | None  # None for opaque dtypes: bits only
    is_float: bool

    @classmethod
    def of(cls, captured: CapturedTensor) -> Elements:
        numel = int(np.prod(captured.shape, dtype=np.int64))
        itemsize = captured.nbytes // numel if numel else 1
        dtype = dtypes.lookup(captured.dtype, itemsize)
        kind = _COMPLEX.get(dtype.kind, dtype.kind)
        size = itemsize // 2 if dtype.kind in _COMPLEX else itemsize
        shape = (*captured.shape, 2) if dtype.kind in _COMPLEX else captured.shape
        unsigned = _UINT.get(size)
        if unsigned is None:  # an element size numpy has no integer for: compare bytes
            bits = np.frombuffer(captured.raw(), dtype=np.uint8).reshape(*captured.shape, itemsize)
            return cls(dtype, bits, None, False)
        bits = np.frombuffer(captured.raw(), dtype=unsigned).reshape(shape)
        return cls(dtype, bits, _numbers(bits, kind, size), kind in dtypes.FLOATING_KINDS)

    def order_keys(self) -> np.ndarray:
        """Unsigned keys in the order of the float values, so that the distance between two
        keys is the number of representable values between them (ULPs)."""
        width = self.bits.dtype.itemsize * 8
        sign = np.array(1 << (width - 1), dtype=self.bits.dtype)
        if self.dtype.kind is Kind.F8E8M0FNU:  # no sign bit
            return self.bits
        negative = (self.bits & sign) != 0
        return np.where(negative, ~self.bits, self.bits | sign)


def _numbers(bits: np.ndarray, kind: Kind, size: int) -> np.ndarray | None:
    if kind in _FLOAT_VIEW:
        return bits.view(_FLOAT_VIEW[kind]).astype(np.float64)
    if kind is Kind.BFLOAT16:
        return (bits.astype(np.uint32) << 16).view(np.float32).astype(np.float64)
    if kind in _MINIFLOATS:
        table = np.array(dtypes.decode_values(bytes(range(256)), dtypes.DType("", kind, 1)))
        return table.astype(np.float64)[bits]
    if kind is Kind.INT:
        return bits.view(np.dtype(f"i{size}")).astype(np.float64)
    if kind in (Kind.UINT, Kind.BOOL):
        return bits.astype(np.float64)
    return None


@dataclass(frozen=True)
class DimSpread:
    """Where along one dimension the differing elements are."""

    dim: int
    size: int
    bins: list[int]  # differing elements per bin of consecutive indices
    bin_width: int
    touched: int  # indices along the dimension with at least one differing element
    whole: int  # indices whose whole slice differs

    def strip(self) -> str:
        """The bins as a line of block characters, darkest where most elements differ."""
        top = max(self.bins, default=0)
        if top == 0:
            return BLOCKS[0] * len(self.bins)
        return "".join(
            BLOCKS[0] if n == 0 else BLOCKS[max(1, round(n / top * (len(BLOCKS) - 1)))]
            for n in self.bins
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "dim": self.dim,
            "size": self.size,
            "bins": self.bins,
            "bin_width": self.bin_width,
            "touched": self.touched,
            "whole": self.whole,
        }


@dataclass(frozen=True)
class ElementPair:
    index: tuple[int, ...]
    a: float | None
    b: float | None
    a_bits: str
    b_bits: str
    ulp: int | None

    def to_json(self) -> dict[str, Any]:
        return {
            "index": list(self.index),
            "a": _json_float(self.a),
            "b": _json_float(self.b),
            "a_bits": self.a_bits,
            "b_bits": self.b_bits,
            "ulp": self.ulp,
        }


@dataclass
class ElementwiseDiff:
    label: str
    dtype: str
    shape: tuple[int, ...]
    elements: int = 0
    differing: int = 0
    max_abs: float | None = None
    max_rel: float | None = None
    ulp_max: int | None = None
    ulp_median: float | None = None
    nonfinite_mismatch: int = 0  # elements NaN or infinite in one run only
    spread: list[DimSpread] = field(default_factory=list)
    first: list[ElementPair] = field(default_factory=list)
    verdict: str = ""

    @property
    def fraction(self) -> float:
        return self.differing / self.elements if self.elements else 0.0

    def to_json(self) -> dict[str, Any]:
        return {
            "tensor": self.label,
            "dtype": self.dtype,
            "shape": list(self.shape),
            "elements": self.elements,
            "differing": self.differing,
            "fraction": self.fraction,
            "max_abs_error": _json_float(self.max_abs),
            "max_rel_error": _json_float(self.max_rel),
            "ulp_max": self.ulp_max,
            "ulp_median": self.ulp_median,
            "nonfinite_mismatch": self.nonfinite_mismatch,
            "where": [s.to_json() for s in self.spread],
            "first_differing": [p.to_json() for p in self.first],
            "verdict": self.verdict,
        }


def _json_float(value: float | None) -> Any:
    if value is None or np.isfinite(value):
        return value
    return str(value)


def compare(a: CapturedTensor, b: CapturedTensor) -> ElementwiseDiff:
    """The element-wise difference of the same tensor captured in two runs."""
    result = ElementwiseDiff(a.label, a.dtype, a.shape)
    if (a.dtype, a.shape) != (b.dtype, b.shape):
        result.verdict = (
            f"not comparable element by element: {a.dtype}{list(a.shape)} (A) vs "
            f"{b.dtype}{list(b.shape)} (B)"
        )
        return result
    ea, eb = Elements.of(a), Elements.of(b)
    result.elements = int(np.prod(a.shape, dtype=np.int64))
    extra = ea.bits.ndim - len(a.shape)  # trailing axes of the element's parts
    parts = tuple(range(len(a.shape), ea.bits.ndim))
    differs = ea.bits != eb.bits
    element_differs = differs.any(axis=parts) if extra else differs
    result.differing = int(element_differs.sum())
    if result.differing == 0:
        result.verdict = "identical"
        return result
    result.spread = _spread(element_differs)
    if ea.values is not None and eb.values is not None:
        _errors(result, ea, eb, differs)
    result.first = _first(ea, eb, element_differs, extra)
    result.verdict = _characterise(result, ea, eb, differs, element_differs)
    return result


def _errors(result: ElementwiseDiff, ea: Elements, eb: Elements, differs: np.ndarray) -> None:
    va, vb = ea.values, eb.values
    assert va is not None and vb is not None
    finite_a, finite_b = np.isfinite(va), np.isfinite(vb)
    result.nonfinite_mismatch = int(((finite_a != finite_b) | (np.isnan(va) != np.isnan(vb))).sum())
    both = differs & finite_a & finite_b
    if both.any():
        x, y = va[both], vb[both]
        error = np.abs(x - y)
        scale = np.maximum(np.abs(x), np.abs(y))
        result.max_abs = float(error.max())
        result.max_rel = float((error / scale).max())  # scale > 0: the bits differ
        if ea.is_float:
            ka, kb = ea.order_keys()[both], eb.order_keys()[both]
            ulp = np.where(ka > kb, ka - kb, kb - ka)
            result.ulp_max = int(ulp.max())
            result.ulp_median = float(np.median(ulp.astype(np.float64)))


def _spread(element_differs: np.ndarray) -> list[DimSpread]:
    spreads = []
    for dim, size in enumerate(element_differs.shape):
        others = tuple(d for d in range(element_differs.ndim) if d != dim)
        per_index = element_differs.sum(axis=others) if others else element_differs.astype(int)
        slice_size = element_differs.size // size if size else 0
        width = -(-size // MAX_BINS) if size > MAX_BINS else 1
        bins = [int(per_index[lo : lo + width].sum()) for lo in range(0, size, width)]
        spreads.append(
            DimSpread(
                dim,
                size,
                bins,
                width,
                int((per_index > 0).sum()),
                int((per_index >= slice_size).sum()) if slice_size else 0,
            )
        )
    return spreads


def _bits_text(bits: np.ndarray) -> str:
    digits = bits.dtype.itemsize * 2
    return " ".join(f"0x{int(v):0{digits}x}" for v in np.atleast_1d(bits))


def _first(
    ea: Elements, eb: Elements, element_differs: np.ndarray, extra: int
) -> list[ElementPair]:
    pairs = []
    keys = (ea.order_keys(), eb.order_keys()) if ea.is_float and not extra else None
    for where in np.argwhere(element_differs)[:FIRST_SHOWN]:
        index = tuple(int(i) for i in where)
        ulp = None
        if keys is not None:
            ka, kb = int(keys[0][index]), int(keys[1][index])
            ulp = abs(ka - kb)
        pairs.append(
            ElementPair(
                index,
                _scalar(ea.values, index),
                _scalar(eb.values, index),
                _bits_text(ea.bits[index]),
                _bits_text(eb.bits[index]),
                ulp,
            )
        )
    return pairs


def _scalar(values: np.ndarray | None, index: tuple[int, ...]) -> float | None:
    if values is None:
        return None
    value = values[index]
    return float(value) if np.ndim(value) == 0 else float(np.abs(value[0] + 1j * value[1]))


def _characterise(
    r: ElementwiseDiff,
    ea: Elements,
    eb: Elements,
    differs: np.ndarray,
    element_differs: np.ndarray,
) -> str:
    """One line naming the pattern of the differences, most specific first."""
    share = f"{r.differing} of {r.elements} elements ({r.fraction:.1%})"
    if ea.values is None or eb.values is None:
        return f"raw bytes differ at {share}"
    if r.nonfinite_mismatch:
        return (
            f"NaN/Inf in one run only at {r.nonfinite_mismatch} elements: an overflow or a "
            "division by zero on one side"
        )
    za, zb = ea.values == 0, eb.values == 0
    if ea.dtype.kind is Kind.BOOL or (differs & (za != zb)).sum() * 2 >= differs.sum():
        return (
            f"different mask: {share} differ, {int((differs & (za != zb)).sum())} of them zero "
            "in one run only: a different random mask (seed, RNG state) or threshold"
        )
    whole = _whole_slices(r, element_differs)
    if whole:
        return whole
    if not ea.is_float:
        return f"integer values differ at {share}"
    constant = _constant_change(ea, eb, differs, r)
    if constant:
        return constant
    if r.ulp_max is not None and r.ulp_max <= FEW_ULP:
        if r.fraction < 0.5:
            return (
                f"scattered few-ULP differences (max {r.ulp_max} ULP) at {share}: reduction "
                "order (a nondeterministic or a different kernel)"
            )
        return (
            f"nearly every element differs by a few ULP (max {r.ulp_max}), {share}: a "
            "different kernel, precision mode (TF32) or fusion"
        )
    if r.max_rel is not None and r.max_rel <= SMOOTH_REL and r.fraction >= 0.5:
        return (
            f"smooth small error across {share} (max relative {r.max_rel:.2g}): a changed "
            "formula or approximation (an activation variant, an eps)"
        )
    if r.fraction < 0.01:
        return (
            f"a few elements differ a lot ({share}, max relative {r.max_rel or 0:.2g}): a race, "
            "a bit flip or faulty memory"
        )
    return (
        f"large differences at {share} (max relative {r.max_rel or 0:.2g}): different inputs "
        "or a different computation"
    )


def _whole_slices(r: ElementwiseDiff, element_differs: np.ndarray) -> str:
    """Differences confined to some slices along a dimension, and filling them."""
    if element_differs.ndim < 2:
        return ""
    for spread in r.spread:
        if spread.size < 2 or spread.touched == spread.size:
            continue
        slice_size = element_differs.size // spread.size
        if r.differing >= WHOLE_SLICE * spread.touched * slice_size:
            name = (
                {0: "rows", 1: "columns"}.get(spread.dim, "slices")
                if (element_differs.ndim == 2)
                else f"slices along dim {spread.dim}"
            )
            return (
                f"whole {name} differ ({spread.touched} of {spread.size}), the rest is equal: a "
                "race, a faulty GPU or a changed input row"
            )
    return ""


def _constant_change(ea: Elements, eb: Elements, differs: np.ndarray, r: ElementwiseDiff) -> str:
    """Every element scaled by one factor, or shifted by one offset."""
    if r.fraction < 0.9:
        return ""
    assert ea.values is not None and eb.values is not None
    x, y = ea.values[differs], eb.values[differs]
    nonzero = (x != 0) & (y != 0)
    if nonzero.sum() * 10 >= 9 * x.size:
        ratio = y[nonzero] / x[nonzero]
        middle = float(np.median(ratio))
        if np.ptp(ratio) <= CONSTANT_SPREAD * abs(middle) and abs(middle - 1) > CONSTANT_SPREAD:
            return (
                f"every element scaled by ~{middle:.6g} (B/A): a changed scale (learning rate, "
                "loss scale, accumulation steps)"
            )
    offset = y - x
    middle = float(np.median(offset))
    if middle != 0 and np.ptp(offset) <= CONSTANT_SPREAD * abs(middle):
        return f"every element shifted by ~{middle:.6g} (B-A): a changed bias or offset"
    return ""
