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

    def fingerprint_text(self) -> str:
        if self.is_uninitialized:
            return "uninitialized"
        if self.is_view:
            return "view"
        return f"{self.hash:016x}" if self.hash is not None else "unread"

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "slot": self.slot,
            "dtype": self.dtype,
            "shape": list(self.shape),
            "fingerprint": self.fingerprint_text(),
        }
        if self.head:
            out["values"] = [_json_number(v) for v in self.values()]
            out["bits"] = self.bits()
        if self.stats is not None:
            out["stats"] = dict(
                zip(STAT_NAMES, (_json_number(v) for v in self.stats), strict=False)
            )
        if self.producer is not None:
            out["producer"] = list(self.producer)
        return out


STAT_NAMES = ("min", "max", "mean", "absmax", "nan", "inf")


def _json_number(value: Any) -> Any:
    """JSON has no NaN/Inf or complex: spell them as strings."""
    if isinstance(value, float) and (value != value or value in (float("inf"), float("-inf"))):
        return str(value)
    if isinstance(value, complex):
        return str(value)
    return value


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

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "index": self.index,
            "op": self.op,
            "step": self.step,
            "phase": self.phase,
            "call_site": self.call_site.to_json(),
            "inputs": [t.to_json() for t in self.inputs],
            "outputs": [t.to_json() for t in self.outputs],
        }
        if self.args:
            out["args"] = {name: _json_number(value) for name, value in self.args}
        if self.forward_index is not None:
            out["forward_index"] = self.forward_index
        if self.rng is not None:
            out["rng_state"] = f"{self.rng:016x}"
        if self.returned is not None:
            out["returned"] = _json_number(self.returned)
        if self.kernels:
            out["kernels"] = list(self.kernels)
        return out
