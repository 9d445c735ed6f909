"""Storing the full tensors of chosen ops (``opguard record --capture SPEC``).

The training's numbers never change: a capture is a copy, made on the training thread right
where the recorder reads the tensor (inputs before the op runs, so an in-place op's input is
its old content; outputs after), into new host memory. The writer thread compresses and stores
it. On the GPU the copy to the host waits for the op's stream: capture costs one
synchronisation per captured tensor, and only captured ops pay it.

A per-rank cap on the bytes captured keeps a broad SPEC from filling the disk: tensors past it
are skipped and counted, and the trace's ``info/capture`` entry says the cap was hit.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from ..capture_spec import CaptureSpec
from ..store import captures
from ..store.writer import TraceWriter
from .tensors import dtype_name, is_readable


class Capturer:
    """Decides per op whether it is captured and copies its tensors for the writer."""

    def __init__(self, spec: CaptureSpec, limit: int, writer: TraceWriter) -> None:
        self.spec = spec
        self.limit = limit
        self._writer = writer
        self.bytes = 0
        self.tensors = 0
        self.ops: set[int] = set()
        self.matched = 0  # ops the SPEC chose (captured, or skipped past the cap)
        self.skipped = 0
        self.first_skipped: list[Any] | None = None  # [op index, "input"/"output", slot]
        self.unreadable = 0

    def wants(self, index: int, name: str, site: Callable[[], tuple[str, int] | None]) -> bool:
        wanted = self.spec.matches(index, name, site)
        self.matched += wanted
        return wanted

    def take(self, index: int, direction: str, position: int, slot: str, tensor: Any) -> None:
        """Copies ``tensor`` (an input before the op, an output after it) for the trace."""
        if not is_readable(tensor):
            self.unreadable += 1
            return
        nbytes = tensor.numel() * tensor.element_size()
        if self.bytes + nbytes > self.limit:
            self.skipped += 1
            if self.first_skipped is None:
                self.first_skipped = [index, captures.DIRECTIONS[direction], slot]
            return
        self.bytes += nbytes
        self.tensors += 1
        self.ops.add(index)
        data = _host_bytes(tensor)
        name, shape = dtype_name(tensor.dtype), list(tensor.shape)
        self._writer.put_capture(
            captures.capture_key(index, direction, position),
            lambda: captures.encode(slot, name, shape, data),
        )

    def summary(self) -> dict[str, Any]:
        """The trace's ``info/capture`` entry."""
        return {
            "spec": self.spec.text,
            "limit": self.limit,
            "bytes": self.bytes,
            "tensors": self.tensors,
            "ops": len(self.ops),
            "skipped": self.skipped,
            "limit_hit": self.skipped > 0,
            "first_skipped": self.first_skipped,
            "unreadable": self.unreadable,
        }


def _host_bytes(tensor: torch.Tensor) -> Any:
    """A new contiguous host copy of ``tensor``'s elements in logical order, as a byte buffer.

    ``copy=True`` always allocates: the copy never aliases the training's memory, whatever
    happens to the tensor later. Lazy conjugate/negative bits are applied first (the stored
    bytes must be the values). From a GPU this is a synchronous copy on the current stream."""
    tensor = tensor.detach()
    if tensor.is_conj() or tensor.is_neg():
        tensor = tensor.resolve_conj().resolve_neg()
    copy = tensor.to(device="cpu", memory_format=torch.contiguous_format, copy=True)
    return copy.reshape(-1).view(torch.uint8).numpy()
