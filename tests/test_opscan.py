"""The native record scanner (csrc/opscan.cpp) against the Python reader it stands in for.

Whatever record the scanner takes, it must read exactly what the Python reader makes of it
(index, step, the alignment key's parts, the output contents); whatever it cannot vouch for,
including every record msgpack-python refuses, it must hand back as a fallback.
"""

from __future__ import annotations

from typing import Any

import msgpack
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from opguard.store.light import hashable, outputs_of

_C = pytest.importorskip("opguard._C")
if not hasattr(_C, "OpScanner"):
    pytest.skip("extension built without the scanner", allow_module_level=True)


def python_view(raw: Any) -> tuple[Any, Any, Any, Any] | None:
    """(index, step, key parts, outputs) as the Python reader computes them; None where it
    raises (the scanner must then fall back and leave the error to Python)."""
    try:
        signature = tuple((x.get("d"), tuple(x.get("s", ()))) for x in raw.get("x", ()))
        key = (raw["o"], raw.get("p", 3), raw.get("c", -1), signature)
        hash(key)
        return raw["i"], raw.get("s", 0), key, outputs_of(raw)
    except (KeyError, TypeError, AttributeError):
        return None


def scan(records: list[bytes]) -> list[tuple[Any, Any, int, Any] | None]:
    """The scanner's reading of each record: (index, step, key id, outputs), None: fallback."""
    scanner = _C.OpScanner()
    index, step, outputs, fallback, values, new_keys, breaks = scanner.scan(records)
    for _, ident in new_keys:
        scanner.define(ident, ident, ident, ident)
    keys = scanner.levels()[0]
    for position, value in values:
        unpacked = msgpack.unpackb(value, raw=False, strict_map_key=False)
        outputs[position] = (outputs[position], ("value", hashable(unpacked)))
    if not fallback:
        assert breaks == [k for k in range(1, len(records)) if step[k] != step[k - 1]]
    return [
        None if k in fallback else (index[k], step[k], keys[k], outputs[k])
        for k in range(len(records))
    ]


def check(records: list[bytes]) -> int:
    """Asserts the scanner agrees with Python on every record; returns how many it took."""
    decoded: list[Any] = []
    for data in records:
        try:
            decoded.append(python_view(msgpack.unpackb(data, raw=False, strict_map_key=False)))
        except Exception:  # refused: the scanner must refuse it too
            decoded.append(None)
    scanned = scan(records)
    ids: dict[int, Any] = {}
    taken = 0
    for data, mine, theirs in zip(records, scanned, decoded, strict=True):
        if mine is None:
            continue
        taken += 1
        assert theirs is not None, f"scanner took a record Python refuses: {data!r}"
        index, step, ident, outputs = mine
        assert (index, step) == theirs[:2]
        assert outputs == theirs[3]
        assert ids.setdefault(ident, theirs[2]) == theirs[2], "one key id for different keys"
    assert len(set(map(repr, ids.values()))) == len(ids), "one key with several ids"
    return taken


def tensor(slot: str = "self", **fields: Any) -> dict[str, Any]:
    entry = {"n": slot, "d": "float32", "s": [2, 3], "v": "cpu", "t": [3, 1]}
    entry.update({"h": 0xFEDCBA9876543210, "z": 24, "b": b"\0" * 24, "m": [0.0, 1.0, 0.5]})
    entry.update(fields)
    return {k: v for k, v in entry.items() if v is not ...}


def record(**fields: Any) -> dict[str, Any]:
    raw = {"i": 7, "o": 3, "s": 1, "x": [tensor(p=[6, 0])], "y": [tensor("0")], "p": 0, "c": 4}
    raw.update({"k": 2, "a": [["alpha", 1.5], ["dim", [0, -1]]]})
    raw.update(fields)
    return {k: v for k, v in raw.items() if v is not ...}


RECORDS = [
    record(),
    record(i=2**40, s=300, o=70000, c=2**31),
    record(s=...),  # step absent: 0
    record(p=..., c=...),  # phase and call site absent: Python's defaults
    record(x=...),
    record(y=...),
    record(x=[], y=[]),
    record(y=[], v=3.25),
    record(y=[], v=[1, [2, {"a": None}]]),
    record(y=[tensor("0", f=1)]),  # a view: no hash compared
    record(y=[tensor("0", f=1, h=...)]),
    record(y=[tensor("0", f=2, h=5)]),  # uninitialized memory
    record(y=[tensor("0", f=8)]),  # written in place
    record(y=[tensor("0", f=-1)]),
    record(y=[tensor("0", h=...)]),  # not read
    record(y=[tensor("0", h=None)]),
    record(y=[tensor("0", h=-5), tensor("1", h=2**64 - 1), tensor("2", h=0)]),
    record(y=[tensor("0", s=[]), tensor("1", s=...), tensor("2", s=[-1, 2**40])]),
    record(y=[tensor("0", d=...), tensor("1", d=None), tensor("2", d="x" * 40)]),
    record(x=[tensor(d="é" * 200), tensor(s=list(range(20)))]),
    record(y=[tensor("0")] * 20),
    record(extra={"nested": [1, 2, {"k": b"bytes"}]}, g=[{"n": "kernel"}]),
    # what the Python reader would not take as it is: fallbacks
    record(i=...),
    record(o=...),
    record(i=1.0),
    record(s=None),
    record(p=True),
    record(c=None),
    record(c="site"),
    record(o=2**64 - 1),
    record(x=None),
    record(x=[5]),
    record(x=[tensor(d=b"float32")]),
    record(x=[tensor(d=3)]),
    record(x=[tensor(s=None)]),
    record(x=[tensor(s=[2.0, 3])]),
    record(x=[tensor(s=[2**63])]),
    record(y=[tensor("0", f=None)]),
    record(y=[tensor("0", f=2**64 - 1)]),
    record(y=[tensor("0", h=1.5)]),
    record(y=[tensor("0", h="abc")]),
    record(y={"0": 1}),
]


def test_records_read_as_python_reads_them() -> None:
    packed = [msgpack.packb(r, use_bin_type=True) for r in RECORDS]
    taken = check(packed)
    assert taken >= 22  # the first block above, at least


def test_non_map_records_and_odd_keys_fall_back() -> None:
    odd = [
        msgpack.packb([1, 2, 3]),
        msgpack.packb(7),
        msgpack.packb({1: 2, "i": 1, "o": 2}),
        msgpack.packb({"i": 1, "o": 2, "x": [{1.5: 2}]}),
        msgpack.packb({"i": 1, "o": 2, "n": msgpack.ExtType(5, b"xy")}),
        msgpack.packb({"i": 1, "o": 2, "n": msgpack.Timestamp(1, 2)}),
    ]
    check(odd)
    assert scan(odd[:2]) == [None, None]


def test_duplicate_fields_fall_back() -> None:
    # {"i": 1, "o": 2, "i": 3}: Python keeps the last one; the scanner does not guess
    raw = b"\x83\xa1i\x01\xa1o\x02\xa1i\x03"
    assert msgpack.unpackb(raw) == {"i": 3, "o": 2}
    assert scan([raw]) == [None]
    check([raw])


def test_malformed_bytes_fall_back() -> None:
    good = msgpack.packb(record(), use_bin_type=True)
    broken = [
        good[:-1],  # truncated
        good + b"\x00",  # trailing bytes
        good.replace(b"float32", b"float\xff2"),  # not UTF-8
        good.replace(b"\xa4self", b"\xa4\xed\xa0\x80s"),  # a surrogate
        b"\xc1",
        b"",
        b"\x81\x91\x01\x02",  # a list as a map key
    ]
    for data in broken:
        with pytest.raises((ValueError, TypeError)):
            msgpack.unpackb(data, raw=False, strict_map_key=False)
    assert scan(broken) == [None] * len(broken)


scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(2**63), max_value=2**64 - 1),
    st.floats(allow_nan=False),
    st.text(max_size=40),
    st.binary(max_size=10),
)
shapes = st.one_of(st.lists(st.integers(-(2**63), 2**63 - 1), max_size=5), scalars)
entries = st.fixed_dictionaries(
    {},
    optional={
        "n": st.text(max_size=5),
        "d": st.one_of(st.sampled_from(["float32", "int64", "bfloat16"]), scalars),
        "s": shapes,
        "f": st.one_of(st.sampled_from([0, 1, 2, 3, 8, 9]), scalars),
        "h": st.one_of(st.integers(0, 2**64 - 1), scalars),
        "p": st.lists(st.integers(0, 100), max_size=2),
        "b": st.binary(max_size=16),
        "m": st.lists(st.floats(allow_nan=True), max_size=6),
    },
)
records = st.fixed_dictionaries(
    {},
    optional={
        "i": st.one_of(st.integers(0, 2**40), scalars),
        "o": st.one_of(st.integers(0, 50), scalars),
        "s": st.one_of(st.integers(0, 3), scalars),
        "p": st.one_of(st.integers(0, 3), scalars),
        "c": st.one_of(st.integers(-1, 30), scalars),
        "k": scalars,
        "x": st.one_of(st.lists(entries, max_size=3), scalars),
        "y": st.one_of(st.lists(entries, max_size=3), scalars),
        "v": st.recursive(scalars, lambda inner: st.lists(inner, max_size=3), max_leaves=5),
        "a": st.lists(st.tuples(st.text(max_size=5), scalars), max_size=3),
    },
)


# Records of the types the recorder writes, with fields present or not.
good_entries = st.fixed_dictionaries(
    {},
    optional={
        "n": st.sampled_from(["self", "other", "0"]),
        "d": st.one_of(st.none(), st.sampled_from(["float32", "int64", "bfloat16"])),
        "s": st.lists(st.integers(-(2**63), 2**63 - 1), max_size=4),
        "f": st.integers(-(2**63), 2**63 - 1),
        "h": st.one_of(st.none(), st.integers(-(2**63), 2**64 - 1)),
        "p": st.lists(st.integers(0, 100), min_size=2, max_size=2),
        "b": st.binary(max_size=16),
        "m": st.lists(st.floats(allow_nan=True), max_size=6),
    },
)
good_records = st.fixed_dictionaries(
    {"i": st.integers(0, 2**63 - 1), "o": st.integers(-(2**63), 2**63 - 1)},
    optional={
        "s": st.integers(-5, 5),
        "p": st.integers(-(2**63), 2**63 - 1),
        "c": st.integers(-(2**63), 2**63 - 1),
        "k": st.integers(0, 5),
        "x": st.lists(good_entries, max_size=3),
        "y": st.lists(good_entries, max_size=3),
        "v": st.recursive(scalars, lambda inner: st.lists(inner, max_size=3), max_leaves=5),
        "a": st.lists(st.tuples(st.text(max_size=5), scalars), max_size=3),
    },
)


@settings(max_examples=300, deadline=None)
@given(st.lists(good_records, min_size=1, max_size=8))
def test_random_records(batch: list[dict[str, Any]]) -> None:
    data = [msgpack.packb(r, use_bin_type=True) for r in batch]
    assert check(data) == len(data)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.one_of(records, good_records), min_size=1, max_size=8))
def test_random_odd_records(batch: list[dict[str, Any]]) -> None:
    check([msgpack.packb(r, use_bin_type=True) for r in batch])


@settings(max_examples=300, deadline=None)
@given(good_records, st.integers(0, 400), st.binary(min_size=1, max_size=3))
def test_random_damage(raw: dict[str, Any], at: int, junk: bytes) -> None:
    data = msgpack.packb(raw, use_bin_type=True)
    at %= len(data) + 1
    check([data[:at], data[:at] + junk + data[at:], data[:at] + junk + data[at + len(junk) :]])


def test_nonfinite_counts_read_as_python_reads_them() -> None:
    """The scanner's NaN/Inf masks (what ``opguard nan`` and the diff's origins read) equal
    Python's for every record it takes, whatever the stats hold."""
    from opguard.store.light import nonfinite_mask

    stats = [
        [0.0, 1.0, 0.5, 1.0, 0, 0],
        [None, None, None, None, 3, 0],
        [0.0, 1.0, float("nan"), 1.0, 0, 2**40],
        [0.0, 1.0, 0.5, 1.0, -1, 1.5],
        [0.0, 1.0, 0.5],
        None,
        "stats",
        [1, 2, 3, 4, 5, 6, 7],
    ]
    records = [record(x=[tensor(m=a)], y=[tensor("0", m=b)]) for a in stats for b in stats[:4]]
    packed = [msgpack.packb(r, use_bin_type=True) for r in records]
    scanner = _C.OpScanner()
    fallback = scanner.scan(packed)[3]
    found = {k: (i, o) for k, i, o in scanner.nonfinite()}
    for k, raw in enumerate(records):
        if k in fallback:
            continue
        expected = (nonfinite_mask(raw["x"]), nonfinite_mask(raw["y"]))
        assert found.get(k, (0, 0)) == expected, raw
    assert len(found) > len(records) // 2  # the masks are seen, not just absent on both sides
