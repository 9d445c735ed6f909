"""Turning a torch tensor into a stored tensor entry: metadata plus its native fingerprint."""

from __future__ import annotations

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


def describe(tensor: torch.Tensor, slot: str) -> dict[str, Any]:
    """Metadata only: what every entry has, read or not."""
    name, _, _ = _dtype_info(tensor.dtype)
    entry: dict[str, Any] = {"n": slot, "d": name, "s": list(tensor.shape), "v": str(tensor.device)}
    if tensor.layout == torch.strided:
        entry["t"] = list(tensor.stride())
    return entry


def is_readable(tensor: torch.Tensor) -> bool:
    """Plain strided tensors with real storage on the CPU (CUDA joins with the GPU path)."""
    return (
        (type(tensor) is torch.Tensor or type(tensor) is torch.nn.Parameter)
        and tensor.layout == torch.strided
        and tensor.device.type == "cpu"
    )


def fingerprint_fields(tensor: torch.Tensor) -> dict[str, Any]:
    """The content fields of an entry (``h``, ``z``, ``b``, ``m``), or the unreadable flag."""
    if not is_readable(tensor):
        return {"f": schema.FLAG_UNREADABLE}
    _, kind, itemsize = _dtype_info(tensor.dtype)
    digest, nbytes, head, stats = _C.fingerprint(
        tensor.data_ptr(), itemsize, tensor.shape, tensor.stride(), kind, HEAD_ELEMENTS
    )
    fields: dict[str, Any] = {"h": digest, "z": nbytes, "b": head}
    if stats is not None:
        fields["m"] = list(stats)
    return fields


def content_hash(tensor: torch.Tensor) -> int:
    """Fingerprint of a contiguous CPU tensor's bytes (used for RNG states)."""
    return int(
        _C.fingerprint(tensor.data_ptr(), tensor.numel() * tensor.itemsize, [1], [1], 0, 0)[0]
    )
