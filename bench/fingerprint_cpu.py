"""Throughput of OpGuard's native CPU fingerprint on one core, next to a memory copy.

For 64 MiB tensors (contiguous float32, bfloat16, int64, and a transposed float32 view) it times

* ``fingerprint``: ``opguard.recorder.tensors.fingerprint_fields`` (hash + stats + head bytes),
  what the recorder does per tensor;
* ``hash only``: the same native call with the opaque kind (the hash without the stats pass);
* ``clone``: ``torch.Tensor.clone()`` (for the transposed view, clone keeps its strides, so it is
  a straight memory copy; ``contiguous`` is the strided gather into row-major order);
* ``hash_tensor``: ``torch.hash_tensor`` (XOR of the elements upcast to 64 bits), if available.

Each figure is the median of RUNS timed runs after one warm-up, in GB/s of the tensor's bytes
(10^9 bytes per second) with the median time in milliseconds. Run: ``python bench/fingerprint_cpu.py``.
"""

from __future__ import annotations

import platform
import statistics
import time
from collections.abc import Callable

import torch

from opguard import _C
from opguard.recorder.tensors import HEAD_ELEMENTS, fingerprint_fields

RUNS = 7
NBYTES = 64 << 20  # 64 MiB


def median_seconds(fn: Callable[[], object], runs: int = RUNS) -> float:
    fn()  # warm-up: page faults, caches, lazy initialisation
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def hash_only(t: torch.Tensor) -> Callable[[], object]:
    """The native call with kind 0 (opaque): hash and head bytes, no stats."""
    return lambda: _C.fingerprint(
        t.data_ptr(), t.element_size(), t.shape, t.stride(), 0, HEAD_ELEMENTS
    )


def make_tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    side = int((NBYTES // 4) ** 0.5)  # 4096 x 4096 float32 = 64 MiB
    return {
        "float32 contiguous": torch.randn(NBYTES // 4, generator=g, dtype=torch.float32),
        "bfloat16 contiguous": torch.randn(NBYTES // 2, generator=g).to(torch.bfloat16),
        "int64 contiguous": torch.randint(
            -(2**62), 2**62, (NBYTES // 8,), generator=g, dtype=torch.int64
        ),
        "float32 transposed": torch.randn(side, side, generator=g, dtype=torch.float32).t(),
    }


def main() -> None:
    torch.set_num_threads(1)
    tensors = make_tensors()
    has_hash_tensor = hasattr(torch, "hash_tensor")
    columns = ["fingerprint", "hash only", "clone", "contiguous", "hash_tensor"]
    print(
        f"torch {torch.__version__}, {platform.processor() or platform.machine()}, "
        f"threads={torch.get_num_threads()}, {NBYTES >> 20} MiB per tensor, median of {RUNS}"
    )
    print(f"{'tensor':<22}" + "".join(f"{c:>20}" for c in columns))
    for name, t in tensors.items():
        assert t.numel() * t.element_size() == NBYTES
        fns: dict[str, Callable[[], object] | None] = {
            "fingerprint": lambda t=t: fingerprint_fields(t),
            "hash only": hash_only(t),
            "clone": lambda t=t: t.clone(),
            "contiguous": (lambda t=t: t.contiguous()) if not t.is_contiguous() else None,
            "hash_tensor": (lambda t=t: torch.hash_tensor(t)) if has_hash_tensor else None,
        }
        cells = []
        for column in columns:
            fn = fns[column]
            if fn is None:
                cells.append("-")
                continue
            try:
                seconds = median_seconds(fn)
            except (RuntimeError, NotImplementedError) as exc:  # e.g. dtype unsupported
                cells.append(f"n/a ({type(exc).__name__})")
                continue
            cells.append(f"{NBYTES / seconds / 1e9:6.2f} GB/s {seconds * 1e3:6.1f}ms")
        print(f"{name:<22}" + "".join(f"{c:>20}" for c in cells))


if __name__ == "__main__":
    main()
