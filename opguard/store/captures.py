"""Full tensor contents stored for the ops a person asked to capture (``record --capture``).

A fingerprint says that two tensors differ; a capture says how. Each captured tensor is one
record of the ``captures`` database (see :mod:`opguard.store.schema`): the bytes of its
elements in logical row-major order (so a strided view and its contiguous copy store the same
bytes), compressed with zlib at its fastest level (training data rarely compresses much, so a
slower level buys little and costs the writer thread time), with its slot, dtype and shape.
"""

from __future__ import annotations

import struct
import zlib
from dataclasses import dataclass
from typing import Any

from . import schema
from .errors import TraceError

CODEC = "zlib"
ZLIB_LEVEL = 1
INPUT, OUTPUT = "x", "y"  # the record lists they belong to (schema: x inputs, y outputs)
DIRECTIONS = {INPUT: "input", OUTPUT: "output"}

_POSITION = struct.Struct(">H")
_KEY_LENGTH = 8 + 1 + _POSITION.size


def capture_key(index: int, direction: str, position: int) -> bytes:
    """Keys sort by op, then inputs before outputs, then position: writes append."""
    return schema.op_key(index) + direction.encode() + _POSITION.pack(position)


def parse_key(key: bytes) -> tuple[int, str, int]:
    """(op index, direction, position) of a capture key."""
    if len(key) != _KEY_LENGTH:
        raise ValueError(f"capture key of {len(key)} bytes")
    return (
        schema.op_index(key[:8]),
        key[8:9].decode(),
        int(_POSITION.unpack(key[9:])[0]),
    )


def encode(slot: str, dtype: str, shape: list[int], data: Any) -> dict[str, Any]:
    """The stored value of one tensor; ``data``: a buffer of its elements in logical order."""
    raw = memoryview(data).cast("B")
    return {
        "n": slot,
        "d": dtype,
        "s": shape,
        "c": CODEC,
        "z": raw.nbytes,
        "b": zlib.compress(raw, ZLIB_LEVEL),
    }


@dataclass(frozen=True, slots=True)
class CapturedTensor:
    """One captured tensor of an op, still compressed until :meth:`raw` is called."""

    index: int
    direction: str  # INPUT or OUTPUT
    position: int  # in the op record's inputs or outputs
    slot: str
    dtype: str
    shape: tuple[int, ...]
    nbytes: int
    codec: str
    compressed: bytes

    @classmethod
    def decode(cls, key: bytes, value: dict[str, Any]) -> CapturedTensor:
        index, direction, position = parse_key(key)
        return cls(
            index,
            direction,
            position,
            str(value.get("n", "")),
            str(value.get("d", "?")),
            tuple(value.get("s", ())),
            int(value.get("z", 0)),
            str(value.get("c", CODEC)),
            bytes(value.get("b", b"")),
        )

    @property
    def label(self) -> str:
        """``output 0`` / ``input self``: how reports name it."""
        return f"{DIRECTIONS.get(self.direction, self.direction)} {self.slot}"

    def raw(self) -> bytes:
        """The elements' bytes in logical row-major order."""
        if self.codec != CODEC:
            raise TraceError(
                f"captured {self.label} of op {self.index}: unknown codec {self.codec}"
            )
        try:
            data = zlib.decompress(self.compressed)
        except zlib.error as exc:
            raise TraceError(f"captured {self.label} of op {self.index}: damaged ({exc})") from None
        if len(data) != self.nbytes:
            raise TraceError(
                f"captured {self.label} of op {self.index}: {len(data)} bytes, expected "
                f"{self.nbytes}"
            )
        return data
