"""Turning a torch tensor into a stored tensor entry: metadata plus its native fingerprint."""

from __future__ import annotations

import struct
from typing import Any

import torch

from .. import _C
from ..dtypes import lookup
from ..store import schema

HEAD_ELEMENTS = 8

_DTYPE_INFO: dict[torch.dtype, tuple[str, int, int]] = {}


def _dtype_info(dtype: torch.dtype) -> tuple[str, int, int]:
    info = _DTYPE_INFO.get(dtype)
    if info is None:
        name = str(dtype).removeprefix("torch.")
        itemsize = dtype.itemsize
        info = (name, int(lookup(name, itemsize).kind), itemsize)
        _DTYPE_INFO[dtype] = info
    return info


def dtype_name(dtype: torch.dtype) -> str:
    """The stored name of a dtype (``float32``, ``bfloat16``)."""
    return _dtype_info(dtype)[0]


def describe(tensor: torch.Tensor, slot: str) -> dict[str, Any]:
    """Metadata only: what every entry has, read or not (``n``, ``d``, ``s``, ``v``, ``t``)."""
    return _PROBE.describe(tensor, slot)


def is_readable(tensor: torch.Tensor) -> bool:
    """Plain strided tensors with real storage (not meta, sparse, nested or subclasses)."""
    return bool(_PROBE.readable(tensor))


Fields = dict[str, Any]


class PendingFields:
    """Content fields of a device tensor whose fingerprint kernel may still be running.

    Resolved once, by the trace writer's thread; every record that reuses the fingerprint
    shares the same object."""

    __slots__ = ("_fields", "_ticket")

    def __init__(self, ticket: Any) -> None:
        self._ticket = ticket
        self._fields: Fields | None = None

    def resolve(self) -> Fields:
        if self._fields is None:
            self._fields = _gpu().collect(self._ticket)
            self._ticket = None
        return self._fields


def resolve_all(pending: list[PendingFields]) -> None:
    """Resolves many pending fingerprints at once: one wait without the GIL for the batch.

    Collecting them one by one hands the GIL back and forth with the training thread on every
    tensor, which cost more host time than the recorder's own work on a GPU step."""
    launched: dict[PendingFields, None] = {}  # in order, once each
    for fields in pending:
        while isinstance(fields, DerivedFields):
            fields = fields._base
        if fields._fields is None and fields._ticket is not None:
            launched[fields] = None
    if launched:
        results = _gpu().collect_many([fields._ticket for fields in launched])
        for fields, result in zip(launched, results, strict=True):
            fields._fields = result
            fields._ticket = None


_GPU: Any = None


def _gpu() -> Any:
    """The process's GPU fingerprinter, created on the first device tensor."""
    global _GPU
    if _GPU is None:
        usable, reason = _C.cuda_status()
        if not usable:
            raise RuntimeError(f"GPU fingerprints unavailable: {reason}")
        _GPU = _C.GpuFingerprinter()
    return _GPU


_PROBE = _C.TensorProbe(
    (torch.Tensor, torch.nn.Parameter),
    torch.strided,
    _dtype_info,
    getattr(torch._C, "_cuda_getCurrentRawStream", None),  # absent from CPU-only builds
    _gpu,
)


def fingerprint_fields(tensor: torch.Tensor) -> Fields | PendingFields:
    """The content fields of an entry (``h``, ``z``, ``b``, ``m``), the unreadable flag, or, for
    a device tensor, a :class:`PendingFields` resolved once its kernel has run."""
    result = _PROBE.fingerprint(tensor, HEAD_ELEMENTS)
    if result is None:
        return {"f": schema.FLAG_UNREADABLE}
    if type(result) is dict:
        return result
    return PendingFields(result)


class DerivedFields(PendingFields):
    """A view's fields derived from its base's, once the base's GPU fingerprint is known."""

    __slots__ = ("_base", "_geometry", "_nbytes")

    def __init__(self, base: PendingFields, geometry: tuple[int, ...], nbytes: int) -> None:
        super().__init__(None)
        self._base = base
        self._geometry = geometry
        self._nbytes = nbytes

    def resolve(self) -> Fields:
        if self._fields is None:
            self._fields = _derived(self._base.resolve()["h"], self._geometry, self._nbytes)
        return self._fields


def _derived(base_hash: int, geometry: tuple[int, ...], nbytes: int) -> Fields:
    packed = struct.pack(f"<Q{len(geometry)}q", base_hash, *geometry)
    return {"h": int(_C.hash_buffer(packed)), "z": nbytes, "f": schema.FLAG_VIEW}


def has_lazy_bits(tensor: torch.Tensor) -> bool:
    """Whether the conjugate or negative bit is set: torch applies them when the tensor is
    read, so its stored bytes are not its values, and the values of its views are not its
    bytes rearranged."""
    return bool(tensor.is_conj() or tensor.is_neg())


def views_derive_from(tensor: torch.Tensor) -> bool:
    """Whether views of ``tensor`` can take fingerprints derived from its own: its memory is
    read (:func:`is_readable`), it is contiguous and it has no lazy bits."""
    return is_readable(tensor) and tensor.is_contiguous() and not has_lazy_bits(tensor)


def address_of(tensor: torch.Tensor) -> int | None:
    """The address of the tensor's first element; None when it has no storage (sparse and
    nested tensors, some subclasses)."""
    try:
        return int(tensor.data_ptr())
    except RuntimeError:
        return None


def view_fields(
    view: torch.Tensor,
    base_ptr: int,
    base_nbytes: int | None,
    base_fields: Fields | PendingFields | None,
) -> Fields | PendingFields | None:
    """The fingerprint of a view, derived from its base's without reading memory.

    A view's content is a function of its base's content and of the view's geometry (offset,
    dtype, sizes, strides), so equal bases and equal geometry mean equal views: the derived hash
    keeps every comparison the diff makes, at no cost on the device. Returns None when the view
    reaches outside its base's bytes ``[base_ptr, base_ptr + base_nbytes)`` (None: the base is
    not contiguous, or has lazy bits), the view has lazy bits (:func:`has_lazy_bits`) or the
    base's content is unknown; the view is then read when an op uses it.
    """
    if base_fields is None or base_nbytes is None or not is_readable(view):
        return None
    if has_lazy_bits(view):
        return None
    if isinstance(base_fields, dict) and "h" not in base_fields:
        return None
    _, kind, itemsize = _dtype_info(view.dtype)
    offset = view.data_ptr() - base_ptr
    lo, hi = offset, offset + itemsize
    for size, stride in zip(view.shape, view.stride(), strict=True):
        if size == 0:
            lo, hi = offset, offset
            break
        span = (size - 1) * stride * itemsize
        lo, hi = lo + min(0, span), hi + max(0, span)
    if lo < 0 or hi > base_nbytes:
        return None
    geometry = (offset, kind, itemsize, *view.shape, *view.stride())
    nbytes = view.numel() * itemsize
    if isinstance(base_fields, PendingFields):
        return DerivedFields(base_fields, geometry, nbytes)
    return _derived(base_fields["h"], geometry, nbytes)


def content_hash(tensor: torch.Tensor) -> int:
    """Fingerprint of a contiguous CPU tensor's bytes (used for RNG states)."""
    if tensor.numel() == 0:
        return 0
    return int(
        _C.fingerprint(tensor.data_ptr(), tensor.numel() * tensor.itemsize, [1], [1], 0, 0)[0]
    )
