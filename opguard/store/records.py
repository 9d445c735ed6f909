"""Typed, read-only views of stored op records (decoded from the compact msgpack form)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from .. import dtypes
from . import schema
from .errors import DamagedRecord
from .sketch import Sketch
from .sketch import decode as decode_sketch


@dataclass(frozen=True, slots=True)
class CallSite:
    file: str
    line: int
    function: str
    source: tuple[tuple[int, str], ...] = ()  # (line number, text) around the call line

    @classmethod
    def decode(cls, raw: Any) -> CallSite:
        """An interned call site ``[file, line, function, [[line, text], ...]]``."""
        if not (
            type(raw) is list
            and len(raw) == 4
            and type(raw[0]) is str
            and type(raw[1]) is int
            and type(raw[2]) is str
            and type(raw[3]) is list
            and all(
                type(s) is list and len(s) == 2 and type(s[0]) is int and type(s[1]) is str
                for s in raw[3]
            )
        ):
            raise DamagedRecord("damaged call site")
        return cls(raw[0], raw[1], raw[2], tuple((n, t) for n, t in raw[3]))

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
    sketch_bytes: bytes | None = None  # the stored sketch ("w"), None where absent

    @classmethod
    def decode(cls, raw: Any) -> TensorRecord:
        """The tensor entry ``raw`` (as unpacked); :class:`DamagedRecord` if it is not one."""
        _check_fields(raw, _TENSOR_FIELDS, "tensor entry")
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
            sketch_bytes=raw.get("w"),
        )

    @property
    def sketch(self) -> Sketch | None:
        """The tensor's sketch (norm and buckets, from which two runs' relative distance is
        estimated); None where it has none (not floating point, no finite value, an older trace)."""
        return decode_sketch(self.sketch_bytes) if self.sketch_bytes is not None else None

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
        numel = _numel(self.shape)
        itemsize = max(1, self.nbytes // numel) if self.nbytes and numel else 1
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
        sketch = self.sketch
        if sketch is not None:
            out["norm"] = sketch.norm
        return out


STAT_NAMES = ("min", "max", "mean", "absmax", "nan", "inf")


def decode_name(raw: Any) -> str:
    """An interned op name."""
    if type(raw) is not str:
        raise DamagedRecord("damaged op name")
    return raw


def decode_stack(raw: Any) -> tuple[int, ...]:
    """An interned user stack: call-site ids, outermost first."""
    if not _is_ints(raw):
        raise DamagedRecord("damaged stack")
    return tuple(raw)


# -- what a stored record may hold ------------------------------------------------------------


def _is_int(value: Any) -> bool:
    return type(value) is int


def _is_index(value: Any) -> bool:
    return type(value) is int and value >= 0


def _is_ints(value: Any) -> bool:
    return type(value) is list and all(type(v) is int for v in value)


def _is_optional(check: Any) -> Any:
    return lambda value: value is None or check(value)


def _is_pair(value: Any) -> bool:
    return type(value) is list and len(value) == 2 and all(type(v) is int for v in value)


def _is_number(value: Any) -> bool:
    return type(value) in (int, float)


def _is_list_of(check: Any) -> Any:
    return lambda value: type(value) is list and all(check(v) for v in value)


def _is_tensor(value: Any) -> bool:
    return type(value) is dict and all(
        check(value[name]) for name, check in _TENSOR_FIELDS.items() if name in value
    )


_TENSOR_FIELDS: dict[str, Any] = {
    "n": lambda v: type(v) in (str, int),
    "d": lambda v: type(v) is str,
    "s": _is_ints,
    "t": _is_ints,
    "v": lambda v: type(v) is str,
    "h": lambda v: type(v) is int and 0 <= v < 1 << 64,
    "b": lambda v: type(v) is bytes,
    "z": _is_index,
    "m": _is_optional(_is_list_of(lambda v: v is None or _is_number(v))),
    "p": _is_optional(_is_pair),
    "f": _is_index,
    "w": lambda v: type(v) is bytes,
}

OP_FIELDS: dict[str, Any] = {
    "i": _is_index,
    "o": _is_int,
    "s": _is_int,
    "p": lambda v: type(v) is int and 0 <= v < len(schema.PHASES),
    "c": _is_optional(_is_int),
    "k": _is_optional(_is_int),
    "f": _is_optional(_is_int),
    "a": _is_list_of(lambda v: type(v) is list and len(v) == 2 and type(v[0]) in (str, int)),
    "x": _is_list_of(_is_tensor),
    "y": _is_list_of(_is_tensor),
    "r": _is_optional(lambda v: type(v) is int and 0 <= v < 1 << 64),
    "l": _is_ints,
}
OP_FIELDS_SHALLOW = {
    **OP_FIELDS,
    "x": lambda v: type(v) is list,
    "y": lambda v: type(v) is list,
}
REQUIRED_OP_FIELDS = ("i", "o")


def check_op(raw: Any, *, tensors: bool = True) -> dict[str, Any]:
    """``raw`` if it is an op record as the recorder writes it (the fields readers use, with
    their types); else :class:`DamagedRecord`. Fields the reader does not know are ignored, so
    a later recorder may add some. ``tensors=False`` leaves the tensor entries to
    :meth:`TensorRecord.decode` (a cheaper check for readers of the top-level fields)."""
    _check_fields(raw, OP_FIELDS if tensors else OP_FIELDS_SHALLOW, "op record")
    missing = [name for name in REQUIRED_OP_FIELDS if name not in raw]
    if missing:
        raise DamagedRecord(f"op record without field(s) {', '.join(missing)}")
    return raw


def _check_fields(raw: Any, checks: dict[str, Any], what: str) -> None:
    if type(raw) is not dict:
        raise DamagedRecord(f"{what} is a {type(raw).__name__}, not a map")
    for name, check in checks.items():
        if name in raw and not check(raw[name]):
            raise DamagedRecord(f"{what} field {name!r} has a damaged value")


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


def _ints(value: Any) -> tuple[int, ...] | None:
    return tuple(value) if isinstance(value, (list, tuple)) else None


def _int(value: Any) -> int | None:
    return value if type(value) is int else None


@dataclass(frozen=True, slots=True)
class KernelEntry:
    """One piece of GPU work an op launched (a kernel, memcpy or memset) as CUPTI reported it,
    decoded once from the ``kernels`` database's short keys (:mod:`.schema`), so readers name
    fields instead of spelling msgpack keys. Fields a trace did not store are None; ``stored``
    keeps the entry as written, which is its JSON form (the diff's ``kernels`` lists)."""

    kind: str  # "kernel", "memcpy" or "memset"
    name: str
    grid: tuple[int, ...] | None
    block: tuple[int, ...] | None
    stream: int | None
    device: int | None
    start_ns: int | None
    end_ns: int | None
    nbytes: int | None
    unrecorded: bool  # launched after the op, outside any recorded op (``u``)
    stored: Mapping[str, Any] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def decode(cls, raw: Mapping[str, Any]) -> KernelEntry:
        return cls(
            kind=str(raw.get("k", "kernel")),
            name=str(raw.get("n", "?")),
            grid=_ints(raw.get("g")),
            block=_ints(raw.get("b")),
            stream=_int(raw.get("s")),
            device=_int(raw.get("d")),
            start_ns=_int(raw.get("t0")),
            end_ns=_int(raw.get("t1")),
            nbytes=_int(raw.get("z")),
            unrecorded=bool(raw.get(schema.KERNEL_UNCLAIMED)),
            stored=raw,
        )

    @property
    def is_kernel(self) -> bool:
        """A compute kernel (not a memcpy or memset)."""
        return self.kind == "kernel"

    @property
    def duration_us(self) -> float:
        """How long it ran, in µs (0 where a time is missing)."""
        return ((self.end_ns or 0) - (self.start_ns or 0)) / 1e3

    def to_json(self) -> dict[str, Any]:
        return dict(self.stored)


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
    kernels: tuple[KernelEntry, ...] = field(default=())
    # GPU work launched after this op, before the next one, by code OpGuard did not record
    unclaimed_kernels: tuple[KernelEntry, ...] = field(default=())
    # A kernel Inductor generated: the user's source lines it was made from (call_site stays
    # where the compiled code was called)
    origins: tuple[CallSite, ...] = field(default=())

    @property
    def is_backward(self) -> bool:
        return self.phase == "backward"

    @property
    def is_collective(self) -> bool:
        """A c10d collective (its output may be another rank's data)."""
        return self.op.split("::", 1)[0] in schema.COLLECTIVE_NAMESPACES

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
            out["kernels"] = [k.to_json() for k in self.kernels]
        if self.unclaimed_kernels:
            out["unrecorded_after"] = [k.to_json() for k in self.unclaimed_kernels]
        if self.origins:
            out["origins"] = [site.to_json() for site in self.origins]
        return out
