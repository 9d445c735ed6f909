"""Small runs with step-level records, written through tests/traces.py's builder (the real
writer, as the recorder writes them), for the tests of the step-level diff and its front ends
(no torch).

A run is a tiny model (two linear layers, a norm with running statistics, Adam) whose state at
the end of each step is: the loss, a gradient per parameter, the parameters, two optimizer
states per parameter, the norm's buffers and the CPU generator's state. Every entry's
fingerprint is a function of (kind, name, slot, step), so two runs written alike are
bit-identical; ``differ`` shifts chosen entries from a chosen step on, as a real change would.
Runs may also hold op records for some steps (``op_steps``: a window, or every step), a short
chain per step whose outputs differ from ``ops_differ_from`` on. :func:`hunt_of` makes the
outcome of ``opguard hunt`` from such runs, without recording.
"""

from __future__ import annotations

import struct
import zlib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from traces import OPTIMIZER, TraceBuilder, tensor

from opguard.analysis import RunDiff, diff_runs
from opguard.hunt import Hunt, Recording
from opguard.store import Run

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
    builder = TraceBuilder(path, rank=rank, site=(str(path.parent / "train.py"), 9, "main", ""))
    entries = [e for e in model_entries() if e not in set(missing)] + list(extra)
    names = sorted({e[1] for e in entries}, reverse=reverse_names)
    ids = {name: builder.state_name(name) for name in names}
    windows, steps = set(op_steps), list(steps)
    for step in steps:
        if step in windows:  # mm (origin of a change), then the optimizer's update reading it
            shift = 7 if ops_differ_from is not None and step >= ops_differ_from else 0
            mm = zlib.crc32(f"mm@{step}".encode()) + shift
            product = builder.op("aten::mm.default", [], [_tensor("0", mm)], step=step)
            update = zlib.crc32(f"add@{step}".encode()) + shift
            builder.op(
                "aten::add_.Tensor",
                [_tensor("other", mm, product)],
                [_tensor("0", update)],
                step=step,
                phase=OPTIMIZER,
            )
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
        builder.step_record(step, stored)
    if finished:
        return builder.close({"status": "finished", "steps": max(steps, default=-1) + 1})
    return builder.close({}, killed=True)


def _tensor(slot: str, fingerprint: int, producer: int | None = None) -> dict[str, Any]:
    return tensor(slot, fingerprint, producer, shape=(4,))


def hunt_of(root: Path, first: dict[str, int], second: dict[str, int] | None) -> Hunt:
    """A hunt whose first pass parts where ``first`` makes it (:func:`write_state_run`'s
    ``differ``), and whose second pass parts where ``second`` does (None: no second pass),
    without recording: its passes' runs written under ``root``."""

    def diff(name: str, differ: dict[str, int]) -> RunDiff:
        a = write_state_run(root / name / "a", steps=range(8))
        b = write_state_run(root / name / "b", steps=range(8), differ=differ)
        with Run(a) as run_a, Run(b) as run_b:
            return diff_runs(run_a, run_b)

    recordings = [Recording.of(root, run, "steps") for run in "ab"]
    second_pass = diff("window", second) if second is not None else None
    return Hunt(root, diff("steps", first), recordings, second_pass)
