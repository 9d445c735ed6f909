"""What the sketch (field ``w``, ``opguard/store/sketch.py``) adds to the native CPU fingerprint.

For float32 and bfloat16 tensors of 1 to 64 MiB (contiguous, and a transposed float32 view) it
times the native fingerprint (``opguard._C.fingerprint``: hash, stats, head bytes) with the
sketch and with ``sketch=False``, side by side in one process, alternating the two so both see
the same caches and clocks, and prints the medians and their ratio (target: at most 1.3).

Run: ``python bench/sketch_cpu.py [--runs N]``.
"""

from __future__ import annotations

import argparse
import platform
import statistics
import time

import torch

from opguard import _C
from opguard.recorder.tensors import HEAD_ELEMENTS, _dtype_info

SIZES_MIB = (1, 4, 16, 64)


def tensors() -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    out: dict[str, torch.Tensor] = {}
    for mib in SIZES_MIB:
        n = (mib << 20) // 4
        out[f"float32 {mib} MiB"] = torch.randn(n, generator=g)
        out[f"bfloat16 {mib} MiB"] = torch.randn(2 * n, generator=g).to(torch.bfloat16)
    side = int(((64 << 20) // 4) ** 0.5)
    out["float32 64 MiB transposed"] = torch.randn(side, side, generator=g).t()
    return out


def seconds(t: torch.Tensor, sketch: bool) -> float:
    kind = _dtype_info(t.dtype)[1]
    start = time.perf_counter()
    _C.fingerprint(
        t.data_ptr(), t.element_size(), t.shape, t.stride(), kind, HEAD_ELEMENTS, sketch=sketch
    )
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=9, help="timed runs of each (median)")
    runs = parser.parse_args().runs
    print(
        f"torch {torch.__version__}, {platform.processor() or platform.machine()}, median of {runs}"
    )
    print(f"{'tensor':<28}{'with sketch':>14}{'without':>14}{'ratio':>8}")
    for name, t in tensors().items():
        seconds(t, True), seconds(t, False)  # warm-up: page faults, lazy initialisation
        with_sketch, without = [], []
        for _ in range(runs):
            with_sketch.append(seconds(t, True))
            without.append(seconds(t, False))
        a, b = statistics.median(with_sketch), statistics.median(without)
        print(f"{name:<28}{a * 1e3:11.2f} ms{b * 1e3:11.2f} ms{a / b:8.2f}")


if __name__ == "__main__":
    main()
