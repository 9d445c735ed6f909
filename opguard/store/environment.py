"""What a run's environment holds (the builds, hardware and settings that change an op's
numerics), and how to read it back from any trace, old or new.

The recorder writes it into each rank's trace header (``info["environment"]``, that process's
own view) and into the owner's ``meta.json`` (``environment``): once at session start, and
again, complete, when recording ends (scripts set TF32 or deterministic algorithms after
recording started; the packages that own recorded call sites are known only then). Traces
written before it existed have ``torch``, ``cuda``, ``devices`` and ``env`` in ``meta.json``;
:func:`environment_of` reads those too, so old traces compare as far as they can.

Read back, an environment is a flat dict: a field absent is unknown (never compared); a field
present with ``None`` is known to be unset or unavailable.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

KEY = "environment"  # in meta.json and in a trace's info database
PACKAGES = "packages"  # {distribution: {"version": str, "paths": [directory, ...]}}
ENV_PREFIX = "env."  # environment variables, flattened: env.OMP_NUM_THREADS

# Which ops a field can change: every op, ops on the CPU, ops on a GPU, or collectives.
ANY, CPU, CUDA, COLLECTIVE = "any", "cpu", "cuda", "collective"
# What a field is: another build or library, other hardware, or another setting.
BUILD, HARDWARE, SETTING = "build", "hardware", "setting"


@dataclass(frozen=True, slots=True)
class Field:
    key: str
    label: str  # a plural noun phrase: "different {label} (A vs B)"
    scope: str  # ANY | CPU | CUDA | COLLECTIVE
    kind: str  # BUILD | HARDWARE | SETTING
    refines: str | None = None  # a field that, when it differs, already says this one does


FIELDS = (
    Field("torch", "torch builds", ANY, BUILD),
    Field("torch_git", "torch commits", ANY, BUILD, refines="torch"),
    Field("cuda", "CUDA versions", CUDA, BUILD),
    Field("cudnn", "cuDNN versions", CUDA, BUILD),
    Field("cublas", "cuBLAS versions", CUDA, BUILD),
    Field("nccl", "NCCL versions", COLLECTIVE, BUILD),
    Field("gpus", "GPU models", CUDA, HARDWARE),
    Field("cpu", "CPU models", CPU, HARDWARE),
    Field("cpu_capability", "CPU capability", CPU, HARDWARE),
    Field("threads", "intra-op threads", CPU, SETTING),
    Field("deterministic_algorithms", "deterministic algorithms", ANY, SETTING),
    Field("float32_matmul_precision", "float32 matmul precision", ANY, SETTING),
    Field("cuda_matmul_tf32", "TF32 in cuBLAS matmuls", CUDA, SETTING),
    Field("cudnn_tf32", "TF32 in cuDNN", CUDA, SETTING),
    Field("cudnn_deterministic", "cuDNN deterministic mode", CUDA, SETTING),
    Field("cudnn_benchmark", "cuDNN benchmark mode", CUDA, SETTING),
    Field("cuda_fp16_reduced_reduction", "reduced-precision fp16 matmul reductions", CUDA, SETTING),
    Field("cuda_bf16_reduced_reduction", "reduced-precision bf16 matmul reductions", CUDA, SETTING),
)

# The recorded environment variables (store.meta.NUMERICS_ENV) that change how an op computes,
# and which ops they change; the others recorded there (CUDA_VISIBLE_DEVICES, PYTHONHASHSEED)
# change placement or Python, not an op given its inputs.
ENV_SCOPES = {
    "OMP_NUM_THREADS": CPU,
    "MKL_NUM_THREADS": CPU,
    "MKL_CBWR": CPU,
    "ATEN_CPU_CAPABILITY": CPU,
    "DNNL_MAX_CPU_ISA": CPU,
    "ONEDNN_MAX_CPU_ISA": CPU,
    "CUBLAS_WORKSPACE_CONFIG": CUDA,
    "CUBLASLT_WORKSPACE_SIZE": CUDA,
    "NVIDIA_TF32_OVERRIDE": CUDA,
    "TORCH_ALLOW_TF32_CUBLAS_OVERRIDE": CUDA,
    "TORCH_BLAS_PREFER_CUBLASLT": CUDA,
    "CUDA_LAUNCH_BLOCKING": CUDA,
    "NCCL_ALGO": COLLECTIVE,
    "NCCL_PROTO": COLLECTIVE,
}

_GPU_PREFIX = "cuda:"  # meta.json "devices" entries: "cuda:0: NVIDIA H200"


@dataclass(frozen=True, slots=True)
class Environment:
    """One rank's environment as read back: ``fields`` (absent: unknown); ``recorded``: whether
    the trace recorded it (else only what older traces kept in ``meta.json`` is known)."""

    fields: dict[str, Any]
    recorded: bool


def environment_of(meta: dict[str, Any], info: dict[str, Any] | None = None) -> Environment:
    """The environment of one rank: its trace header's, over its run's ``meta.json``, over the
    fields older traces kept in ``meta.json``."""
    found: dict[str, Any] = {}
    if isinstance(meta.get("torch"), str):
        found["torch"] = meta["torch"]
    if "cuda" in meta:
        found["cuda"] = meta["cuda"]
    gpus = _gpus(meta.get("devices"))
    if gpus:
        found["gpus"] = gpus
    # Older traces list the variables that were set; one that was not is unknown there.
    env = meta.get("env")
    if isinstance(env, dict):
        found.update({ENV_PREFIX + k: v for k, v in env.items() if k in ENV_SCOPES})
    recorded = [e for e in (meta.get(KEY), (info or {}).get(KEY)) if isinstance(e, dict)]
    for environment in recorded:
        found.update(_flat(environment))
    return Environment(found, bool(recorded))


def _flat(recorded: dict[str, Any]) -> dict[str, Any]:
    flat = {k: v for k, v in recorded.items() if k != "env"}
    env = recorded.get("env")
    if isinstance(env, dict):  # every variable asked about: None when it was unset
        flat.update({ENV_PREFIX + k: v for k, v in env.items()})
    return flat


def _gpus(devices: Any) -> list[str]:
    if not isinstance(devices, list):
        return []
    return [
        d.split(": ", 1)[1]
        for d in devices
        if isinstance(d, str) and d.startswith(_GPU_PREFIX) and ": " in d
    ]
