"""Turning a torch tensor into a stored tensor entry: metadata plus its native fingerprint."""

from __future__ import annotations

from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch._subclasses.functional_tensor import FunctionalTensor

from .. import _C
from .._C import EntryRecorder, PendingFields
from ..dtypes import lookup

HEAD_ELEMENTS = 8
# The tensor classes whose memory the recorder reads; subclasses (DTensor, fake, functional
# tensors) may hold no storage of their own.
PLAIN_TENSORS = (torch.Tensor, torch.nn.Parameter)
DATALESS_TENSORS = (FakeTensor, FunctionalTensor)
# How OpGuard's dispatch modes treat a call on tensors that are not all plain
# (:func:`subclass_call`): run it as it is, or hand it back to the subclass.
RUN_AS_IS, HAND_BACK = "run as is", "hand back"


def dispatch_stack() -> list[Any]:
    """The dispatch modes pushed on this thread, innermost last."""
    return [torch._C._get_dispatch_stack_at(i) for i in range(torch._C._len_torch_dispatch_stack())]


def subclass_call(types: Any) -> str | None:
    """How a dispatch mode of OpGuard's (the recorder, a control run's perturbation) treats a
    call whose tensor ``types`` are not all plain; None where they are. Fake and functional
    tensors (DTensor's sharding propagation, tracing) hold no data and refuse to run while
    another mode is active: :data:`RUN_AS_IS`. Another subclass (the functional collectives'
    AsyncCollectiveTensor, DTensor) may hold no storage to read: :data:`HAND_BACK`
    (``NotImplemented``), so that it unwraps itself and the ops it runs on plain tensors come
    back through the mode."""
    if all(t in PLAIN_TENSORS for t in types):
        return None
    return RUN_AS_IS if any(issubclass(t, DATALESS_TENSORS) for t in types) else HAND_BACK


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


def is_readable(tensor: torch.Tensor) -> bool:
    """Plain strided tensors with real storage (not meta, sparse, nested or subclasses)."""
    return bool(_PROBE.readable(tensor))


Fields = dict[str, Any]


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
    PLAIN_TENSORS,
    torch.strided,
    _dtype_info,
    getattr(torch._C, "_cuda_getCurrentRawStream", None),  # absent from CPU-only builds
    _gpu,
)


def fingerprint_fields(tensor: torch.Tensor) -> Fields | PendingFields:
    """The content fields of an entry (``h``, ``z``, ``b``, ``m``), the unreadable flag, or, for
    a device tensor, a :class:`PendingFields` resolved once its kernel has run."""
    return _PROBE.fingerprint(tensor, HEAD_ELEMENTS)


def fingerprint_all(
    tensors: list[torch.Tensor], labels: list[bytes], *, sketch: bool
) -> _C.StateBatch:
    """Fingerprints of many tensors at once, each with its step-level entry's label
    (``_C.state_label``), GPU ones launched together on their devices' current streams: a
    batch for ``_C.pack_entries`` (``csrc/state_record.h``); ``sketch``: their entries keep
    their sketch."""
    return _C.fingerprint_all(_PROBE, tensors, labels, HEAD_ELEMENTS, sketch)


def ring_load() -> float:
    """The share of the GPU result rings holding fingerprints not collected yet (0 off the
    GPU)."""
    return float(_PROBE.ring_load())


def returned_tensors(out: Any) -> list[tuple[str, torch.Tensor]]:
    """(slot, tensor) of every plain tensor an op returned, nested lists included, as the
    recorder lists its outputs (``csrc/op_plan.h``)."""
    return _C.returned_tensors(_PROBE, out)


def entry_recorder() -> EntryRecorder:
    """A new native :class:`opguard._C.EntryRecorder`: the entries of op inputs and outputs, and
    what is known of each live tensor's producer and content (``csrc/provenance.h``)."""
    return _C.EntryRecorder(_PROBE, HEAD_ELEMENTS)


def content_hash(tensor: torch.Tensor) -> int:
    """Fingerprint of a contiguous CPU tensor's bytes (used for RNG states)."""
    if tensor.numel() == 0:
        return 0
    return int(
        _C.fingerprint(tensor.data_ptr(), tensor.numel() * tensor.itemsize, [1], [1], 0, 0)[0]
    )
