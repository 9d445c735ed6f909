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
# else is recorded, so secrets in the environment never reach a trace. Those that change the
# numbers are set again when a run is recorded anew (``opguard capture``); the job's own launch
# and allocator variables are not, since the new recording starts its own job.
NUMERICS_ENV = (
    "CUDA_VISIBLE_DEVICES",
    "CUBLAS_WORKSPACE_CONFIG",
    "CUBLASLT_WORKSPACE_SIZE",
    "NVIDIA_TF32_OVERRIDE",
    "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE",
    "TORCH_BLAS_PREFER_CUBLASLT",
    "CUDA_LAUNCH_BLOCKING",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "MKL_CBWR",
    "ATEN_CPU_CAPABILITY",
    "DNNL_MAX_CPU_ISA",
    "ONEDNN_MAX_CPU_ISA",
    "PYTHONHASHSEED",
    "NCCL_ALGO",
    "NCCL_PROTO",
)
JOB_ENV = (
    "PYTORCH_CUDA_ALLOC_CONF",
    "WORLD_SIZE",
    "RANK",
    "LOCAL_RANK",
    "MASTER_ADDR",
    "MASTER_PORT",
)
ENV_ALLOW_LIST = NUMERICS_ENV + JOB_ENV


def _strings(value: Any) -> bool:
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _text(value: Any) -> bool:
    return isinstance(value, str)


# The fields readers use, and what each must be when present (None is always allowed): a
# meta.json edited by hand or damaged is refused with the field's name, not met by a crash.
FIELD_CHECKS = {
    "command": _strings,
    "argv": _strings,
    "devices": _strings,
    "env": lambda v: isinstance(v, dict) and all(isinstance(x, str) for x in v.values()),
    "environment": lambda v: isinstance(v, dict),  # store.environment
    "status": _text,
    "error": _text,
    "stopped": _text,
    "recorder_failure": _text,
    "cwd": _text,
    "host": _text,
    "python": _text,
    "torch": _text,
    "cuda": _text,
    "started": _number,
    "ended": _number,
    "exit_code": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "steps": lambda v: isinstance(v, int) and not isinstance(v, bool),
    "world_size": lambda v: isinstance(v, int) and not isinstance(v, bool),
}


def recorded_environment() -> dict[str, str]:
    return {k: os.environ[k] for k in ENV_ALLOW_LIST if k in os.environ}


def numerics_environment() -> dict[str, str | None]:
    """Every variable that changes numerics, ``None`` when unset: unlike ``env`` (the variables
    that were set), it says which were not."""
    return {k: os.environ.get(k) for k in NUMERICS_ENV}


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
    for name, check in FIELD_CHECKS.items():
        if meta.get(name) is not None and not check(meta[name]):
            raise TraceError(f"{path}: damaged run metadata (field {name!r})")
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
