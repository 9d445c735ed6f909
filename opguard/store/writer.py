"""Batched, crash-tolerant writing of one rank's trace into LMDB from a background thread.

The training thread packs a plain record as it appends it; a GPU record, whose fingerprints the
device is still computing, is completed and packed by a daemon thread (natively, in batches,
without the GIL), which commits everything in one LMDB transaction per batch, with
``append=True`` puts (keys are increasing). A process killed with SIGKILL therefore leaves a
consistent trace up to its last committed batch: at most ``flush_interval`` seconds of ops are
lost.

Packing and writing are woken apart. py-lmdb lets go of the GIL around every put, so a commit
hands the GIL back and forth with the training thread thousands of times, each handover costing
that thread a wake-up; on a slow host this added 20 ms to a GPT-2 forward pass. So GPU records
are packed whenever their result rings fill (``make_room``), which holds the GIL only to make
their bytes, and written when the recorder says the host has time to spare (``wake``, as each
backward pass starts), or at the latest ``flush_interval`` after the last write.
"""

from __future__ import annotations

import bisect
import collections
import contextlib
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import lmdb
import msgpack

from . import schema

# Pending GPU records that make the writer pack them (they hold fingerprint ring space); below
# that, they wait for the next wake() (the recorder's at the start of each backward pass).
GPU_BATCH = 1024
# 1 TiB of address space: LMDB maps it lazily and the file only grows as pages are written.
MAP_SIZE = 1 << 40

Packer = Callable[[], Any]
# A record the writer thread packs once its GPU fingerprints have landed (an opguard._C.OpRecord).
Deferred = Any


# Pages a transaction that drops ops may number beyond those its values fill (tree pages copied
# on write, the free list), for which the file is grown before it runs (_cover_pages).
DROP_PAGES = 64
# The queue's marker for "delete the ops below this index" (drop_ops): not a database.
_DROP = "drop"
# Databases keyed by op index first (schema.op_key), whose entries go with their op.
_PER_OP_DBS = ("ops", "kernels", "captures")


# One msgpack Packer per thread: a Packer is not thread-safe, and building one costs as much as
# packing a record.
_packers = threading.local()


# (database, key, value) queued for the writer thread. Ops are queued by their index, whose key
# (schema.op_key) that thread makes: one Python call less per op on the training thread.
QueuedItem = tuple[str, bytes | int, Any]


def _key(key: bytes | int) -> bytes:
    return key if isinstance(key, bytes) else schema.op_key(key)


def packb(value: Any) -> bytes:
    packer = getattr(_packers, "packer", None)
    if packer is None:
        packer = _packers.packer = msgpack.Packer(use_bin_type=True)
    return packer.pack(value)


class Interner:
    """Assigns dense ids to hashable values; new values are handed to ``on_new``."""

    def __init__(self, on_new: Callable[[int, Any], None]) -> None:
        self._ids: dict[Any, int] = {}
        self._on_new = on_new

    def __call__(self, value: Any, payload: Callable[[], Any] | None = None) -> int:
        ident = self._ids.get(value)
        if ident is None:
            ident = len(self._ids)
            self._ids[value] = ident
            self._on_new(ident, payload() if payload is not None else value)
        return ident


class TraceWriter:
    """Writes one rank's trace. ``append`` is cheap and thread-safe; ``close`` flushes."""

    def __init__(
        self,
        rank_dir: Path,
        *,
        start_info: dict[str, Any],
        batch_size: int = 8192,
        flush_interval: float = 0.25,
    ) -> None:
        rank_dir.mkdir(parents=True, exist_ok=True)
        self._env = lmdb.open(
            str(rank_dir),
            map_size=MAP_SIZE,
            max_dbs=len(schema.DB_NAMES),
            sync=False,  # a killed process keeps the page cache; fsync happens at close
            metasync=False,
            readahead=False,
        )
        self._dbs = {name: self._env.open_db(name.encode()) for name in schema.DB_NAMES}
        self._data_file = rank_dir / "data.mdb"
        self._page_size = int(self._env.stat()["psize"])
        with self._env.begin(write=True) as txn:
            info = self._dbs["info"]
            txn.put(b"schema", msgpack.packb(schema.SCHEMA_VERSION), db=info)
            txn.put(b"start", msgpack.packb(start_info), db=info)
            with txn.cursor(db=self._dbs["kernels"]) as cursor:
                # GPU activity keys above it are new, below it they may extend entries
                self._last_kernels_key: bytes | None = cursor.key() if cursor.last() else None
        self.intern_name = Interner(lambda i, v: self._put_later("names", schema.id_key(i), v))
        self.intern_site = Interner(lambda i, v: self._put_later("sites", schema.id_key(i), v))
        self.intern_stack = Interner(lambda i, v: self._put_later("stacks", schema.id_key(i), v))
        self.intern_state = Interner(lambda i, v: self._put_later("states", schema.id_key(i), v))
        # Appended by the recording threads, taken by the writer: deque appends and pops are
        # atomic, so neither side takes a lock (one per op, on the training thread, before).
        self._pending: collections.deque[QueuedItem] = collections.deque()
        # Packed on the writer thread, waiting for the next write.
        self._held: list[QueuedItem] = []
        self._wake = threading.Event()
        self._write_lock = threading.Lock()
        self._write_due = False  # set by wake(): write at the next turn, not only pack
        self._written_at = time.monotonic()
        self._closing = False
        self._batch_size = batch_size
        self._flush_interval = flush_interval
        self.error: BaseException | None = None
        # Called on the writer thread before each batch (final=True at close): returns GPU
        # activity, which arrives from CUPTI later than the ops themselves, as (op index, its
        # kernel entries packed as one msgpack array), ops in order.
        self.poll_kernels: Callable[[bool], list[tuple[int, bytes]]] | None = None
        # Called on the writer thread with a batch's deferred records: their packed bytes. The
        # recorder's hook packs them natively, collecting their GPU results without the GIL.
        self.pack_deferred: Callable[[list[Deferred]], list[bytes]] | None = None
        self.records_written = 0
        self.ops_floor = 0  # ops below it were dropped (drop_ops): the trace holds none of them
        self.bytes_written = 0
        self.busy_seconds = 0.0  # spent packing and committing: the writer's throughput
        self._thread = threading.Thread(target=self._run, name="opguard-writer", daemon=True)
        self._thread.start()

    def _put_later(self, db: str, key: bytes, value: Any) -> None:
        self._pending.append((db, key, value))

    def _take_pending(self) -> list[QueuedItem]:
        """Everything queued so far, in order; what is queued meanwhile stays for the next."""
        pending = self._pending
        return [pending.popleft() for _ in range(len(pending))]

    def append(self, index: int, record: bytes | dict[str, Any] | Deferred) -> None:
        """Queues op ``index``: its packed bytes, a dict packed here, or a deferred record,
        packed on the writer thread by ``pack_deferred`` (GPU records finish there once their
        device results have landed). A dict is packed on the calling thread: a record waiting
        in the queue as Python objects survives the cyclic collector's young-generation passes,
        which then promote and rescan thousands of them per step."""
        deferred = not isinstance(record, (bytes, dict))
        value = packb(record) if isinstance(record, dict) else record
        pending = self._pending
        pending.append(("ops", index, value))  # its key is made on the writer thread
        count = len(pending)
        if count >= self._batch_size:
            self.wake()
        elif deferred and count % GPU_BATCH == 0:
            self.make_room()

    def wake(self) -> None:
        """Writes the queue now rather than at the next interval. The recorder calls it as a
        backward pass starts: the trace is then written while the GPU, not the host, bounds
        the step, instead of taking the GIL from the forward pass, whose host work usually
        bounds it (docs/PERFORMANCE.md)."""
        with self._write_lock:
            self._write_due = True
        self._wake.set()

    def make_room(self) -> None:
        """Packs the queued GPU records now, freeing the fingerprint ring space they hold, and
        leaves writing them to the next ``wake`` or interval. The recorder calls it when the
        rings fill."""
        self._wake.set()

    def _run(self) -> None:
        while True:
            self._wake.wait(self._flush_interval)
            self._wake.clear()
            closing = self._closing
            with self._write_lock:
                write, self._write_due = self._write_due, False
            write = write or closing or time.monotonic() - self._written_at >= self._flush_interval
            try:
                self._held += self._packed(self._take_pending())
                if write:
                    batch, self._held = self._held, []
                    self._commit(batch + self._kernel_items(final=False))
            except BaseException as exc:  # keep the training alive; close() reports it
                self.error = exc
                return
            if closing:
                return

    def _packed(self, batch: list[QueuedItem]) -> list[QueuedItem]:
        """``batch`` with its deferred GPU records packed (waiting, without the GIL, for their
        device results), step records included: their GPU fingerprints hold result-ring space,
        which is handed back in launch order, so a step record left for the next write would
        keep every later op's space too and stall the training thread on full rings."""
        for k, (db, key, value) in enumerate(batch):
            if db == "steps" and callable(value):
                batch[k] = (db, key, value())
        deferred = [
            k for k, (db, _, value) in enumerate(batch) if db == "ops" and type(value) is not bytes
        ]
        if not deferred:
            return batch
        if self.pack_deferred is None:
            raise RuntimeError("a deferred record, but no pack_deferred to pack it")
        started = time.perf_counter()
        packed = self.pack_deferred([batch[k][2] for k in deferred])
        for k, value in zip(deferred, packed, strict=True):
            batch[k] = ("ops", batch[k][1], value)
        self.busy_seconds += time.perf_counter() - started
        return batch

    def _commit(self, batch: list[QueuedItem]) -> None:
        """Writes ``batch`` (its GPU records packed) in one transaction."""
        self._written_at = time.monotonic()
        if not batch:
            return
        started = time.perf_counter()
        by_db: dict[str, list[tuple[bytes, bytes]]] = {}
        floor = self.ops_floor
        for db, key, value in batch:
            if db == _DROP:
                floor = max(floor, value)
                continue
            if db in ("ops", "kernels"):  # packed by append() or above, or by poll_kernels
                by_db.setdefault(db, []).append((_key(key), value))
                continue
            if callable(value):
                value = value()
            by_db.setdefault(db, []).append((_key(key), packb(value)))
        if floor > 0 and "kernels" in by_db:  # GPU activity of dropped ops, which comes late
            below = schema.op_key(floor)
            by_db["kernels"] = [item for item in by_db["kernels"] if item[0] >= below]
        dropping = floor > self.ops_floor
        if dropping:  # room for the pages this transaction may number (see _cover_pages)
            size = sum(len(v) for items in by_db.values() for _, v in items)
            self._cover_pages(2 * size // self._page_size + DROP_PAGES)
        while True:
            try:
                with self._env.begin(write=True) as txn:
                    for db, items in by_db.items():
                        if db == "kernels":
                            self._put_kernels(txn, items)
                            continue
                        with txn.cursor(db=self._dbs[db]) as cursor:
                            # steps may be renumbered (opguard.step(n)): no append there
                            cursor.putmulti(items, append=db not in ("info", "steps"))
                    if dropping:
                        self._delete_below(txn, schema.op_key(floor))
                break
            except lmdb.MapFullError:
                self._env.set_mapsize(self._env.info()["map_size"] * 2)
        if dropping:
            self._cover_pages(0)
        self.ops_floor = floor
        self.records_written += len(by_db.get("ops", ()))
        self.bytes_written += sum(len(v) for items in by_db.values() for _, v in items)
        self.busy_seconds += time.perf_counter() - started

    def _cover_pages(self, extra: int) -> None:
        """Makes the file hold every page LMDB has numbered, and ``extra`` more. A transaction
        that deletes can number a page, free it again and never write it; LMDB never reads such
        a page, but a file shorter than its pages is what a truncated copy looks like, and
        readers refuse it (:mod:`.pagecheck`). Grown before the transaction, the file holds its
        pages from the moment it commits (and after it, should the room have been short)."""
        needed = (int(self._env.info()["last_pgno"]) + 1 + extra) * self._page_size
        with contextlib.suppress(OSError):
            if self._data_file.stat().st_size < needed:
                os.truncate(self._data_file, needed)

    def _delete_below(self, txn: lmdb.Transaction, key: bytes) -> None:
        """Deletes the ops whose keys sort below ``key``, with their GPU activity and captures.
        LMDB reuses the freed pages for later writes, so a run that drops as it goes keeps its
        file at about the size of what it holds."""
        for db in _PER_OP_DBS:
            with txn.cursor(db=self._dbs[db]) as cursor:
                if not cursor.first():
                    continue
                while cursor.key() and bytes(cursor.key()) < key:
                    if not cursor.delete():
                        break

    def _put_kernels(self, txn: lmdb.Transaction, items: list[tuple[bytes, bytes]]) -> None:
        """Stores ops' GPU activity (keys in order). An op's activity can arrive over two
        drains, so entries at or below the last key written extend what is there; those above
        it are new and go in with one call."""
        db = self._dbs["kernels"]
        last = self._last_kernels_key
        new = 0 if last is None else bisect.bisect_right([key for key, _ in items], last)
        for key, value in items[:new]:
            old = txn.get(key, db=db)
            if old is not None:
                value = packb(msgpack.unpackb(old) + msgpack.unpackb(value))
            txn.put(key, value, db=db)
        if new < len(items):
            with txn.cursor(db=db) as cursor:
                added = cursor.putmulti(items[new:], append=True)[1]
            if added != len(items) - new:  # keys out of order: MDB_APPEND skips those
                raise RuntimeError("GPU activity drained out of op order")
            self._last_kernels_key = items[-1][0]

    def _kernel_items(self, final: bool) -> list[QueuedItem]:
        if self.poll_kernels is None:
            return []
        try:
            by_op = self.poll_kernels(final)
        except Exception as exc:  # kernels are evidence, not the trace: stop collecting them
            self.poll_kernels = None
            self._put_later("info", b"kernels_failure", f"{type(exc).__name__}: {exc}")
            return []
        return [("kernels", schema.op_key(op), packed) for op, packed in by_op]

    def put_capture(self, key: bytes, value: Packer) -> None:
        """Queues a captured tensor (see :mod:`opguard.store.captures`); ``value`` is called
        on the writer thread, so compression never runs on the training thread."""
        self._put_later("captures", key, value)

    def put_step(self, step: int, value: dict[str, Any] | Packer) -> None:
        """Queues step ``step``'s state record (:mod:`.states`): a dict, or a callable that
        makes it on the writer thread (it may wait there for GPU fingerprints to land)."""
        self._put_later("steps", schema.op_key(step), value)

    def drop_ops(self, below: int) -> None:
        """Deletes ops ``0`` to ``below - 1`` (those still held, with their GPU activity and
        captures) once everything queued before has been written: the flight recorder
        (``opguard record --keep-last``) keeps the last steps' ops only."""
        self._pending.append((_DROP, b"", below))

    def put_info(self, key: str, value: Any) -> None:
        """Writes an ``info`` entry with the next batch (e.g. a recorder failure)."""
        self._put_later("info", key.encode(), value)

    def failure_message(self) -> str:
        """What a write error means for the trace, in one line."""
        held = (
            f"it holds ops {self.ops_floor} to {self.records_written - 1}"
            if self.records_written > self.ops_floor
            else "it holds no op"
        )
        return (
            f"the trace could not be written ({type(self.error).__name__}: {self.error}; "
            f"disk full or over a file size limit?): {held}, later ops are not recorded"
        )

    def close(self, end_info: dict[str, Any]) -> BaseException | None:
        """Flushes everything, writes the ``end`` record, syncs and closes. Returns the write
        error that stopped the writer early, if any."""
        self._closing = True
        self._wake.set()
        self._thread.join()
        batch, self._held = self._held + self._take_pending(), []
        end = ("info", b"end", {**end_info, "ended": time.time()})
        if self.error is None:
            try:
                batch = self._packed(batch) + self._kernel_items(final=True)
                self._commit([*batch, end])
            except BaseException as exc:
                self.error = exc
        if self.error is not None:
            self._salvage([item for item in batch if item[0] == "info"], end)
        with contextlib.suppress(lmdb.Error):
            self._env.sync(True)
        self._env.close()
        return self.error

    def _salvage(self, info: list[QueuedItem], end: QueuedItem) -> None:
        """After a failed write, tries to record why and where the trace ends: a small
        transaction may still fit in pages LMDB freed earlier. What was committed before
        stays readable either way."""
        failure = ("info", b"write_failure", self.failure_message())
        with contextlib.suppress(lmdb.Error, OSError):
            self._commit([*info, failure, end])
