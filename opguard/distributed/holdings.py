"""What one node holds of a run: the traces of some of its ranks, and on one of the nodes (the
one that prepared the run) its ``meta.json``.

A job of many nodes that records to each node's local disk leaves on every node the same run
directory path, holding the ranks that node ran; on shared storage every node sees every rank.
Either way a run is one run: each node is asked what it holds, and nothing is guessed.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ..store import TraceError, schema
from ..store.meta import read_meta
from ..store.reader import rank_numbers

# A node that sees the disk the traces were written to at another place than the training did
# (a container that mounts the node's disk elsewhere; on one machine, a directory standing for
# each node's disk): a run directory /runs/a is read there as $OPGUARD_NODE_ROOT/runs/a.
NODE_ROOT_ENV = "OPGUARD_NODE_ROOT"
DATA_FILE = "data.mdb"  # an LMDB environment's one data file: the trace's bytes


def on_this_node(path: str) -> Path:
    """Where this node reads run directory ``path`` (an absolute path, as the training wrote
    it): under :data:`NODE_ROOT_ENV` where that is set."""
    root = os.environ.get(NODE_ROOT_ENV)
    return Path(root) / path.lstrip(os.sep) if root else Path(path)


def trace_bytes(run_dir: Path, rank: int) -> int:
    """The size of rank ``rank``'s trace in ``run_dir`` (0 when it has no data file)."""
    try:
        return (run_dir / schema.rank_dir_name(rank) / DATA_FILE).stat().st_size
    except OSError:
        return 0


@dataclass(frozen=True)
class RunHolding:
    """One run as one node holds it: its ranks (each with its trace's size in bytes), its
    metadata where this node holds ``meta.json``, and why that could not be read."""

    ranks: dict[int, int] = field(default_factory=dict)
    meta: dict[str, Any] | None = None
    problem: str | None = None


@dataclass(frozen=True)
class NodeHolding:
    """What one node holds of each run asked about, and the OpGuard it runs."""

    node: str  # the Ray node's id
    version: str
    runs: tuple[RunHolding, ...]


def run_holding(path: str) -> RunHolding:
    """What this node holds of run directory ``path``."""
    local = on_this_node(path)
    if not local.is_dir():
        return RunHolding()
    ranks = {k: trace_bytes(local, k) for k in rank_numbers(local)}
    if not (local / schema.META_FILE).exists():
        return RunHolding(ranks)
    try:
        return RunHolding(ranks, read_meta(local))
    except TraceError as exc:
        return RunHolding(ranks, problem=str(exc))
