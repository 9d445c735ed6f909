"""Typed, read-only views of stored op records (decoded from the compact msgpack form)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from .. import dtypes
from . import schema


@dataclass(frozen=True, slots=True)
class CallSite:
    file: str
    line: int
    function: str
    source: tuple[tuple[int, str], ...] = ()  # (line number, text) around the call line

    def short(self) -> str:
        return f"{self.file.rsplit('/', 1)[-1]}:{self.line} ({self.function})"

    def source_line(self) -> str | None:
        for number, text in self.source:
            if number == self.line:
                return text.strip()
        return None

    def to_json(self) -> dict[str, Any]:
        return {"file": self.file, "line": self.line, "function": self.function}


UNKNOWN_SITE = CallSite("<unknown>", 0, "<unknown>")


@dataclass(frozen=True, slots=True)
class TensorRecord:
    slot: str
    dtype: str
    shape: tuple[int, ...]
    stride: tuple[int, ...]
    device: str
    hash: int | None
    nbytes: int
    head: bytes
    stats: tuple[Any, ...] | None
    producer: tuple[int, int] | None
    flags: int

    @classmethod
    def decode(cls, raw: dict[str, Any]) -> TensorRecord:
        producer = raw.get("p")
        stats = raw.get("m")
        return cls(
            slot=str(raw.get("n", "")),
            dtype=raw.get("d", "?"),
            shape=tuple(raw.get("s", ())),
            stride=tuple(raw.get("t", ())),
            device=raw.get("v", "cpu"),
            hash=raw.get("h"),
            nbytes=raw.get("z", 0),
            head=raw.get("b", b""),
            stats=tuple(stats) if stats is not None else None,
            producer=(producer[0], producer[1]) if producer is not None else None,
            flags=raw.get("f", 0),
        )

    @property
    def is_view(self) -> bool:
        return bool(self.flags & schema.FLAG_VIEW)

    @property
    def is_uninitialized(self) -> bool:
        return bool(self.flags & schema.FLAG_UNINITIALIZED)

    def content_key(self) -> tuple[Any, ...] | None:
        """What must be equal for two tensors to hold the same data; None when unknown."""
        if self.is_uninitialized:
            return ("uninitialized", self.dtype, self.shape)
        if self.hash is None:
            return None
        return (self.dtype, self.shape, self.hash)

    def values(self) -> list[Any]:
        return dtypes.decode_values(self.head, self._dtype())

    def bits(self) -> list[str]:
        return dtypes.element_bits(self.head, self._dtype().itemsize)

    def _dtype(self) -> dtypes.DType:
        itemsize = self.nbytes // _numel(self.shape) if self.nbytes and _numel(self.shape) else 1
        return dtypes.lookup(self.dtype, itemsize)

    def describe_shape(self) -> str:
        return f"{self.dtype}[{', '.join(map(str, self.shape))}]"


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for s in shape:
        n *= s
    return n


@dataclass(frozen=True, slots=True)
class OpRecord:
    index: int
    op: str
    step: int
    phase: str
    call_site: CallSite
    stack_id: int
    forward_index: int | None
    args: tuple[tuple[str, Any], ...]
    inputs: tuple[TensorRecord, ...]
    outputs: tuple[TensorRecord, ...]
    rng: int | None
    returned: Any = None
    kernels: tuple[dict[str, Any], ...] = field(default=())

    @property
    def is_backward(self) -> bool:
        return self.phase == "backward"
