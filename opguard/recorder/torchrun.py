"""``opguard record -o RUN -- torchrun … train.py``: every worker of a torchrun job records.

The parent (``opguard record``) prepares the run directory once and writes ``meta.json``;
torchrun then starts each worker as ``python -m opguard.recorder.launch -o RUN -- train.py …``
with ``OPGUARD_RUN_PREPARED=1``, so each worker records into ``rank-K`` (``K`` = its ``RANK``)
without touching the directory or the metadata. When torchrun returns, the parent completes the
metadata from what the ranks wrote (world size, ranks, backend, devices).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from ..record_options import RecordOptions
from ..store import Run, TraceError
from ..store.meta import read_meta, write_meta
from .ranks import PREPARED_ENV
from .session import RecordingSession, prepare_run_dir

TORCHRUN_MODULE = "torch.distributed.run"


@dataclass(frozen=True)
class TorchrunJob:
    """torchrun's own options, and the script (or module) it starts on every worker."""

    options: list[str]
    script: str
    script_args: list[str]
    is_module: bool
    world_size: int | None  # nnodes × nproc-per-node, when both are plain numbers


def torchrun_argv(target_args: list[str], module: str | None) -> list[str] | None:
    """torchrun's argv when the target is ``torchrun …`` or ``-m torch.distributed.run …``."""
    if module == TORCHRUN_MODULE:
        return target_args
    if module is None and target_args and os.path.basename(target_args[0]) == "torchrun":
        return target_args[1:]
    return None


def parse_job(argv: list[str]) -> TorchrunJob:
    """Splits torchrun's argv with torchrun's own parser (so every option spelling works)."""
    from torch.distributed.run import get_args_parser

    try:
        parsed = get_args_parser().parse_args(argv)
    except SystemExit:
        raise TraceError(f"torchrun could not parse its arguments: {' '.join(argv)}") from None
    if parsed.no_python:
        raise TraceError("torchrun --no-python runs no Python: OpGuard cannot record it")
    tail = 1 + len(parsed.training_script_args)
    options = [o for o in argv[: len(argv) - tail] if o not in ("-m", "--module")]
    try:
        nodes = int(parsed.nnodes)
        world_size: int | None = nodes * int(parsed.nproc_per_node)
    except ValueError:
        world_size = None  # elastic ranges or "auto": the ranks say it when they finish
    return TorchrunJob(
        options,
        parsed.training_script,
        list(parsed.training_script_args),
        parsed.module,
        world_size,
    )


def run_torchrun(
    job: TorchrunJob, run_dir: Path, options: RecordOptions, command: list[str]
) -> int:
    """Runs the job with every worker recording; returns torchrun's exit status."""
    prepare_run_dir(run_dir, options.overwrite)
    prepared = replace(options, overwrite=False)  # from here on, nothing may replace the directory
    meta = RecordingSession(
        run_dir, command=command, rank=0, **prepared.session_arguments()
    )._initial_meta()
    meta.update(world_size=job.world_size, launcher="torchrun")
    write_meta(run_dir, meta)
    worker = ["-m", "opguard.recorder.launch", "-o", str(run_dir), *prepared.switches()]
    worker += ["-m", job.script] if job.is_module else ["--", job.script]
    argv = [sys.executable, "-m", TORCHRUN_MODULE, *job.options, *worker, *job.script_args]
    code = subprocess.run(argv, env={**os.environ, PREPARED_ENV: "1"}).returncode
    write_meta(run_dir, {**read_meta(run_dir), **_outcome(run_dir, code)})
    return code


def _outcome(run_dir: Path, code: int) -> dict[str, Any]:
    """What the ranks recorded, summed up for ``meta.json``."""
    ranks: list[dict[str, Any]] = []
    with Run(run_dir) as run:
        for k in run.ranks:
            info = run.rank(k).info
            start, end = info.get("start", {}), info.get("end", {})
            ranks.append(
                {
                    "rank": k,
                    "status": end.get("status", "unfinished"),
                    "ops": end.get("ops"),
                    "steps": end.get("steps"),
                    "devices": start.get("devices"),
                    "host": start.get("host"),  # the node that wrote it
                    **(info.get("distributed") or {}),
                }
            )
    backends = sorted({r["backend"] for r in ranks if r.get("backend")})
    world = next((r["world_size"] for r in ranks if r.get("world_size")), None)
    return {
        "status": "finished" if code == 0 else "failed",
        "exit_code": code,
        "ended": time.time(),
        "ops": sum(r["ops"] or 0 for r in ranks),
        "steps": max((r["steps"] or 0 for r in ranks), default=0),
        "ranks": ranks,
        "backend": backends[0] if len(backends) == 1 else backends or None,
        **({"world_size": world} if world else {}),
    }
