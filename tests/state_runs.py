"""Small runs with step-level records, written with the real :class:`TraceWriter` and
``write_meta`` the way the recorder writes them (``put_step(encode_step(...))``), for the tests
of the step-level diff and its front ends (no torch).

A run is a tiny model (two linear layers, a norm with running statistics, Adam) whose state at
the end of each step is: the loss, a gradient per parameter, the parameters, two optimizer
states per parameter, the norm's buffers and the CPU generator's state. Every entry's
fingerprint is a function of (kind, name, slot, step), so two runs written alike are
bit-identical; ``differ`` shifts chosen entries from a chosen step on, as a real change would.
Runs may also hold op records for some steps (``op_steps``: a window, or every step), a short
chain per step whose outputs differ from ``ops_differ_from`` on.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from opguard.store import TraceWriter, schema
from opguard.store.meta import write_meta
from opguard.store.states import encode_step

PARAMS = ("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias", "norm.weight")
OPTIMIZER_SLOTS = ("exp_avg", "exp_avg_sq")
BUFFERS = ("norm.running_mean", "norm.running_var")

Entry = tuple[str, str, str]  # kind, name, slot


def model_entries() -> list[Entry]:
    """The state entries of one step, in the order the recorder writes them."""
    return [
        ("loss", "loss", ""),
        *(("grad", name, "") for name in PARAMS),
        *(("param", name, "") for name in PARAMS),
        *(("state", name, slot) for name in PARAMS for slot in OPTIMIZER_SLOTS),
        *(("buffer", name, "") for name in BUFFERS),
        ("rng", "cpu", ""),
    ]


def label(entry: Entry) -> str:
    return " ".join(part for part in entry if part)


def fingerprint(entry: Entry, step: int, shift: int = 0) -> int:
    return zlib.crc32(f"{label(entry)}@{step}".encode()) + shift


def _fields(entry: Entry, value: int, other_stats: bool = False) -> dict[str, Any]:
    """A tensor entry as the recorder stores a state tensor (d, s, h, z, b, m, f);
    ``other_stats``: its mean as another device's reduction order makes it."""
    kind = entry[0]
    if kind == "rng":
        return {"d": "uint8", "s": [16], "h": value, "z": 16, "f": 0}
    values = [((value >> (8 * k)) & 0xFF) / 64 - 2 for k in range(4)]
    if kind == "loss":
        values = [2 + (value % 10_000) / 1e8]
    shape = [] if kind == "loss" else [len(values)]
    head = struct.pack(f"<{len(values)}f", *values)
    rounded = list(struct.unpack(f"<{len(values)}f", head))
    mean = sum(rounded) / len(rounded) * (1 + 1e-7 if other_stats else 1)
    stats = [min(rounded), max(rounded), mean, max(map(abs, rounded)), 0, 0]
    return {"d": "float32", "s": shape, "h": value, "z": len(head), "b": head, "m": stats, "f": 0}


def _value(entry: Entry, step: int, differ: Mapping[str, int]) -> int:
    """``entry``'s fingerprint at ``step``: ``differ`` maps a kind (``grad``) or an entry's
    label (``grad fc2.weight``) to the first step from which it differs."""
    starts = [differ[key] for key in (label(entry), entry[0]) if key in differ]
    return fingerprint(entry, step, 7 if any(step >= start for start in starts) else 0)


def _tensor(slot: str, value: int, producer: int | None) -> dict[str, Any]:
    entry: dict[str, Any] = {"n": slot, "d": "float32", "s": [4], "t": [1], "v": "cpu"}
    entry.update(h=value, z=16)
    if producer is not None:
        entry["p"] = [producer, 0]
    return entry


def write_state_run(
    path: Path,
    *,
    steps: Iterable[int] = range(10),
    differ: Mapping[str, int] | None = None,
    extra: Iterable[Entry] = (),
    missing: Iterable[Entry] = (),
    op_steps: Iterable[int] = (),
    ops_differ_from: int | None = None,
    rank: int = 0,
    reverse_names: bool = False,
    other_stats: bool = False,
    step_records: bool = True,
    finished: bool = True,
) -> Path:
    """One rank of a run (``path`` created when needed; several ranks share a directory).
    ``extra``/``missing``: entries this run records besides / instead of the model's;
    ``reverse_names``: state names interned in another order (ids differ, names do not);
    ``other_stats``: equal contents with means computed as on another device;
    ``step_records=False``: op records only, as recorded before step-level records existed."""
    path.mkdir(parents=True, exist_ok=True)
    write_meta(path, {"schema": schema.SCHEMA_VERSION, "command": ["test"], "status": "finished"})
    writer = TraceWriter(path / schema.rank_dir_name(rank), start_info={"rank": rank})
    entries = [e for e in model_entries() if e not in set(missing)] + list(extra)
    names = sorted({e[1] for e in entries}, reverse=reverse_names)
    ids = {name: writer.intern_state(name) for name in names}
    site = writer.intern_site("train", lambda: [str(path.parent / "train.py"), 9, "main", []])
    ops = {name: writer.intern_name(name) for name in ("aten::mm.default", "aten::add_.Tensor")}
    windows, steps = set(op_steps), list(steps)
    index = 0
    for step in steps:
        if step in windows:  # mm (origin of a change), then the optimizer's update reading it
            shift = 7 if ops_differ_from is not None and step >= ops_differ_from else 0
            mm = zlib.crc32(f"mm@{step}".encode()) + shift
            writer.append(
                index,
                {"i": index, "o": ops["aten::mm.default"], "s": step, "p": 0, "c": site}
                | {"x": [], "y": [_tensor("0", mm, None)]},
            )
            update = zlib.crc32(f"add@{step}".encode()) + shift
            writer.append(
                index + 1,
                {"i": index + 1, "o": ops["aten::add_.Tensor"], "s": step, "p": 2, "c": site}
                | {"x": [_tensor("other", mm, index)], "y": [_tensor("0", update, None)]},
            )
            index += 2
        if not step_records:
            continue
        stored = [
            (
                entry[0],
                ids[entry[1]],
                entry[2],
                _fields(entry, _value(entry, step, differ or {}), other_stats),
            )
            for entry in entries
        ]
        writer.put_step(step, encode_step(step, stored))
    if finished:
        writer.close({"status": "finished", "steps": max(steps, default=-1) + 1})
    else:
        writer.close({})  # then the end record is removed below, as after a kill
        _drop_end(path / schema.rank_dir_name(rank))
    return path


def _drop_end(rank_dir: Path) -> None:
    import lmdb

    env = lmdb.open(str(rank_dir), max_dbs=len(schema.DB_NAMES))
    with env.begin(write=True) as txn:
        txn.delete(b"end", db=env.open_db(b"info", txn=txn))
    env.close()
