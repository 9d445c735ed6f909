"""Light views of a trace's ops: each op's index, step, alignment keys and output content,
read as columns without decoding whole records.

The diff reads every op of both traces, so it never decodes whole records: the native scanner
(``opguard._C.OpScanner``, csrc/opscan.cpp) reads the few fields alignment needs straight from
the stored msgpack bytes, a chunk of records at a time, and :meth:`LightReader.columns` hands
them on as columns (:class:`OpColumns`), one run of a step at a time. Records the scanner
leaves alone (unexpected field types, damage), and every record when the extension predates
the scanner, are decoded in Python into the same values.

What an op's keys are is the alignment's choice (:mod:`opguard.analysis.align.keys`): the
reader is given a :data:`KeyFunction` and asks it once per distinct op shape the scanner meets.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from itertools import pairwise
from typing import Any, Protocol

import msgpack

from . import schema
from .errors import DamagedRecord
from .reader import RankTrace, _unpack
from .records import check_op


def _native_scanner() -> Any:
    try:
        from .._C import OpScanner
    except ImportError:  # an extension built before the scanner: decode in Python
        return None
    return OpScanner


_NativeScanner: Any = _native_scanner()

# NaN / Inf in a tensor entry's stats, as masks (mirror of kHasNan / kHasInf in csrc/opscan.cpp).
HAS_NAN, HAS_INF = 1, 2


class NonfiniteSink(Protocol):
    def see(self, index: int, inputs: int, outputs: int) -> None: ...


def nonfinite_mask(entries: Any) -> int:
    """HAS_NAN | HAS_INF over the stats of a record's tensor entries (as the scanner reads them)."""
    mask = 0
    for entry in entries:
        stats = entry.get("m")
        if isinstance(stats, list) and len(stats) == 6:
            mask |= (HAS_NAN if _positive(stats[4]) else 0) | (
                HAS_INF if _positive(stats[5]) else 0
            )
    return mask


def _positive(count: Any) -> bool:
    return type(count) is int and count > 0


# Keys an op has, one per alignment pass (the native scanner's columns: three).
LEVELS = 3
# An op's key at each level, from its raw record, interned to small ints.
KeyFunction = Callable[[dict[str, Any]], tuple[int, ...]]


@dataclass(frozen=True, slots=True)
class LightOp:
    index: int
    step: int
    keys: tuple[int, ...]  # one interned key per level (the reader's KeyFunction)
    # The content of the outputs (and the returned scalar): opaque, equal exactly when the
    # contents are (see :func:`outputs_of`).
    outputs: Any


@dataclass(slots=True)
class OpColumns:
    """Consecutive ops of one trace as parallel columns: what alignment and the walk read."""

    step: int  # the step of the first op (all of them, from LightReader.columns)
    index: list[int]
    keys: tuple[list[int], ...]  # per level, one interned key per op
    outputs: list[Any]  # as LightOp.outputs

    def __len__(self) -> int:
        return len(self.index)

    def position(self, op: int) -> int | None:
        """Where op index ``op`` lies in these (increasing) columns, if it does."""
        found = bisect_left(self.index, op)
        return found if found < len(self.index) and self.index[found] == op else None

    def extend(self, other: OpColumns) -> None:
        self.index += other.index
        for mine, theirs in zip(self.keys, other.keys, strict=True):
            mine += theirs
        self.outputs += other.outputs


def _content(entry: dict[str, Any]) -> list[Any]:
    flags = entry.get("f", 0)
    shape = tuple(entry.get("s", ()))
    dtype = entry.get("d")
    if flags & schema.FLAG_UNINITIALIZED:
        return ["uninitialized", dtype, shape]
    if flags & schema.FLAG_VIEW:
        return ["view", dtype, shape]  # a view's data is its base's, compared where it is read
    return [dtype, shape, entry.get("h")]


def _packable(value: Any) -> tuple[bool, Any]:
    """(whether ``value`` has a packed form equal exactly for equal values, that form): None,
    strings and integers, including the floats and booleans Python holds equal to one."""
    kind = type(value)
    if value is None or kind is str or kind is int:
        return True, value
    if kind is bool or (kind is float and value.is_integer() and -(2**63) <= value < 2**64):
        return True, int(value)
    return False, value


def outputs_of(raw: dict[str, Any]) -> Any:
    """The content of an op's outputs (dtype, shape and fingerprint of each; dtype and shape
    of views and of uninitialized memory), and its returned scalar: two ops' values are equal
    exactly when these are.

    Contents are packed with msgpack, as the native scanner packs them, so that a record read
    here equals one read there. Values that have no such form (never written by the recorder:
    a float shape, a dict) keep the tuples Python compares; those can equal no packed form."""
    contents = [_content(y) for y in raw.get("y", ())]
    packed: Any
    try:
        packed = msgpack.packb(
            [[_packed(field) for field in content] for content in contents], use_bin_type=True
        )
    except _Unpackable:
        packed = ("unpacked", tuple(tuple(content) for content in contents))
    if "v" in raw:
        return (packed, ("value", hashable(raw["v"])))
    return packed


def check_light(raw: Any) -> dict[str, Any]:
    """``raw`` if it holds what :meth:`LightReader.light` reads, else :class:`DamagedRecord`.
    Looser than the reader's check: odd values the recorder never writes (a shape of floats)
    still compare, as before the check existed."""
    raw = check_op(raw, tensors=False)
    for entry in (*raw.get("x", ()), *raw.get("y", ())):
        if not (
            type(entry) is dict
            and type(entry.get("f", 0)) is int
            and _is_numbers(entry.get("s", []))
            and all(type(entry.get(k)) in _SCALARS for k in ("d", "h"))
        ):
            raise DamagedRecord("op record with a damaged tensor entry")
    return raw


_SCALARS = (type(None), bool, int, float, str, bytes)


def _is_numbers(value: Any) -> bool:
    return type(value) is list and all(type(v) in (int, float) for v in value)


class _Unpackable(Exception):
    pass


def _packed(field: Any) -> Any:
    if type(field) is tuple:
        return [_packed(item) for item in field]
    ok, value = _packable(field)
    if not ok:
        raise _Unpackable
    return value


class _PythonScanner:
    """The scanner's interface when the extension has none: every record falls back."""

    keys = 0

    def __init__(self) -> None:
        self._n = 0

    def scan(self, chunk: list[Any]) -> tuple[list[Any], ...]:
        self._n = n = len(chunk)
        return [None] * n, [None] * n, [None] * n, list(range(n)), [], [], []

    def define(self, ident: int, k0: int, k1: int, k2: int) -> None:
        raise IndexError(ident)

    def levels(self) -> tuple[list[int], ...]:
        return tuple([-1] * self._n for _ in range(LEVELS))

    def nonfinite(self) -> list[tuple[int, int, int]]:
        return []


class LightReader:
    """Turns one trace's raw ops into :class:`LightOp` and :class:`OpColumns`, each op keyed by
    ``keys`` (the alignment's key function)."""

    def __init__(
        self, trace: RankTrace, keys: KeyFunction, watch: NonfiniteSink | None = None
    ) -> None:
        self.trace = trace
        self.keys = keys
        # Told of every op with NaN or Inf in its stats, once, in execution order, as
        # columns() reads it.
        self._watch = watch
        self._scanner = _NativeScanner() if _NativeScanner is not None else _PythonScanner()

    def light(self, raw: dict[str, Any]) -> LightOp:
        return LightOp(raw["i"], raw.get("s", 0), self.keys(raw), outputs_of(raw))

    def _chunks(
        self, start: int, stop: int | None, watch: NonfiniteSink | None = None
    ) -> Iterator[tuple[OpColumns, list[Any], list[int], _Stop | None]]:
        """Columns of each chunk of records in ``[start, stop)``, the step of every op, the
        positions where the step changes, and why reading stops after this chunk, if it does. A record that cannot be decoded, or
        that the Python reader fails on, ends the chunk; it counts only when the caller reads
        past the ops before it (:meth:`_Stop.reached`), as it did when records were decoded
        one at a time."""
        scanner = self._scanner
        for chunk in self.trace.raw_chunks(start, stop):
            index, step, outputs, fallback, values, new_keys, breaks = scanner.scan(chunk)
            for position, ident in new_keys:  # validated by the scanner: decodes
                scanner.define(ident, *self.keys(_unpack(chunk[position])))
            keys = scanner.levels()
            for position, value in values:
                outputs[position] = (outputs[position], ("value", hashable(_unpack(value))))
            stop_here: _Stop | None = None
            nonfinite = scanner.nonfinite() if watch is not None else []
            for position in fallback:
                try:
                    raw = check_light(_unpack(chunk[position]))
                except DamagedRecord as exc:
                    stop_here = _Stop(self.trace, position, damage=exc)
                    break
                try:
                    op = self.light(raw)
                    masks = nonfinite_mask(raw.get("x", ())), nonfinite_mask(raw.get("y", ()))
                except Exception as exc:  # raised when reached, as before
                    stop_here = _Stop(self.trace, position, error=exc)
                    break
                if watch is not None and any(masks):
                    nonfinite.append((position, *masks))
                index[position], step[position], outputs[position] = op.index, op.step, op.outputs
                for level, key in enumerate(op.keys):
                    keys[level][position] = key
            if stop_here is not None:
                end = stop_here.position
                del index[end:], step[end:], outputs[end:]
                for column in keys:
                    del column[end:]
            if fallback:  # the scanner's breaks hold only without
                breaks = [k for k in range(1, len(step)) if step[k] != step[k - 1]]
            if watch is not None:
                for position, in_mask, out_mask in sorted(nonfinite):  # in execution order
                    if position < len(index):  # not past a damaged record
                        watch.see(index[position], in_mask, out_mask)
            yield OpColumns(step[0] if step else 0, index, keys, outputs), step, breaks, stop_here
            if stop_here is not None:
                return

    def columns(
        self, start: int = 0, stop: int | None = None, *, until: int | None = None
    ) -> Iterator[OpColumns]:
        """Ops ``[start, stop)`` in execution order, each run of consecutive ops of one step
        as one :class:`OpColumns`. With ``until``, reading ends at the first op of a later
        step (as for comparing one step): a damaged record past it is then not reported."""
        current: OpColumns | None = None
        for chunk, steps, breaks, stop_here in self._chunks(start, stop, self._watch):
            for lo, hi in pairwise([0, *breaks, len(steps)]):
                if lo == hi:  # nothing before a damaged record
                    continue
                part = chunk if hi - lo == len(steps) else _slice(chunk, lo, hi, steps[lo])
                if until is not None and part.step != until and part.step > until:
                    if current is not None:
                        yield current
                    return
                if current is not None and current.step != part.step:
                    yield current
                    current = None
                if current is None:
                    current = part
                else:
                    current.extend(part)
            if stop_here is not None:
                stop_here.reached()
        if current is not None:
            yield current

    def read(self, start: int, stop: int) -> OpColumns:
        """All ops ``[start, stop)`` as one :class:`OpColumns`, whatever their steps."""
        whole = OpColumns(0, [], tuple([] for _ in range(LEVELS)), [])
        for chunk, _, _, stop_here in self._chunks(start, stop):
            if not whole.index:
                whole.step = chunk.step
            whole.extend(chunk)
            if stop_here is not None:
                stop_here.reached()
        return whole


class _Stop:
    """Where and why reading a trace stops: a damaged record (noted on the trace, as
    :meth:`~opguard.store.RankTrace.raw_ops` notes it) or an error of the reader (raised)."""

    def __init__(
        self,
        trace: RankTrace,
        position: int,
        damage: Exception | None = None,
        error: Exception | None = None,
    ) -> None:
        self.trace, self.position, self.damage, self.error = trace, position, damage, error

    def reached(self) -> None:
        if self.damage is not None:
            self.trace.damage = f"reading stopped at a damaged record: {self.damage}"
        if self.error is not None:
            raise self.error


def _slice(columns: OpColumns, lo: int, hi: int, step: int) -> OpColumns:
    return OpColumns(
        step,
        columns.index[lo:hi],
        tuple(k[lo:hi] for k in columns.keys),
        columns.outputs[lo:hi],
    )


def hashable(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(hashable(v) for v in value)
    if isinstance(value, dict):  # keys of mixed types (a damaged record) order by type first
        return tuple(sorted(((k, hashable(v)) for k, v in value.items()), key=_key_order))
    return value


def _key_order(item: tuple[Any, Any]) -> tuple[str, Any]:
    return type(item[0]).__name__, item[0]
