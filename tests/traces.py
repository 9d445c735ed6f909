"""Synthetic traces for tests and benchmarks, written through the real :class:`TraceWriter` and
``write_meta`` as the recorder writes them (no torch), so they open, diff and show like recorded
ones. One builder for every test and bench that needs a hand-made trace: a change to the stored
format is made here once.

A record is the msgpack dict the recorder stores (keys in :mod:`opguard.store.schema`): ``i``
index, ``o`` interned op name, ``s`` step, ``p`` phase, ``c`` call site, ``x`` inputs, ``y``
outputs, ``a`` arguments, ``k`` user stack, ``v`` an ``.item()`` value. :func:`tensor` and
:func:`kernel` make the entries; :class:`TraceBuilder` interns names, sites, stacks and state
names and appends the ops and step-level records.

It lives in ``tests/`` (test code, not shipped in the wheel); the benchmarks that write traces
run from a checkout and put ``tests/`` on ``sys.path`` to import it.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import lmdb
import msgpack

from opguard.store import TraceWriter, schema
from opguard.store.captures import capture_key, encode
from opguard.store.meta import write_meta
from opguard.store.states import encode_step

FORWARD, BACKWARD, OPTIMIZER = 0, 1, 2  # phases as stored


def tensor(
    slot: str,
    fingerprint: int,
    producer: int | None = None,
    *,
    device: str = "cpu",
    dtype: str = "float32",
    shape: Sequence[int] = (64,),
    nbytes: int | None = None,
    **fields: Any,
) -> dict[str, Any]:
    """A tensor entry: ``slot`` (``self``, ``0``, …), its fingerprint, the op that wrote it
    (``producer``: its output 0), and any other stored fields (``b`` head, ``m`` stats, ``t``
    strides) as given."""
    entry: dict[str, Any] = {"n": slot, "d": dtype, "s": list(shape), "t": _strides(shape)}
    entry.update(v=device, h=fingerprint, z=4 * _numel(shape) if nbytes is None else nbytes)
    if producer is not None:
        entry["p"] = [producer, 0]
    entry.update(fields)
    return entry


def kernel(
    name: str,
    start: int,
    *,
    stream: int = 7,
    duration: int = 500,
    kind: str = "kernel",
    **fields: Any,
) -> dict[str, Any]:
    """A GPU activity entry as CUPTI's are stored (``k`` kind, ``s`` stream, ``t0``/``t1``)."""
    entry: dict[str, Any] = {"k": kind, "n": name, "s": stream, "d": 0, "t0": start}
    entry.update(t1=start + duration, **fields)
    return entry


class TraceBuilder:
    """One rank of a run: ``meta.json`` written, names, call sites, stacks and state names
    interned in the order they are first asked for, ops appended with :meth:`op` (or records
    as stored with :meth:`append`), step-level records with :meth:`step_record`, captured
    tensors with :meth:`capture`; :meth:`close` (or the ``with`` block's end) finishes it.
    ``meta``: fields of ``meta.json`` besides the schema (a test's command, finished);
    ``start``: fields of the rank's start record besides its rank; ``kernels``: per op index,
    the GPU work the writer's CUPTI drains hand it, one drain per mapping (later ones extend
    earlier lists); ``site``: the call site of ops given none; ``writer``: the
    :class:`TraceWriter`'s own options (``batch_size``, …)."""

    def __init__(
        self,
        path: Path,
        *,
        rank: int = 0,
        meta: dict[str, Any] | None = None,
        start: dict[str, Any] | None = None,
        kernels: Iterable[dict[int, list[dict[str, Any]]]] = (),
        site: tuple[str, int, str, str] | None = None,
        **writer: Any,
    ) -> None:
        path.mkdir(parents=True, exist_ok=True)
        base = {"schema": schema.SCHEMA_VERSION, "command": ["test"], "status": "finished"}
        self.meta = {**base, **(meta or {})}
        write_meta(path, self.meta)
        self.path = path
        self.rank_dir = path / schema.rank_dir_name(rank)
        start_info = {"rank": rank, **(start or {})}
        self.writer = TraceWriter(self.rank_dir, start_info=start_info, **writer)
        drains: Iterator[list[tuple[int, bytes]]] = iter(
            [[(op, msgpack.packb(k)) for op, k in sorted(drain.items())] for drain in kernels]
        )
        self.writer.poll_kernels = lambda final: next(drains, [])
        self.index = 0
        self._site_given = site or (str(path.parent / "train.py"), 5, "main", "y = step(x)")
        self._default_site: int | None = None  # interned with the first op that takes it

    def name(self, name: str) -> int:
        """The interned id of an op name."""
        return self.writer.intern_name(name)

    def site(
        self, file: str, line: int, function: str, source: str | Sequence[Sequence[Any]] = ""
    ) -> int:
        """The interned id of a call site; ``source``: its line's text, or the [line, text]
        pairs of the lines around it."""
        if isinstance(source, str):
            lines = [[line, source]] if source else []
        else:
            lines = [list(pair) for pair in source]
        return self.writer.intern_site(f"{file}:{line}", lambda: [file, line, function, lines])

    def stack(self, sites: Sequence[int]) -> int:
        """The interned id of a user stack: its call sites' ids, outermost first."""
        frames = tuple(sites)
        return self.writer.intern_stack(frames, lambda: list(frames))

    def state_name(self, name: str) -> int:
        """The interned id of a step-level entry's name (a parameter's, a generator's)."""
        return self.writer.intern_state(name)

    def op(
        self,
        name: str,
        inputs: Sequence[dict[str, Any]] = (),
        outputs: Sequence[dict[str, Any]] = (),
        *,
        step: int = 0,
        phase: int = FORWARD,
        site: int | None = None,
        **fields: Any,
    ) -> int:
        """Appends the next op (``fields``: other stored keys, e.g. ``a`` arguments, ``k`` its
        stack, ``v`` an ``.item()`` value); returns its index."""
        if site is None:
            if self._default_site is None:
                self._default_site = self.site(*self._site_given)
            site = self._default_site
        record: dict[str, Any] = {"i": self.index, "o": self.name(name), "s": step}
        record.update(p=phase, c=site, x=list(inputs), y=list(outputs), **fields)
        return self.append(record)

    def append(self, record: dict[str, Any]) -> int:
        """Appends a record as stored (its ``i`` the next index, its ids interned here), for
        traces shaped field by field; returns its index."""
        index = record["i"]
        self.writer.append(index, record)
        self.index = index + 1
        return index

    def step_record(
        self, step: int, entries: Sequence[tuple[str, int, str, dict[str, Any]]]
    ) -> None:
        """Writes step ``step``'s step-level record: (kind, state name id, slot, tensor
        fields) per entry, in the order the step computes them."""
        self.writer.put_step(step, encode_step(step, entries))

    def capture(self, index: int, direction: str, position: int, slot: str, values: Any) -> None:
        """Stores a tensor of op ``index`` in full, as ``record --capture`` does: its
        ``position``-th input (``direction`` INPUT) or output (OUTPUT), ``values`` a numpy
        array of its elements."""
        key = capture_key(index, direction, position)
        self.writer.put_capture(
            key, lambda: encode(slot, str(values.dtype), list(values.shape), values.tobytes())
        )

    def close(
        self,
        end: dict[str, Any] | None = None,
        *,
        meta: dict[str, Any] | None = None,
        killed: bool = False,
    ) -> Path:
        """Ends the rank as the recorder does with ``end`` (default: finished); ``meta``:
        fields ``meta.json`` takes at the end (rewritten); ``killed``: no end record, as after
        SIGKILL or while the recorder still writes."""
        error = self.writer.close({"status": "finished"} if end is None else end)
        if error is not None:
            raise RuntimeError(f"writing {self.rank_dir}: {error}")
        if killed:
            env = lmdb.open(str(self.rank_dir), max_dbs=len(schema.DB_NAMES))
            with env.begin(write=True) as txn:
                txn.delete(b"end", db=env.open_db(b"info", txn=txn))
            env.close()
        if meta is not None:
            self.meta.update(meta)
            write_meta(self.path, self.meta)
        return self.path

    def __enter__(self) -> TraceBuilder:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def chain_run(
    path: Path,
    ops: Sequence[tuple[str, int | None, int]],
    *,
    args: dict[int, list[list[Any]]] | None = None,
    device: str = "cpu",
    **builder: Any,
) -> Path:
    """A run of ``ops``: (name, the op whose output it reads or None, its output's
    fingerprint), each input carrying the fingerprint its producer wrote; ``args``: per op
    index, its stored arguments."""
    with TraceBuilder(path, **builder) as run:
        written: dict[int, int] = {}
        for index, (name, producer, output) in enumerate(ops):
            inputs = (
                []
                if producer is None
                else [tensor("self", written[producer], producer, device=device)]
            )
            extra = {"a": args[index]} if args and index in args else {}
            run.op(name, inputs, [tensor("0", output, device=device)], **extra)
            written[index] = output
    return path


def _numel(shape: Sequence[int]) -> int:
    count = 1
    for size in shape:
        count *= size
    return count


def _strides(shape: Sequence[int]) -> list[int]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= size
    return strides[::-1]
