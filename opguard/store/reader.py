"""Reading traces: a run directory, its ranks, and their ops in execution order.

Readers never load a whole trace: ops are decoded one at a time from an LMDB cursor, and the
small interned tables (names, call sites, stacks) are loaded once per rank. A trace that is still
being written, or whose writer was killed, reads up to its last committed batch; a damaged
environment reads up to its last good record and says so (``RankTrace.damage``).
"""

from __future__ import annotations

import contextlib
import os
from bisect import bisect_left
from collections.abc import Callable, Generator, Iterator
from functools import cached_property
from itertools import islice
from operator import itemgetter
from pathlib import Path
from typing import Any

import lmdb
import msgpack

from ..record_options import unreached_window
from . import schema
from .captures import CapturedTensor, parse_key
from .environment import Environment, environment_of
from .errors import DamagedRecord, TraceError
from .meta import check_schema, read_meta
from .pagecheck import Readable, check_snapshot
from .records import (
    UNKNOWN_SITE,
    CallSite,
    KernelEntry,
    OpRecord,
    TensorRecord,
    check_op,
    decode_name,
    decode_stack,
)
from .states import StepState, decode_state_name, decode_step

COMPLETE_STATUSES = ("finished", "stopped")  # ``end`` statuses of a run recorded to its end
# Absent in traces recorded before they existed.
OPTIONAL_DBS = ("kernels", "captures", "steps", "states")
CHUNK = 4096  # records per chunk of RankTrace.raw_chunks
STEP_CHUNK = 16  # step-level records (~1.3 MB of GPT-2's) read between unmappings


def _unpack(raw: bytes | memoryview) -> Any:
    """One stored msgpack value; :class:`DamagedRecord` when the bytes are not one."""
    try:
        return msgpack.unpackb(raw, raw=False, strict_map_key=False)
    except (ValueError, TypeError, msgpack.UnpackException) as exc:
        raise DamagedRecord(f"undecodable record ({type(exc).__name__}: {exc})") from None


_UNCLAIMED_PACKED = msgpack.packb(schema.KERNEL_UNCLAIMED)  # the flag's key, as stored


def _kernel_entries(raw: bytes) -> list[KernelEntry]:
    """A ``kernels`` value decoded; entries that are not maps are left out (evidence, not the
    trace: a damaged entry is dropped, not fatal)."""
    entries = _unpack(raw)
    if not isinstance(entries, list):
        return []
    return [KernelEntry.decode(e) for e in entries if isinstance(e, dict)]


def _op_index(key: bytes | memoryview) -> int:
    if len(key) != schema.OP_KEY_SIZE:
        raise DamagedRecord(f"op key of {len(key)} bytes")
    return schema.op_index(bytes(key))


def _through(pairs: Iterator[tuple[bytes, bytes]], last: bytes) -> Iterator[tuple[bytes, bytes]]:
    """``pairs`` (a cursor's) up to and including key ``last``, without asking the cursor for
    the one after it: past a damaged page, LMDB must not move on."""
    for key, value in pairs:
        yield key, value
        if key >= last:
            return


def _clamped(index: int) -> int:
    """``index`` within the range of op keys: the indices a reader is asked for come from
    users (``--ops 99999999999999999999``, ``-1``), and no trace holds an op outside it."""
    return min(max(index, 0), schema.MAX_OP_INDEX)


def _holds(index: int) -> bool:
    """Whether an op key can hold ``index`` at all."""
    return 0 <= index <= schema.MAX_OP_INDEX


class _Environments:
    """LMDB allows one open handle per environment and process, so readers of the same trace
    (say, a run diffed against itself) share it, counted."""

    def __init__(self) -> None:
        self._open: dict[str, tuple[lmdb.Environment, int]] = {}

    def acquire(self, path: Path) -> lmdb.Environment:
        key = os.path.realpath(path)
        env, count = self._open.get(key, (None, 0))
        if env is None:
            data = path / "data.mdb"
            if not data.is_file():
                raise lmdb.Error("no data.mdb")
            if data.stat().st_size == 0:  # LMDB would say "Bad file descriptor"
                raise TraceError(
                    f"{path}: not a readable OpGuard trace: data.mdb is empty (0 bytes): never "
                    "written, or truncated"
                )
            env = lmdb.open(
                str(path),
                readonly=True,
                lock=_can_lock(path),
                max_dbs=len(schema.DB_NAMES),
                readahead=False,
                create=False,
            )
        self._open[key] = (env, count + 1)
        return env

    def release(self, path: Path) -> None:
        key = os.path.realpath(path)
        env, count = self._open[key]
        if count <= 1:
            del self._open[key]
            env.close()
        else:
            self._open[key] = (env, count - 1)


_ENVIRONMENTS = _Environments()


class RankTrace:
    """One rank's ops. Cheap to open; safe to use while the recorder is still writing."""

    def __init__(self, path: Path, rank: int, meta: dict[str, Any] | None = None) -> None:
        self.path = path
        self.rank = rank
        self.meta = meta or {}  # its run's meta.json
        self.damage: str | None = None  # set when reading stopped at a damaged record
        # What can be read of the op records when one of their pages is damaged (the ops up
        # to ``_stop``, exclusive): set by :meth:`_check_structure`.
        self._cut: Readable | None = None
        self._stop: int | None = None
        # The same of the step-level records (steps up to ``_step_stop``, exclusive).
        self._step_cut: Readable | None = None
        self._step_stop: int | None = None
        # The ops :meth:`op` decoded last: the analysis reads an op's producers and readers
        # again around it (records never change once written, and are immutable).
        self._decoded: dict[int, OpRecord] = {}
        try:
            self._env = _ENVIRONMENTS.acquire(path)
        except lmdb.Error as exc:
            raise TraceError(f"{path}: not a readable OpGuard trace ({exc})") from None
        try:
            self._open()
        except BaseException:
            self.close()
            raise

    def _open(self) -> None:
        self._check_structure()
        try:
            self._dbs = {
                name: self._env.open_db(name.encode(), create=False)
                for name in schema.DB_NAMES
                if name not in OPTIONAL_DBS
            }
        except lmdb.Error as exc:
            raise TraceError(f"{self.path}: not a readable OpGuard trace ({exc})") from None
        for name in OPTIONAL_DBS:
            with contextlib.suppress(lmdb.Error):
                self._dbs[name] = self._env.open_db(name.encode(), create=False)
        self.info = self._read_info()
        check_schema(self.info.get("schema"), self.path)

    def _check_structure(self) -> None:
        """Refuses a truncated or structurally damaged file before LMDB reads its pages
        (LMDB would crash the process on it, see :mod:`.pagecheck`), but for a damaged page of
        the op or step-level records: those before it are read, as up to a damaged record."""
        try:
            with self._env.begin() as txn:
                cuts = check_snapshot(self.path / "data.mdb", txn.id())
        except lmdb.Error as exc:
            raise TraceError(f"{self.path}: not a readable OpGuard trace ({exc})") from None
        cut = cuts.get("ops")
        if cut is not None:
            if cut.last_key is None or len(cut.last_key) != schema.OP_KEY_SIZE:
                raise TraceError(f"{self.path}: damaged trace ({cut.problem}; no op before it)")
            self._cut, self._stop = cut, schema.op_index(cut.last_key) + 1
        step_cut = cuts.get("steps")
        if step_cut is not None:  # a run recorded --steps-only may hold nothing else: no refusal
            last = step_cut.last_key
            readable = last is not None and len(last) == schema.OP_KEY_SIZE
            self._step_cut = step_cut
            self._step_stop = schema.op_index(last) + 1 if readable and last else 0

    @property
    def _cut_short(self) -> str:
        """What reading a trace with a damaged page of op records leaves out, as ``damage``
        says it."""
        assert self._cut is not None and self._stop is not None
        return (
            f"reading stopped at a damaged page: {self._cut.entries} op record(s) read, up to op "
            f"{self._stop - 1}; those past it cannot be reached ({self._cut.problem})"
        )

    @property
    def _step_cut_short(self) -> str:
        """What reading a trace with a damaged page of step-level records leaves out."""
        assert self._step_cut is not None and self._step_stop is not None
        read = f"up to step {self._step_stop - 1}" if self._step_stop else "none before it"
        return (
            f"reading stopped at a damaged page of step records: {self._step_cut.entries} step "
            f"record(s) read, {read}; those past it cannot be reached ({self._step_cut.problem})"
        )

    def _within_cut(self, stop: int | None) -> tuple[int | None, bool]:
        """``stop`` (exclusive) kept to the op records that can be read, and whether it was
        past them: a reading that gets to the end of them then notes :meth:`_cut_short`."""
        if self._stop is None or (stop is not None and stop <= self._stop):
            return stop, False
        return self._stop, True

    def _seek(self, cursor: lmdb.Cursor, start: int, stop: int | None) -> bool:
        """Puts ``cursor`` on the first op record from ``start`` on, before ``stop``; False
        when there is none. A search for a key past the readable records would reach a
        damaged page: ``stop`` must be kept by :meth:`_within_cut`."""
        if stop is not None and start >= stop:
            return False
        return bool(cursor.set_range(schema.op_key(_clamped(start))))

    def _read_info(self) -> dict[str, Any]:
        try:
            with self._env.begin() as txn:
                return {k.decode(): _unpack(v) for k, v in txn.cursor(db=self._dbs["info"])}
        except (lmdb.Error, ValueError, DamagedRecord) as exc:
            raise TraceError(f"{self.path}: unreadable trace header ({exc})") from None

    def close(self) -> None:
        _ENVIRONMENTS.release(self.path)

    @property
    def environment(self) -> Environment:
        """The environment this rank computed in, as far as it was recorded
        (:func:`~.environment.environment_of`)."""
        return environment_of(self.meta, self.info)

    @property
    def finished(self) -> bool:
        """Whether the recorder closed this trace (no ``end`` means killed or still running)."""
        return "end" in self.info

    @property
    def failure(self) -> dict[str, Any] | None:
        return self.info.get("failure")

    @property
    def partial(self) -> bool:
        """Whether the trace stops before the program did: killed, still recording, ended
        by a signal or an exception, or recording stopped by a failure (a step limit is a
        complete recording of what was asked)."""
        end = self.info.get("end")
        return (
            not isinstance(end, dict)
            or end.get("status") not in COMPLETE_STATUSES
            or self.failure is not None
            or "write_failure" in self.info
        )

    @property
    def unreached_window(self) -> str:
        """Why a run recorded with ``--window`` holds no op: its steps ended before the window
        began (:func:`~opguard.record_options.unreached_window`); '' otherwise."""
        window = self.meta.get("window")
        if len(self) or not (
            isinstance(window, list) and len(window) == 2 and all(type(n) is int for n in window)
        ):
            return ""
        end = self.info.get("end")
        ended_at = end.get("steps") if isinstance(end, dict) else None
        if type(ended_at) is not int:  # killed: in the step after its last step-level record
            span = self.step_span()
            ended_at = span[1] + 1 if span is not None else None
        return unreached_window((window[0], window[1]), ended_at) if ended_at is not None else ""

    def last_op(self) -> tuple[int, int] | None:
        """(index, step) of the last op on disk; None for an empty trace."""
        return self._end_op(last=True)

    def first_op(self) -> tuple[int, int] | None:
        """(index, step) of the first op on disk: op 0, unless the recording kept only its
        last steps' ops (``--keep-last``); None for an empty trace."""
        return self._end_op(last=False)

    def _end_op(self, last: bool) -> tuple[int, int] | None:
        try:
            with self._env.begin() as txn:
                cursor = txn.cursor(db=self._dbs["ops"])
                if last and self._stop is not None:  # LMDB's last is past a damaged page
                    found = cursor.set_key(schema.op_key(self._stop - 1))
                else:
                    found = cursor.last() if last else cursor.first()
                if not found:
                    return None
                op = self.decode(_unpack(cursor.value()))
        except (lmdb.Error, DamagedRecord) as exc:
            self.damage = f"{'last' if last else 'first'} op unreadable: {exc}"
            return None
        return op.index, op.step

    def describe_ops(self) -> str:
        """``has ops 0 to 462`` (``95 to 462`` when the first were dropped), ``has no ops``."""
        first, last = self.first_op(), self.last_op()
        if first is None or last is None:
            return "has no ops"
        return f"has ops {first[0]} to {last[0]}"

    def __len__(self) -> int:
        """The op records that can be read."""
        if self._cut is not None:
            return self._cut.entries
        with self._env.begin() as txn:
            return int(txn.stat(self._dbs["ops"])["entries"])

    def _table(self, name: str, decode: Callable[[Any], Any]) -> dict[int, Any]:
        table: dict[int, Any] = {}
        try:
            with self._env.begin() as txn:
                for key, value in txn.cursor(db=self._dbs[name]):
                    if len(key) != schema.ID_KEY_SIZE:
                        raise DamagedRecord(f"key of {len(key)} bytes")
                    table[schema.id_of(key)] = decode(_unpack(value))
        except (lmdb.Error, DamagedRecord) as exc:
            self.damage = f"interned {name} unreadable: {exc}"
        return table

    @cached_property
    def op_names(self) -> dict[int, str]:
        return self._table("names", decode_name)

    @cached_property
    def state_names(self) -> dict[int, str]:
        return self._table("states", decode_state_name) if "states" in self._dbs else {}

    @property
    def has_steps(self) -> bool:
        """Whether the trace holds step-level records (:mod:`.states`)."""
        return self.step_count() > 0

    def step_count(self) -> int:
        db = self._dbs.get("steps")
        if db is None:
            return 0
        if self._step_cut is not None:  # those past a damaged page cannot be read
            return self._step_cut.entries
        try:
            with self._env.begin() as txn:
                return int(txn.stat(db)["entries"])
        except lmdb.Error:
            return 0

    def step_span(self) -> tuple[int, int] | None:
        """The numbers of the first and last steps with a step-level record (None: none)."""
        db = self._dbs.get("steps")
        if db is None or self._step_stop == 0:
            return None
        try:
            with self._env.begin() as txn:
                cursor = txn.cursor(db=db)
                if not cursor.first():
                    return None
                first = cursor.key()
                if self._step_stop is None:
                    cursor.last()
                    keys = (first, cursor.key())
                else:  # LMDB's last is past a damaged page
                    keys = (first, schema.op_key(self._step_stop - 1))
        except lmdb.Error:
            return None
        if any(len(key) != schema.OP_KEY_SIZE for key in keys):
            return None
        return schema.op_index(bytes(keys[0])), schema.op_index(bytes(keys[1]))

    def step_states(self, start: int = 0) -> Iterator[StepState]:
        """Step-level records from step ``start`` on, in step order; reading ends at a
        damaged record (see :attr:`damage`)."""
        names = self.state_names
        for _, value in self._step_records(max(0, start), None, values=True):
            try:
                yield decode_step(_unpack(value), names)
            except DamagedRecord as exc:
                self.damage = f"reading stopped at a damaged step record: {exc}"
                return

    def raw_steps(
        self, start: int = 0, stop: int | None = None
    ) -> Generator[tuple[int, bytes], None, None]:
        """Undecoded step records (msgpack bytes) with their step numbers, in step order, from
        step ``start`` up to ``stop`` (exclusive): the bulk read of the step-level diff, which
        compares bytes and decodes only steps whose bytes differ (:meth:`step_state`). Reading
        ends at a damaged key (see :attr:`damage`)."""
        return self._step_records(start, stop, values=True)

    def step_numbers(self) -> list[int]:
        """The steps the trace holds step-level records of, in order (keys only)."""
        return [step for step, _ in self._step_records(0, None, values=False)]

    def _step_records(
        self, start: int, stop: int | None, *, values: bool
    ) -> Generator[tuple[int, bytes], None, None]:
        """(step, record bytes, or b"" without ``values``). A whole-trace scan unmaps the pages
        it read every ``STEP_CHUNK`` records, as :meth:`raw_chunks` does, so its memory stays
        flat: a step's record spans overflow pages, which LMDB reads (and the kernel maps with
        the pages around them) even for its key alone."""
        db = self._dbs.get("steps")
        if db is None or start > schema.MAX_OP_INDEX:
            return
        whole = stop is None
        cut = self._step_stop is not None and (stop is None or stop > self._step_stop)
        if cut:
            stop = self._step_stop
        spans = mapped_spans(self.path) if whole else []
        advise_pages(spans, _MADV_SEQUENTIAL)
        try:
            with self._env.begin() as txn:
                cursor = txn.cursor(db=db)
                if (stop is not None and start >= stop) or not cursor.set_range(
                    schema.op_key(_clamped(start))
                ):
                    pairs: Iterator[tuple[bytes, bytes]] = iter(())
                else:
                    pairs = (
                        cursor.iternext()
                        if values
                        else ((key, b"") for key in cursor.iternext(values=False))
                    )
                if cut and stop:  # never a step past the last record before the damage
                    pairs = _through(pairs, schema.op_key(stop - 1))
                for count, (key, value) in enumerate(pairs, 1):
                    step = _op_index(key)
                    if stop is not None and step >= stop:
                        return
                    yield step, value  # a copy: the pages it came from may go
                    if count % STEP_CHUNK == 0:
                        advise_pages(spans, _MADV_DONTNEED)
        except (lmdb.Error, DamagedRecord) as exc:
            self.damage = f"reading stopped at a damaged step record: {exc}"
            return
        finally:
            if whole:
                advise_pages(mapped_spans(self.path), _MADV_RANDOM)
        if cut:
            self.damage = self._step_cut_short

    def step_state(self, step: int) -> StepState | None:
        """The step-level record of step ``step`` (None: the trace holds none);
        :class:`TraceError` when it is damaged, noted in :attr:`damage` (a comparison that
        needed it is incomplete)."""
        db = self._dbs.get("steps")
        if db is None or not _holds(step):
            return None
        if self._step_stop is not None and step >= self._step_stop:  # a search past the damage
            self.damage = self._step_cut_short
            raise TraceError(f"{self.path}: no step record {step} read ({self._step_cut_short})")
        try:
            with self._env.begin() as txn:
                raw = txn.get(schema.op_key(step), db=db)
            return None if raw is None else decode_step(_unpack(raw), self.state_names)
        except (lmdb.Error, DamagedRecord) as exc:
            self.damage = f"reading stopped at a damaged step record: step {step} ({exc})"
            raise TraceError(f"{self.path}: step record {step} unreadable ({exc})") from None

    @cached_property
    def sites(self) -> dict[int, CallSite]:
        return self._table("sites", CallSite.decode)

    @cached_property
    def stacks(self) -> dict[int, tuple[int, ...]]:
        return self._table("stacks", decode_stack)

    def stack(self, stack_id: int) -> list[CallSite]:
        """The user stack of an op, outermost frame first."""
        return [self.sites.get(s, UNKNOWN_SITE) for s in self.stacks.get(stack_id, ())]

    def refresh(self) -> None:
        """Forgets cached tables so ops written since opening become readable."""
        for name in ("op_names", "sites", "stacks", "state_names"):
            self.__dict__.pop(name, None)
        self.info = self._read_info()

    def decode(self, raw: Any) -> OpRecord:
        """The op record ``raw`` (as unpacked from the trace); :class:`DamagedRecord` when it
        is not one."""
        raw = check_op(raw, tensors=False)  # each tensor entry is checked as it is decoded
        site = raw.get("c")
        kernels = self.kernels(raw["i"])
        return OpRecord(
            index=raw["i"],
            op=self.op_names.get(raw["o"], f"<op {raw['o']}>"),
            step=raw.get("s", 0),
            phase=schema.PHASES[raw.get("p", 3)],
            call_site=self.sites.get(site, UNKNOWN_SITE) if site is not None else UNKNOWN_SITE,
            stack_id=-1 if raw.get("k") is None else raw["k"],
            forward_index=raw.get("f"),
            args=tuple((str(a[0]), a[1]) for a in raw.get("a", ())),
            inputs=tuple(TensorRecord.decode(t) for t in raw.get("x", ())),
            outputs=tuple(TensorRecord.decode(t) for t in raw.get("y", ())),
            rng=raw.get("r"),
            returned=raw.get("v"),
            kernels=tuple(k for k in kernels if not k.unrecorded),
            unclaimed_kernels=tuple(k for k in kernels if k.unrecorded),
            origins=tuple(self.sites.get(i, UNKNOWN_SITE) for i in raw.get("l", ())),
        )

    def kernels(self, index: int) -> tuple[KernelEntry, ...]:
        """The GPU kernels, memcpys and memsets op ``index`` launched, then those launched after
        it by code OpGuard did not record (flagged; empty off the GPU)."""
        db = self._dbs.get("kernels")
        if db is None or not _holds(index):
            return ()
        try:
            with self._env.begin() as txn:
                raw = txn.get(schema.op_key(index), db=db)
        except lmdb.Error:
            return ()
        return tuple(_kernel_entries(raw)) if raw is not None else ()

    def first_gpu_start(self, start: int, stop: int) -> int | None:
        """When the GPU work of ops ``start`` to ``stop - 1`` began (ns, CUPTI's clock): the
        earliest start among the entries of the first of them that launched any (one cursor
        step: the ``kernels`` database holds entries only for ops with GPU work); None when
        none did, or no time was recorded."""
        db = self._dbs.get("kernels")
        if db is None or stop <= start:
            return None
        try:
            with self._env.begin() as txn:
                cursor = txn.cursor(db=db)
                if not cursor.set_range(schema.op_key(_clamped(start))):
                    return None
                if _op_index(cursor.key()) >= stop:
                    return None
                entries = _kernel_entries(cursor.value())
        except (lmdb.Error, DamagedRecord):
            return None  # kernels are evidence, not the trace
        starts = [k.start_ns for k in entries if k.start_ns is not None]
        return min(starts) if starts else None

    def unclaimed_between(
        self, start: int, stop: int, limit: int
    ) -> tuple[list[tuple[int, KernelEntry]], int]:
        """GPU work that code OpGuard did not record launched after op ``start`` and before
        op ``stop`` (tagged with ops ``start`` to ``stop - 1``): up to ``limit`` (op index,
        entry) pairs in launch order, and how many there were. One cursor pass over the
        ``kernels`` database, which holds entries only for ops that had GPU work."""
        db = self._dbs.get("kernels")
        found: list[tuple[int, KernelEntry]] = []
        total = 0
        if db is None or stop <= start:
            return found, total
        try:
            with self._env.begin() as txn:
                cursor = txn.cursor(db=db)
                if not cursor.set_range(schema.op_key(_clamped(start))):
                    return found, total
                for key, value in cursor:
                    index = _op_index(key)
                    if index >= stop:
                        break
                    if _UNCLAIMED_PACKED not in value:  # most ops: skip unpacking
                        continue
                    for entry in _kernel_entries(value):
                        if entry.unrecorded:
                            total += 1
                            if len(found) < limit:
                                found.append((index, entry))
        except (lmdb.Error, DamagedRecord):
            pass  # kernels are evidence, not the trace: what was read stands
        return found, total

    def captures(self, index: int) -> list[CapturedTensor]:
        """The tensors of op ``index`` stored in full (``record --capture``): its inputs as
        they were before it ran, then its outputs. Empty when the op was not captured."""
        db = self._dbs.get("captures")
        if db is None or not _holds(index):
            return []
        prefix = schema.op_key(index)
        found: list[CapturedTensor] = []
        try:
            with self._env.begin() as txn:
                cursor = txn.cursor(db=db)
                if not cursor.set_range(prefix):
                    return []
                for key, value in cursor:
                    if not key.startswith(prefix):
                        break
                    found.append(CapturedTensor.decode(key, _unpack(value)))
        except (lmdb.Error, ValueError, TypeError) as exc:
            raise TraceError(f"{self.path}: captures of op {index} unreadable ({exc})") from None
        return found

    def captured_ops(self) -> list[int]:
        """Indices of the ops that have captured tensors, in order."""
        db = self._dbs.get("captures")
        if db is None:
            return []
        indices: list[int] = []
        try:
            with self._env.begin() as txn:
                for key in txn.cursor(db=db).iternext(keys=True, values=False):
                    index = parse_key(key)[0]
                    if not indices or indices[-1] != index:
                        indices.append(index)
        except (lmdb.Error, ValueError) as exc:
            raise TraceError(f"{self.path}: captures unreadable ({exc})") from None
        return indices

    def raw_ops(self, start: int = 0, stop: int | None = None) -> Iterator[dict[str, Any]]:
        """Undecoded op maps in execution order, from ``start`` up to ``stop`` (exclusive).
        Reading ends at a damaged record or page, noted in :attr:`damage`."""
        if start > schema.MAX_OP_INDEX:
            return
        stop, cut = self._within_cut(stop)
        last = stop - 1 if cut and stop is not None else None  # the last before the damage
        try:
            with self._env.begin(buffers=True) as txn:
                cursor = txn.cursor(db=self._dbs["ops"])
                for key, value in cursor if self._seek(cursor, start, stop) else ():
                    index = _op_index(key)
                    if stop is not None and index >= stop:
                        return
                    yield check_op(_unpack(value), tensors=False)
                    if index == last:  # LMDB must stay on it: the next page is damaged
                        break
        except (lmdb.Error, DamagedRecord) as exc:
            self.damage = f"reading stopped at a damaged record: {exc}"
            return
        if cut:
            self.damage = self._cut_short

    def raw_chunks(
        self, start: int = 0, stop: int | None = None, size: int = CHUNK
    ) -> Iterator[list[bytes]]:
        """Undecoded op records (msgpack bytes) in execution order, ``size`` at a time, from
        ``start`` up to ``stop`` (exclusive): the bulk read of the diff, which decodes only
        what it needs (:mod:`opguard.store.light`). Decoding errors are the caller's to
        report in :attr:`damage`; the end of the records before a damaged page is noted there.

        Reading maps the trace's pages into the process, where they stay resident until the
        trace is closed: a whole-trace scan would grow with the trace. A whole-trace scan
        therefore unmaps the pages it read as each chunk is copied out of them (see
        :func:`advise_pages`), and asks for sequential readahead while it lasts: the
        environment is opened for random access, so each page not in the page cache would
        otherwise be a separate 4 KiB read from the disk."""
        if start > schema.MAX_OP_INDEX:
            return
        if stop is not None and stop > schema.MAX_OP_INDEX:
            stop = None
        whole = stop is None  # to the end of the trace
        stop, cut = self._within_cut(stop)
        # Found once: the map stays where it is while the environment is open, as it is
        # whenever pages are released below (just after the cursor read from them).
        spans = mapped_spans(self.path) if whole else []
        advise_pages(spans, _MADV_SEQUENTIAL)
        try:
            with self._env.begin() as txn:
                cursor = txn.cursor(db=self._dbs["ops"])
                found = self._seek(cursor, start, stop)
                if found and stop is not None:  # keys too, to stop at
                    stop_key = schema.op_key(_clamped(stop))
                    pairs = cursor.iternext(keys=True, values=True)
                    if cut:  # never a step past the last record before the damage
                        pairs = _through(pairs, schema.op_key(stop - 1))
                    while chunk := list(islice(pairs, size)):
                        if chunk[-1][0] >= stop_key:
                            del chunk[bisect_left(chunk, stop_key, key=itemgetter(0)) :]
                            if chunk:
                                yield [value for _, value in chunk]
                            break
                        advise_pages(spans, _MADV_DONTNEED)  # a whole trace before a damage
                        yield [value for _, value in chunk]
                elif found:
                    values = cursor.iternext(keys=False, values=True)
                    while batch := list(islice(values, size)):
                        advise_pages(spans, _MADV_DONTNEED)  # the batch is a copy
                        yield batch
        except lmdb.Error as exc:
            self.damage = f"reading stopped at a damaged record: {exc}"
            return
        finally:
            if whole:  # as opened (readahead=False), if the map is still there
                advise_pages(mapped_spans(self.path), _MADV_RANDOM)
        if cut:
            self.damage = self._cut_short

    def ops(self, start: int = 0, stop: int | None = None) -> Iterator[OpRecord]:
        """Decoded ops in execution order; reading ends at a damaged record (see
        :attr:`damage`)."""
        for raw in self.raw_ops(start, stop):
            try:
                op = self.decode(raw)
            except DamagedRecord as exc:
                self.damage = f"reading stopped at a damaged record: {exc}"
                return
            yield op

    def op(self, index: int) -> OpRecord:
        found = self._decoded.get(index)
        if found is not None:
            return found
        if self._stop is not None and index >= self._stop:  # LMDB would search a damaged page
            raise TraceError(f"{self.path}: no op {index} read ({self._cut_short})")
        try:
            with self._env.begin() as txn:
                raw = txn.get(schema.op_key(index), db=self._dbs["ops"]) if _holds(index) else None
        except lmdb.Error as exc:
            raise TraceError(f"{self.path}: op {index} unreadable ({exc})") from None
        if raw is None:
            raise TraceError(f"{self.path}: no op {index} ({self.describe_ops()})")
        found = self._decoded[index] = self.decode(_unpack(raw))
        if len(self._decoded) > DECODED_KEPT:
            del self._decoded[next(iter(self._decoded))]
        return found


DECODED_KEPT = 512  # ops a trace keeps decoded (RankTrace.op)
_MADV_RANDOM, _MADV_SEQUENTIAL, _MADV_DONTNEED = 1, 2, 4
_madvise: Any = None


def mapped_spans(path: Path) -> list[tuple[int, int]]:
    """(address, length) of each of this process's mappings of the trace at ``path`` (a rank
    directory), where the platform allows advising them (Linux; elsewhere none). The
    addresses are valid only while the trace's environment stays open."""
    global _madvise
    if _madvise is None:
        _madvise = False
        if os.path.exists("/proc/self/maps"):
            try:
                import ctypes

                libc = ctypes.CDLL(None, use_errno=True)
                libc.madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
                _madvise = libc.madvise
            except (OSError, AttributeError):
                pass
    if not _madvise:
        return []
    data = os.path.realpath(path / "data.mdb")
    try:
        with open("/proc/self/maps") as maps:
            ranges = [
                fields[0].split("-")
                for fields in (line.split(maxsplit=5) for line in maps)
                if len(fields) == 6 and fields[5].rstrip("\n") == data
            ]
    except OSError:
        return []
    return [(int(lo, 16), int(hi, 16) - int(lo, 16)) for lo, hi in ranges]


def advise_pages(spans: list[tuple[int, int]], advice: int) -> None:
    """``madvise`` on the mappings ``spans`` (:func:`mapped_spans`). With ``MADV_DONTNEED``
    it unmaps the trace's pages from this process: LMDB reads through a read-only shared
    mapping of ``data.mdb``, so only the process's page-table entries go, the data stays in
    the page cache and the next read maps it again. Without this the resident memory of a
    scan grows with the trace, though none of it is the process's own."""
    for start, length in spans:
        _madvise(start, length, advice)


def _can_lock(path: Path) -> bool:
    """Readers take LMDB's reader lock (so a live writer never reuses pages they read) unless
    the trace is on a read-only location, where no writer can be running anyway."""
    lock = path / "lock.mdb"
    return os.access(lock if lock.exists() else path, os.W_OK)


def rank_numbers(path: Path) -> list[int]:
    """The ranks whose traces directory ``path`` holds (``rank-K``), in order."""
    return sorted(
        int(p.name[len(schema.RANK_DIR_PREFIX) :])
        for p in path.glob(f"{schema.RANK_DIR_PREFIX}*")
        if p.name[len(schema.RANK_DIR_PREFIX) :].isdigit()
    )


class Run:
    """A recorded run: its metadata and one trace per rank.

    ``meta``: the run's metadata where this directory holds only some of its ranks and not
    its ``meta.json`` (ranks written on the local disks of several nodes: the node that
    prepared the run holds it, see :mod:`opguard.distributed`); read from the directory
    otherwise."""

    def __init__(self, path: str | Path, meta: dict[str, Any] | None = None) -> None:
        self.path = Path(path)
        if not self.path.exists():
            raise TraceError(f"{self.path}: no such run directory")
        if not self.path.is_dir():
            raise TraceError(f"{self.path}: not a directory (expected an OpGuard run directory)")
        self.meta = read_meta(self.path) if meta is None else meta
        self.ranks = rank_numbers(self.path)
        self._traces: dict[int, RankTrace] = {}

    @property
    def status(self) -> str:
        return str(self.meta.get("status", "unknown"))

    def rank(self, rank: int = 0) -> RankTrace:
        if rank not in self.ranks:
            raise TraceError(f"{self.path}: no rank {rank} (ranks: {self.ranks or 'none'})")
        if rank not in self._traces:
            self._traces[rank] = RankTrace(self.path / schema.rank_dir_name(rank), rank, self.meta)
        return self._traces[rank]

    def close(self) -> None:
        for trace in self._traces.values():
            trace.close()
        self._traces.clear()

    def __enter__(self) -> Run:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
