"""A structural check of an LMDB file before LMDB reads it.

LMDB trusts its pages: a truncated ``data.mdb`` makes a read past the end of the file kill the
process with SIGBUS, and a damaged page can trip one of LMDB's assertions, which aborts it. A
reader of traces copied between machines, cut short by a full disk or damaged on disk must not
die like that, so :func:`check_snapshot` walks the B-trees of the snapshot a read transaction
sees and checks what LMDB would otherwise trust: every page number within the file, every page
of the kind its depth demands and carrying its own number, every node and value inside its page
or its overflow pages. Problems are :class:`TraceError` (one line for the user), but for the
op records: a damaged page of the ``ops`` database leaves the records before it readable
(:class:`Readable`), as a damaged record does.

It reads the on-disk format of LMDB 0.9 as built for 64-bit little-endian machines (the only
format py-lmdb writes there); anything else is reported as unreadable rather than guessed at.
The walk reads each page header and node header once: it costs a fraction of a full read. The
pages of a tree level are checked as array operations (a trace's ops database has a leaf page
per few records, too many to check one by one in Python) a window of the file at a time, and
each window is unmapped from the process once checked: a mapped page the walk touched would
otherwise stay resident until the file is closed, and checking a trace would hold all of it in
memory. With a window of each level and at most :data:`LEVEL_BATCH` of its pages in hand, the
check's memory is the same for a trace of any size.
"""

from __future__ import annotations

import mmap
import os
import struct
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from numpy.lib.stride_tricks import as_strided

from .errors import TraceError

MAGIC = 0xBEEFC0DE
DATA_VERSION = 1
PAGE_HEADER = 16  # pgno u64, pad u16, flags u16, lower u16, upper u16 (or pages u32)
NODE_HEADER = 8  # lo u16, hi u16, flags u16, ksize u16
MAX_DEPTH = 32  # LMDB's cursor stack: no tree is deeper
P_INVALID = (1 << 64) - 1

# The file is checked (and unmapped) this many bytes at a time, and one tree level this many
# pages at a time before the level below them: together they bound the check's memory.
WINDOW_BYTES = 1 << 21
LEVEL_BATCH = 1 << 16
# A read fault maps the pages around it that are in the page cache, up to this many bytes
# (Linux's fault-around): releasing what was read releases this much around it too.
FAULT_AROUND = 1 << 16
# Overflow values whose headers are read before the pages mapped around them are released: a
# step-level record is an overflow value, one of a leaf page's few dozen.
OVERFLOW_BATCH = 32
_DONTNEED: int | None = getattr(mmap, "MADV_DONTNEED", None)  # None: no madvise here

# Page flags.
P_BRANCH, P_LEAF, P_OVERFLOW = 0x01, 0x02, 0x04
# Leaf node flags.
F_BIGDATA, F_SUBDATA, F_DUPDATA = 0x01, 0x02, 0x04

_HEADER = struct.Struct("<QHHHH")
_OVERFLOW_PAGES = struct.Struct("<I")
_NODE = struct.Struct("<HHHH")
_PTR = struct.Struct("<H")
_PGNO = struct.Struct("<Q")
# The same as array records.
_HEADER_ARRAY = np.dtype(
    [("pgno", "<u8"), ("pad", "<u2"), ("flags", "<u2"), ("lower", "<u2"), ("upper", "<u2")]
)
_NODE_ARRAY = np.dtype([("lo", "<u2"), ("hi", "<u2"), ("flags", "<u2"), ("ksize", "<u2")])
_PTR_ARRAY, _PGNO_ARRAY = np.dtype("<u2"), np.dtype("<u8")
# MDB_db: pad u32 (page size, in the free DB), flags u16, depth u16, branch/leaf/overflow
# page counts, entries, root.
_DB = struct.Struct("<IHHQQQQQ")
# MDB_meta after the page header: magic, version, address, map size, free DB, main DB,
# last page, transaction id.
_META = struct.Struct(f"<IIQQ{_DB.size}s{_DB.size}sQQ")


# Databases read up to a damaged page rather than refused: a trace's op records and its
# step-level records, each in the order they were made, so the records before the damage are a
# run's first ops or steps (a trace cut short).
CUT_SHORT = ("ops", "steps")


class _Damaged(Exception):
    """Internal: what is wrong, turned into a TraceError naming the file."""


@dataclass(frozen=True)
class Readable:
    """What can be read of a database one of whose pages is damaged: its entries in key
    order up to the last before the damage. LMDB reaches a page through the pages before it
    in key order (a cursor moving on, a search descending), so the entries past a damaged page
    cannot be reached in order, and a reader must never ask LMDB for one: not past
    ``last_key``, not for the last entry, never a search for a key after it."""

    last_key: bytes | None  # None: the first page in key order is damaged
    entries: int  # how many entries there are up to ``last_key``
    problem: str  # what is damaged, where


def check_snapshot(data_file: Path, txnid: int) -> dict[str, Readable]:
    """Checks the snapshot of transaction ``txnid`` of the LMDB file ``data_file``. Call it
    while a read transaction of that snapshot is open, so that a live writer cannot reuse its
    pages meanwhile. Returns what can be read of the databases of :data:`CUT_SHORT` that are
    damaged (none: empty); damage anywhere else is a :class:`TraceError`."""
    problem = None
    try:
        with open(data_file, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < 2 * PAGE_HEADER + _META.size:
                raise TraceError(f"{data_file.parent}: damaged trace (file too short for LMDB)")
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
                try:
                    return _Walker(data, size, txnid).walk_all()
                except _Damaged as exc:  # handled here: its frames hold views of the map
                    problem = str(exc)
    except (OSError, ValueError) as exc:
        raise TraceError(f"{data_file.parent}: unreadable trace ({exc})") from None
    raise TraceError(f"{data_file.parent}: damaged trace ({problem})")


@dataclass
class _Nodes:
    """The nodes of a window of pages of one tree level, as arrays (one element per node)."""

    data: np.ndarray  # the window of the file, from the start of page ``first``
    first: int
    page: np.ndarray  # offset in ``data`` of the node's page
    value: np.ndarray  # offset in ``data`` of its value (just past its key)
    size: np.ndarray  # lo | hi << 16: the value's size (leaf), a child's page number (branch)
    flags: np.ndarray

    def pgno(self, node: int, psize: int) -> int:
        """The page number of node ``node``'s page (to name it)."""
        return self.first + int(self.page[node]) // psize


class _Walker:
    def __init__(self, data: mmap.mmap, size: int, txnid: int) -> None:
        self.data = data
        self.size = size
        free_db, main_db, last_page = self._meta(txnid)
        self.psize = _DB.unpack(free_db)[0]
        if self.psize < 512 or self.psize & (self.psize - 1) or self.psize > 1 << 16:
            raise _Damaged(f"implausible page size {self.psize}")
        self.pages = last_page + 1
        if self.pages * self.psize > size:
            raise _Damaged(
                f"truncated: {size} bytes, its last transaction needs {self.pages * self.psize}"
            )
        self.main_db = main_db

    def _meta(self, txnid: int) -> tuple[bytes, bytes, int]:
        """The meta page of ``txnid``: LMDB keeps two (pages 0 and 1) and alternates."""
        offset = 0
        for _ in range(2):
            if offset + PAGE_HEADER + _META.size > self.size:
                raise _Damaged("truncated header")
            magic, version, _, _, free_db, main_db, last, meta_txn = _META.unpack_from(
                self.data, offset + PAGE_HEADER
            )
            if magic != MAGIC or version != DATA_VERSION:
                raise _Damaged("not an LMDB file of a known version")
            if meta_txn == txnid:
                return free_db, main_db, last
            offset = _DB.unpack(free_db)[0]  # the page size: where page 1 starts
            if offset < PAGE_HEADER + _META.size:
                break
        raise _Damaged(f"no header page for transaction {txnid}")

    def walk_all(self) -> dict[str, Readable]:
        readable: dict[str, Readable] = {}
        for key, db in self._walk(self.main_db, subdatabases=True, name="main"):
            name = key.decode(errors="replace")
            problem = None
            try:
                self._walk(db, subdatabases=False, name=name)
            except _Damaged as exc:
                if name not in CUT_SHORT:
                    raise
                problem = str(exc)
            if problem is not None:  # walked again in key order, out of the handler (the map)
                readable[name] = self._in_order(db, name, problem)
        return readable

    def _in_order(self, db: bytes, name: str, problem: str) -> Readable:
        """The entries of the tree ``db`` in key order up to its first damaged page, as LMDB
        reaches them: each page checked on the way as :meth:`_walk` checks it, one at a time
        (slower than the walk, and needed only where it found damage). ``problem``, what it
        found, is raised again when no page on the way is damaged (a wrong count of entries)."""
        _, _, depth, _, _, _, _, root = _DB.unpack(db)
        last_key, entries = None, 0
        pending = [(root, depth - 1)]  # pages to visit, the next in key order last
        while pending:
            pgno, below = pending.pop()
            page = np.array([pgno], dtype=np.int64)
            try:
                for nodes in self._windows(page, P_BRANCH if below else P_LEAF, name):
                    if below:
                        children = (nodes.size | nodes.flags << 32).tolist()
                        pending.extend((child, below - 1) for child in reversed(children))
                    else:
                        entries += self._leaves(nodes, name)
            except _Damaged as exc:
                return Readable(last_key, entries, str(exc))
            if not below:
                node, _, _, _, ksize = self._nodes(pgno, name, P_LEAF)[-1]
                last_key = bytes(self.data[node + NODE_HEADER : node + NODE_HEADER + ksize])
        raise _Damaged(problem)

    def _walk(self, db: bytes, *, subdatabases: bool, name: str) -> list[tuple[bytes, bytes]]:
        """Checks every page of the tree ``db`` describes; returns the named databases its
        leaves hold (the main database's)."""
        _, _, depth, _, _, _, entries, root = _DB.unpack(db)
        named: list[tuple[bytes, bytes]] = []
        if root == P_INVALID:
            if entries:
                raise _Damaged(f"database {name}: {entries} entries but no root")
            return named
        if not 1 <= depth <= MAX_DEPTH:
            raise _Damaged(f"database {name}: implausible depth {depth}")
        if not 2 <= root < self.pages:
            raise _Damaged(f"database {name}: page {root} out of range")
        roots = np.array([root], dtype=np.int64)
        counted = self._subtree(roots, depth - 1, name, named if subdatabases else None)
        if counted != entries:
            raise _Damaged(f"database {name}: {counted} entries found, {entries} recorded")
        return named

    def _page(self, pgno: int, name: str, kind: int) -> tuple[int, int, int]:
        """Offset, lower and upper bound of page ``pgno``, checked to be a ``kind`` page."""
        if pgno < 2 or pgno >= self.pages:
            raise _Damaged(f"database {name}: page {pgno} out of range")
        offset = pgno * self.psize
        stored, _, flags, lower, upper = _HEADER.unpack_from(self.data, offset)
        if stored != pgno or flags & (P_BRANCH | P_LEAF | P_OVERFLOW) != kind:
            raise _Damaged(f"database {name}: page {pgno} has a damaged header")
        if kind != P_OVERFLOW and not (
            PAGE_HEADER <= lower <= upper <= self.psize and lower % 2 == 0
        ):
            raise _Damaged(f"database {name}: page {pgno} has damaged bounds")
        return offset, lower, upper

    def _nodes(self, pgno: int, name: str, kind: int) -> list[tuple[int, int, int, int, int]]:
        """Each node of the page: its offset in the file, lo, hi, flags and key size."""
        offset, lower, upper = self._page(pgno, name, kind)
        nodes = []
        for k in range(PAGE_HEADER, lower, 2):
            (ptr,) = _PTR.unpack_from(self.data, offset + k)
            if not upper <= ptr <= self.psize - NODE_HEADER:
                raise _Damaged(f"database {name}: page {pgno} has a damaged node pointer")
            lo, hi, flags, ksize = _NODE.unpack_from(self.data, offset + ptr)
            if ptr + NODE_HEADER + ksize > self.psize:
                raise _Damaged(f"database {name}: page {pgno} has a key past its end")
            nodes.append((offset + ptr, lo, hi, flags, ksize))
        if not nodes:
            raise _Damaged(f"database {name}: page {pgno} is empty")
        return nodes

    def _subtree(
        self, pgnos: np.ndarray, below: int, name: str, named: list[tuple[bytes, bytes]] | None
    ) -> int:
        """Checks the pages ``pgnos`` of one level and the ``below`` levels under them; returns
        the entries of their leaves. A level's pages are taken :data:`LEVEL_BATCH` at a time."""
        if below == 0:
            if named is not None:  # the main database: a page or two of named databases
                return sum(self._leaf(int(pgno), name, named) for pgno in pgnos)
            return sum(self._leaves(nodes, name) for nodes in self._windows(pgnos, P_LEAF, name))
        counted = 0
        children: list[np.ndarray] = []
        waiting = 0
        for nodes in self._windows(pgnos, P_BRANCH, name):
            children.append(nodes.size | nodes.flags << 32)
            waiting += children[-1].size
            if waiting >= LEVEL_BATCH:
                counted += self._subtree(np.concatenate(children), below - 1, name, named)
                children, waiting = [], 0
        if children:
            counted += self._subtree(np.concatenate(children), below - 1, name, named)
        return counted

    def _windows(self, pgnos: np.ndarray, kind: int, name: str) -> Iterator[_Nodes]:
        """The nodes of the pages ``pgnos``, which must be ``kind`` (branch or leaf) pages, a
        window of the file at a time, with :meth:`_page`'s and :meth:`_nodes`' checks made;
        each window is unmapped from the process once its nodes have been used."""
        psize = self.psize
        pages = np.sort(pgnos)
        out = (pages < 2) | (pages >= self.pages)
        if out.any():
            raise _Damaged(f"database {name}: page {pages[out.argmax()]} out of range")
        span = max(WINDOW_BYTES // psize, 1)
        start = 0
        while start < pages.size:
            first = int(pages[start])
            stop = int(np.searchsorted(pages, first + span))
            rows = pages[start:stop] - first
            start = stop
            length = (int(rows[-1]) + 1) * psize
            data = np.frombuffer(self.data, dtype=np.uint8, count=length, offset=first * psize)
            header = data.reshape(-1, psize)[rows, :PAGE_HEADER].view(_HEADER_ARRAY).ravel()
            lower, upper = header["lower"].astype(np.int64), header["upper"].astype(np.int64)
            bad = header["pgno"] != (rows + first).astype(np.uint64)
            bad |= header["flags"] & (P_BRANCH | P_LEAF | P_OVERFLOW) != kind
            bad |= (lower < PAGE_HEADER) | (lower > upper) | (upper > psize) | (lower % 2 == 1)
            bad |= lower == PAGE_HEADER  # an empty page
            if bad.any():
                raise _Damaged(
                    f"database {name}: page {first + rows[bad.argmax()]} has a damaged header"
                )
            counts = (lower - PAGE_HEADER) // 2
            page = np.repeat(rows * psize, counts)
            slot = np.arange(page.size) - np.repeat(np.cumsum(counts) - counts, counts)
            ptr = _gather(data, page + PAGE_HEADER + 2 * slot, _PTR_ARRAY).astype(np.int64)
            bad = (ptr < np.repeat(upper, counts)) | (ptr > psize - NODE_HEADER)
            if bad.any():
                raise _Damaged(
                    f"database {name}: page {first + page[bad.argmax()] // psize} "
                    "has a damaged node pointer"
                )
            node = _gather(data, page + ptr, _NODE_ARRAY)
            value = page + ptr + NODE_HEADER + node["ksize"]
            bad = value - page > psize
            if bad.any():
                raise _Damaged(
                    f"database {name}: page {first + page[bad.argmax()] // psize} "
                    "has a key past its end"
                )
            size = node["lo"].astype(np.int64) | node["hi"].astype(np.int64) << 16
            yield _Nodes(data, first, page, value, size, node["flags"].astype(np.int64))
            self._release(first * psize, length)

    def _release(self, offset: int, length: int) -> None:
        """Unmaps bytes ``[offset, offset + length)`` of the file from this process. The map
        is read-only and shared, so this drops only the process's page-table entries: the
        pages stay in the page cache, for LMDB to read next."""
        if _DONTNEED is not None:
            aligned = offset - offset % mmap.PAGESIZE
            self.data.madvise(_DONTNEED, aligned, length + offset - aligned)

    def _leaf(self, pgno: int, name: str, named: list[tuple[bytes, bytes]]) -> int:
        """Checks a leaf page of the main database, collecting the named databases it holds."""
        nodes = self._nodes(pgno, name, P_LEAF)
        end_of_page = pgno * self.psize + self.psize
        for node, lo, hi, flags, ksize in nodes:
            dsize = lo | hi << 16
            value = node + NODE_HEADER + ksize
            if flags & F_DUPDATA:
                raise _Damaged(f"database {name}: page {pgno} has a node of an unknown kind")
            if flags & F_BIGDATA:
                if value + _PGNO.size > end_of_page:
                    raise _Damaged(f"database {name}: page {pgno} has a value past its end")
                (first,) = _PGNO.unpack_from(self.data, value)
                self._overflow(first, dsize, name)
            elif value + dsize > end_of_page:
                raise _Damaged(f"database {name}: page {pgno} has a value past its end")
            if flags & F_SUBDATA:
                if dsize != _DB.size or flags & F_BIGDATA:
                    raise _Damaged(f"database {name}: page {pgno} has a damaged database entry")
                key = bytes(self.data[node + NODE_HEADER : value])
                named.append((key, bytes(self.data[value : value + dsize])))
        return len(nodes)

    def _leaves(self, nodes: _Nodes, name: str) -> int:
        """:meth:`_leaf`'s checks of the nodes of leaf pages outside the main database (a
        window of them). Returns the number of nodes."""
        big = (nodes.flags & F_BIGDATA) != 0
        bad = (nodes.flags & (F_DUPDATA | F_SUBDATA)) != 0
        bad |= nodes.value - nodes.page + np.where(big, _PGNO.size, nodes.size) > self.psize
        if bad.any():
            raise _Damaged(
                f"database {name}: page {nodes.pgno(int(bad.argmax()), self.psize)} "
                "has a damaged node"
            )
        firsts = _gather(nodes.data, nodes.value[big], _PGNO_ARRAY).astype(np.int64)
        sizes = nodes.size[big]
        for batch in range(0, firsts.size, OVERFLOW_BATCH):
            these = slice(batch, batch + OVERFLOW_BATCH)
            for first_page, size in zip(firsts[these].tolist(), sizes[these].tolist(), strict=True):
                self._overflow(first_page, size, name)
            # One header read each, but the kernel mapped the pages around it: released a
            # batch at a time, as a window of the file would be.
            start = int(firsts[these].min()) * self.psize - FAULT_AROUND
            end = int((firsts[these] * self.psize + PAGE_HEADER + sizes[these]).max())
            self._release(max(start, 0), end + FAULT_AROUND - max(start, 0))
        return int(nodes.size.size)

    def _overflow(self, pgno: int, dsize: int, name: str) -> None:
        offset, _, _ = self._page(pgno, name, P_OVERFLOW)
        (count,) = _OVERFLOW_PAGES.unpack_from(self.data, offset + 12)
        if count < 1 or pgno + count > self.pages or PAGE_HEADER + dsize > count * self.psize:
            raise _Damaged(f"database {name}: overflow page {pgno} has a damaged size")


def _gather(data: np.ndarray, positions: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """The values of ``dtype`` (little-endian integers, or records of them) at each of the
    byte ``positions`` of ``data``, which need not be aligned: rows of a view of ``data``
    whose row ``k`` is its bytes from ``k`` on (indexing checks that they lie inside it)."""
    width = dtype.itemsize
    rows = as_strided(data, shape=(data.size - width + 1, width), strides=(1, 1))
    return rows[positions].view(dtype).ravel()
