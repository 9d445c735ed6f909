"""``RUN_DIR/meta.json``: what was run, where, with what, and how it ended.

JSON rather than LMDB so a person can read it with ``cat``; written atomically (temporary
file + rename) so a reader never sees half of it.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from . import schema
from .errors import TraceError

# Environment variables worth keeping with a run: they change numerics or placement. Nothing
# else is recorded, so secrets in the environment never reach a trace.
ENV_ALLOW_LIST = (
    "CUDA_VISIBLE_DEVICES",
    "CUBLAS_WORKSPACE_CONFIG",
    "NVIDIA_TF32_OVERRIDE",
    "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE",
    "PYTORCH_CUDA_ALLOC_CONF",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "PYTHONHASHSEED",
    "WORLD_SIZE",
    "RANK",
    "LOCAL_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
    "NCCL_ALGO",
    "NCCL_PROTO",
)


def recorded_environment() -> dict[str, str]:
    return {k: os.environ[k] for k in ENV_ALLOW_LIST if k in os.environ}


def write_meta(run_dir: Path, meta: dict[str, Any]) -> None:
    path = run_dir / schema.META_FILE
    tmp = path.with_name(f".{schema.META_FILE}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(meta, indent=2, sort_keys=True, default=str))
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)  # the old meta.json stays whole
        raise


def read_meta(run_dir: Path) -> dict[str, Any]:
    path = run_dir / schema.META_FILE
    try:
        meta = json.loads(path.read_text())
    except FileNotFoundError:
        raise TraceError(f"{run_dir}: not an OpGuard run (no {schema.META_FILE})") from None
    except (OSError, ValueError) as exc:
        raise TraceError(f"{path}: unreadable run metadata ({exc})") from None
    if not isinstance(meta, dict):
        raise TraceError(f"{path}: unreadable run metadata (not an object)")
    check_schema(meta.get("schema"), run_dir)
    return meta


def check_schema(version: Any, where: Path) -> None:
    """Refuses a trace this version of OpGuard cannot read, saying why."""
    if not isinstance(version, int) or isinstance(version, bool) or version < 1:
        raise TraceError(f"{where}: not an OpGuard trace (no valid schema version)")
    if version > schema.SCHEMA_VERSION:
        raise TraceError(
            f"{where}: trace schema {version} is newer than this OpGuard reads "
            f"({schema.SCHEMA_VERSION}); upgrade opguard"
        )
