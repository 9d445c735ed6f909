"""A structural check of an LMDB file before LMDB reads it.

LMDB trusts its pages: a truncated ``data.mdb`` makes a read past the end of the file kill the
process with SIGBUS, and a damaged page can trip one of LMDB's assertions, which aborts it. A
reader of traces copied between machines, cut short by a full disk or damaged on disk must not
die like that, so :func:`check_snapshot` walks the B-trees of the snapshot a read transaction
sees and checks what LMDB would otherwise trust: every page number within the file, every page
of the kind its depth demands and carrying its own number, every node and value inside its page
or its overflow pages. Problems are :class:`TraceError` (one line for the user).

It reads the on-disk format of LMDB 0.9 as built for 64-bit little-endian machines (the only
format py-lmdb writes there); anything else is reported as unreadable rather than guessed at.
The walk reads each page header and node header once: it costs a fraction of a full read.
"""

from __future__ import annotations

import mmap
import os
import struct
from pathlib import Path

import numpy as np

from .errors import TraceError

MAGIC = 0xBEEFC0DE
DATA_VERSION = 1
PAGE_HEADER = 16  # pgno u64, pad u16, flags u16, lower u16, upper u16 (or pages u32)
NODE_HEADER = 8  # lo u16, hi u16, flags u16, ksize u16
MAX_DEPTH = 32  # LMDB's cursor stack: no tree is deeper
P_INVALID = (1 << 64) - 1

# Page flags.
P_BRANCH, P_LEAF, P_OVERFLOW = 0x01, 0x02, 0x04
# Leaf node flags.
F_BIGDATA, F_SUBDATA, F_DUPDATA = 0x01, 0x02, 0x04

_HEADER = struct.Struct("<QHHHH")
_OVERFLOW_PAGES = struct.Struct("<I")
_NODE = struct.Struct("<HHHH")
_PTR = struct.Struct("<H")
_PGNO = struct.Struct("<Q")
# MDB_db: pad u32 (page size, in the free DB), flags u16, depth u16, branch/leaf/overflow
# page counts, entries, root.
_DB = struct.Struct("<IHHQQQQQ")
# MDB_meta after the page header: magic, version, address, map size, free DB, main DB,
# last page, transaction id.
_META = struct.Struct(f"<IIQQ{_DB.size}s{_DB.size}sQQ")


class _Damaged(Exception):
    """Internal: what is wrong, turned into a TraceError naming the file."""


def check_snapshot(data_file: Path, txnid: int) -> None:
    """Checks the snapshot of transaction ``txnid`` of the LMDB file ``data_file``. Call it
    while a read transaction of that snapshot is open, so that a live writer cannot reuse its
    pages meanwhile."""
    problem = None
    try:
        with open(data_file, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < 2 * PAGE_HEADER + _META.size:
                raise TraceError(f"{data_file.parent}: damaged trace (file too short for LMDB)")
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as data:
                try:
                    _Walker(data, size, txnid).walk_all()
                except _Damaged as exc:  # handled here: its frames hold views of the map
                    problem = str(exc)
    except (OSError, ValueError) as exc:
        raise TraceError(f"{data_file.parent}: unreadable trace ({exc})") from None
    if problem is not None:
        raise TraceError(f"{data_file.parent}: damaged trace ({problem})")


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

    def walk_all(self) -> None:
        for name, db in self._walk(self.main_db, subdatabases=True, name="main"):
            self._walk(db, subdatabases=False, name=name.decode(errors="replace"))

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
        level = [root]
        for _ in range(depth - 1):
            level = [child for pgno in level for child in self._branch(pgno, name)]
        if subdatabases:
            counted = sum(self._leaf(pgno, name, named) for pgno in level)
        else:
            counted = self._leaves(level, name)
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

    def _branch(self, pgno: int, name: str) -> list[int]:
        return [
            lo | hi << 16 | flags << 32 for _, lo, hi, flags, _ in self._nodes(pgno, name, P_BRANCH)
        ]

    def _leaf(self, pgno: int, name: str, named: list[tuple[bytes, bytes]] | None) -> int:
        nodes = self._nodes(pgno, name, P_LEAF)
        end_of_page = pgno * self.psize + self.psize
        for node, lo, hi, flags, ksize in nodes:
            dsize = lo | hi << 16
            value = node + NODE_HEADER + ksize
            if flags & F_DUPDATA or (flags & F_SUBDATA and named is None):
                raise _Damaged(f"database {name}: page {pgno} has a node of an unknown kind")
            if flags & F_BIGDATA:
                if value + _PGNO.size > end_of_page:
                    raise _Damaged(f"database {name}: page {pgno} has a value past its end")
                (first,) = _PGNO.unpack_from(self.data, value)
                self._overflow(first, dsize, name)
            elif value + dsize > end_of_page:
                raise _Damaged(f"database {name}: page {pgno} has a value past its end")
            if flags & F_SUBDATA and named is not None:
                if dsize != _DB.size or flags & F_BIGDATA:
                    raise _Damaged(f"database {name}: page {pgno} has a damaged database entry")
                key = bytes(self.data[node + NODE_HEADER : value])
                named.append((key, bytes(self.data[value : value + dsize])))
        return len(nodes)

    def _leaves(self, pgnos: list[int], name: str) -> int:
        """:meth:`_leaf`'s checks for many leaf pages at once, as array operations: a trace's
        ops database has a leaf page per few records, too many to check one by one in
        Python. Returns the number of nodes."""
        psize = self.psize
        pages = np.asarray(pgnos, dtype=np.int64)
        if pages.size and (pages.min() < 2 or pages.max() >= self.pages):
            raise _Damaged(f"database {name}: a leaf page out of range")
        data = np.frombuffer(self.data, dtype=np.uint8)
        offsets = pages * psize
        stored, flags = _gather(data, offsets, 8), _gather(data, offsets + 10, 2)
        lower, upper = _gather(data, offsets + 12, 2), _gather(data, offsets + 14, 2)
        bad = (stored != pages.astype(np.uint64)) | (
            flags & (P_BRANCH | P_LEAF | P_OVERFLOW) != P_LEAF
        )
        bad |= (lower < PAGE_HEADER) | (lower > upper) | (upper > psize) | (lower % 2 == 1)
        bad |= lower == PAGE_HEADER  # an empty leaf
        if bad.any():
            raise _Damaged(f"database {name}: page {pages[bad.argmax()]} has a damaged header")
        counts = ((lower - PAGE_HEADER) // 2).astype(np.int64)
        page_of = np.repeat(offsets, counts)
        first = np.repeat(np.cumsum(counts) - counts, counts)
        slot = np.arange(page_of.size, dtype=np.int64) - first
        ptr = _gather(data, page_of + PAGE_HEADER + 2 * slot, 2).astype(np.int64)
        bad = (ptr < np.repeat(upper, counts).astype(np.int64)) | (ptr > psize - NODE_HEADER)
        if bad.any():
            raise _Damaged(
                f"database {name}: page {page_of[bad.argmax()] // psize} has a damaged node pointer"
            )
        node = page_of + ptr
        lo, hi = _gather(data, node, 2), _gather(data, node + 2, 2)
        node_flags, ksize = _gather(data, node + 4, 2), _gather(data, node + 6, 2)
        value_end = ptr + NODE_HEADER + ksize.astype(np.int64)
        big = (node_flags & F_BIGDATA) != 0
        dsize = (lo | hi << 16).astype(np.int64)
        bad = (node_flags & (F_DUPDATA | F_SUBDATA)) != 0
        bad |= value_end + np.where(big, _PGNO.size, dsize) > psize
        if bad.any():
            raise _Damaged(
                f"database {name}: page {page_of[bad.argmax()] // psize} has a damaged node"
            )
        for at, size in zip(node[big] + NODE_HEADER + ksize[big], dsize[big], strict=True):
            (first_page,) = _PGNO.unpack_from(self.data, int(at))
            self._overflow(first_page, int(size), name)
        return int(page_of.size)

    def _overflow(self, pgno: int, dsize: int, name: str) -> None:
        offset, _, _ = self._page(pgno, name, P_OVERFLOW)
        (count,) = _OVERFLOW_PAGES.unpack_from(self.data, offset + 12)
        if count < 1 or pgno + count > self.pages or PAGE_HEADER + dsize > count * self.psize:
            raise _Damaged(f"database {name}: overflow page {pgno} has a damaged size")


def _gather(data: np.ndarray, positions: np.ndarray, width: int) -> np.ndarray:
    """The little-endian unsigned integers of ``width`` bytes at each of ``positions``."""
    raw = data[positions[:, None] + np.arange(width)]
    return np.ascontiguousarray(raw).view(f"<u{width}").ravel()
