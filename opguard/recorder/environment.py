"""The environment a run computed in (see :mod:`opguard.store.environment` for what each field
means and how the diff reads it): torch's build, the libraries it uses, the device and CPU, and
the settings and variables that change numerics. Read once when recording starts and again when
it ends; reading touches nothing the training uses and never fails the recording (a field that
cannot be read is left out).
"""

from __future__ import annotations

import contextlib
import importlib.metadata
import os
import platform
import sys
import warnings
from collections.abc import Callable, Iterable, Mapping
from typing import Any

import torch

from ..store.environment import PACKAGES
from ..store.meta import numerics_environment
from .callsite import site_packages

# Libraries whose version matters whenever a run imported them, call sites or not: they bring
# their own kernels or choose which of torch's a model runs.
MAIN_LIBRARIES = (
    "transformers",
    "accelerate",
    "peft",
    "timm",
    "diffusers",
    "deepspeed",
    "megatron",
    "apex",
    "flash_attn",
    "xformers",
    "triton",
    "numpy",
)
# The wheels cuBLAS comes in (torch does not report the version it loaded).
CUBLAS_DISTRIBUTIONS = ("nvidia-cublas", "nvidia-cublas-cu13", "nvidia-cublas-cu12")


def _cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo`` on Linux), else what ``platform`` knows."""
    with contextlib.suppress(OSError), open("/proc/cpuinfo") as cpuinfo:
        for line in cpuinfo:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def _deterministic() -> str:
    if not torch.are_deterministic_algorithms_enabled():
        return "off"
    return "warn only" if torch.is_deterministic_algorithms_warn_only_enabled() else "on"


def _cudnn() -> int | None:
    return torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None


def _nccl() -> str | None:
    if not torch.cuda.is_available() or not torch.distributed.is_nccl_available():
        return None
    from torch.cuda import nccl

    version = nccl.version()
    return ".".join(map(str, version)) if isinstance(version, tuple) else str(version)


def _cublas() -> str | None:
    for name in CUBLAS_DISTRIBUTIONS:
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            return f"{importlib.metadata.version(name)} ({name})"
    return None


def _gpus() -> list[str]:
    if not torch.cuda.is_available():
        return []
    return [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]


# Each field (store.environment.FIELDS) and how to read it now.
READERS: dict[str, Callable[[], Any]] = {
    "torch": lambda: torch.__version__,
    "torch_git": lambda: torch.version.git_version,
    "cuda": lambda: torch.version.cuda,
    "cudnn": _cudnn,
    "cublas": _cublas,
    "nccl": _nccl,
    "gpus": _gpus,
    "cpu": _cpu_model,
    "cpu_capability": lambda: torch.backends.cpu.get_cpu_capability(),
    "threads": torch.get_num_threads,
    "deterministic_algorithms": _deterministic,
    "float32_matmul_precision": torch.get_float32_matmul_precision,
    "cuda_matmul_tf32": lambda: torch.backends.cuda.matmul.allow_tf32,
    "cudnn_tf32": lambda: torch.backends.cudnn.allow_tf32,
    "cudnn_deterministic": lambda: torch.backends.cudnn.deterministic,
    "cudnn_benchmark": lambda: torch.backends.cudnn.benchmark,
    "cuda_fp16_reduced_reduction": (
        lambda: torch.backends.cuda.matmul.allow_fp16_reduced_precision_reduction
    ),
    "cuda_bf16_reduced_reduction": (
        lambda: torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction
    ),
}


def environment(call_site_files: Iterable[str] | None = None) -> dict[str, Any]:
    """The environment now; given the files of the recorded call sites (at the end of a
    recording), also the versions of the packages that own them and of the main libraries
    imported."""
    found: dict[str, Any] = {}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a setting's getter deprecated in some torch version
        for key, read in READERS.items():
            try:
                found[key] = read()
            except Exception:  # a field this torch cannot give is left out
                continue
    found["env"] = numerics_environment()
    if call_site_files is not None:
        with contextlib.suppress(Exception):
            found[PACKAGES] = packages(call_site_files)
    return found


def packages(files: Iterable[str]) -> dict[str, dict[str, Any]]:
    """``{distribution: {"version", "paths"}}`` for the installed packages that hold one of
    ``files`` (its top-level directory or module under site-packages, as the file names it and
    resolved) and for the main libraries this process imported."""
    roots = sorted(site_packages(), key=len, reverse=True)  # the innermost first
    tops: dict[str, set[str]] = {}  # top-level import name -> its paths
    for file in files:
        real = os.path.realpath(file) if os.path.isabs(file) else file
        root = next((r for r in roots if real.startswith(r)), None)
        if root is None:
            continue
        inside = real[len(root) :]
        top = inside.split(os.sep, 1)[0]
        paths = tops.setdefault(top.removesuffix(".py"), set())
        paths.add(root + top)
        if file.endswith(inside):  # the file's own spelling, through links
            paths.add(file[: len(file) - len(inside)] + top)
    for name in MAIN_LIBRARIES:
        module = sys.modules.get(name)
        location = getattr(module, "__file__", None) if module is not None else None
        if location and name not in tops:
            tops[name] = {os.path.dirname(location), os.path.dirname(os.path.realpath(location))}
    found: dict[str, dict[str, Any]] = {}
    owners: Mapping[str, list[str]] | None = None
    for top, paths in sorted(tops.items()):
        names = [top]
        if not _installed(top):
            if owners is None:  # reads every installed distribution: only when needed
                owners = importlib.metadata.packages_distributions()
            names = owners.get(top, [])
        for name in names:
            with contextlib.suppress(importlib.metadata.PackageNotFoundError):
                entry = found.setdefault(
                    name, {"version": importlib.metadata.version(name), "paths": []}
                )
                entry["paths"] = sorted({*entry["paths"], *paths})
    return found


def _installed(name: str) -> bool:
    try:
        importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        return False
    return True
