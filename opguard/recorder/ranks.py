"""Which rank a process records, and what it knows of the distributed job it belongs to.

Every process of a distributed run records into ``RUN_DIR/rank-K`` (``K`` from ``RANK``). The
run directory is prepared exactly once: by ``opguard record`` before it starts ``torchrun``
(the workers then find ``OPGUARD_RUN_PREPARED`` set), or, for processes the user starts
himself, by rank 0, which the other ranks wait for.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import torch

from ..store import TraceError
from ..store.meta import read_meta

PREPARED_ENV = "OPGUARD_RUN_PREPARED"  # set by the parent that prepared the run directory
WAIT_FOR_RANK0_S = 120.0
START_SKEW_S = 10.0  # how far apart the ranks of one job may start


def env_rank() -> int:
    return int(os.environ.get("RANK", "0"))


def prepared_by_parent() -> bool:
    return os.environ.get(PREPARED_ENV) == "1"


def wait_for_rank0(run_dir: Path, since: float) -> None:
    """Blocks until rank 0 has prepared ``run_dir`` for this run: its ``meta.json`` says
    "running" and started no earlier than this process (less a margin for ranks started a
    little apart), so a stale run that rank 0 is about to replace is not mistaken for it."""
    deadline = time.monotonic() + WAIT_FOR_RANK0_S
    while time.monotonic() < deadline:
        try:
            meta = read_meta(run_dir)
        except TraceError:
            meta = {}
        if meta.get("status") == "running" and meta.get("started", 0) >= since - START_SKEW_S:
            return
        time.sleep(0.05)
    raise TraceError(f"{run_dir}: rank 0 did not prepare the run directory in time")


def distributed_info() -> dict[str, Any] | None:
    """World size, rank, backend and device of an initialised default process group."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized()):
        return None
    backend = dist.get_backend()
    device = (
        f"cuda:{torch.cuda.current_device()}"
        if "nccl" in backend and torch.cuda.is_available()
        else "cpu"
    )
    return {
        "rank": dist.get_rank(),
        "world_size": dist.get_world_size(),
        "backend": backend,
        "device": device,
    }
