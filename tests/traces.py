"""Synthetic traces for tests and benchmarks, written through the real :class:`TraceWriter` and
``write_meta`` as the recorder writes them (no torch), so they open, diff and show like recorded
ones. One builder for every test and bench that needs a hand-made trace: a change to the stored
format is made here once.

A record is the msgpack dict the recorder stores (keys in :mod:`opguard.store.schema`): ``i``
index, ``o`` interned op name, ``s`` step, ``p`` phase, ``c`` call site, ``x`` inputs, ``y``
outputs, ``a`` arguments, ``v`` an ``.item()`` value. :func:`tensor` and :func:`kernel` make
the entries; :class:`TraceBuilder` interns names and sites and appends the ops.

Benchmarks import it from the repository (``bench/`` puts ``tests/`` on ``sys.path``).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import msgpack

from opguard.store import TraceWriter, schema
from opguard.store.meta import write_meta

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
    """One rank of a run: ``meta.json`` written, ops appended with :meth:`op`, :meth:`close`
    (or the ``with`` block's end) finishes it. ``kernels``: per op index, the GPU work the
    writer's CUPTI drains hand it, one drain per mapping (later ones extend earlier lists)."""

    def __init__(
        self,
        path: Path,
        *,
        rank: int = 0,
        meta: dict[str, Any] | None = None,
        kernels: Iterable[dict[int, list[dict[str, Any]]]] = (),
        site: tuple[str, int, str, str] | None = None,
    ) -> None:
        path.mkdir(parents=True, exist_ok=True)
        base = {"schema": schema.SCHEMA_VERSION, "command": ["test"], "status": "finished"}
        write_meta(path, {**base, **(meta or {})})
        self.path = path
        self.writer = TraceWriter(path / schema.rank_dir_name(rank), start_info={"rank": rank})
        drains: Iterator[list[tuple[int, bytes]]] = iter(
            [[(op, msgpack.packb(k)) for op, k in sorted(drain.items())] for drain in kernels]
        )
        self.writer.poll_kernels = lambda final: next(drains, [])
        self.index = 0
        self.default_site = self.site(
            *(site or (str(path.parent / "train.py"), 5, "main", "y = step(x)"))
        )

    def site(self, file: str, line: int, function: str, source: str = "") -> int:
        """The interned id of a call site (its source line ``source``, if any)."""
        lines = [[line, source]] if source else []
        return self.writer.intern_site(f"{file}:{line}", lambda: [file, line, function, lines])

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
        """Appends the next op (``fields``: other stored keys, e.g. ``a`` arguments, ``v`` an
        ``.item()`` value); returns its index."""
        index = self.index
        record: dict[str, Any] = {"i": index, "o": self.writer.intern_name(name), "s": step}
        record.update(p=phase, c=self.default_site if site is None else site)
        record.update(x=list(inputs), y=list(outputs), **fields)
        self.writer.append(index, record)
        self.index += 1
        return index

    def close(self, end: dict[str, Any] | None = None) -> Path:
        self.writer.close({"status": "finished"} if end is None else end)
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
