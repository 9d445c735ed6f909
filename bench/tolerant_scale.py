"""What ``opguard diff --tolerant`` costs where it costs most: two runs that differ by rounding at
every op (a cross-version pair), so every aligned pair is decoded and judged. Times the bitwise
diff (which decodes only the first difference) and the tolerant diff of the same traces, in
this process, and checks the tolerant verdict is ``within-rounding``.

Each run is a chain of ``--ops`` ops in ``--steps`` steps, one float32 input and one output of
4,096 elements each, every entry with a fingerprint and a sketch (run B's buckets moved by about
one float32 rounding of the norm).

    python bench/tolerant_scale.py [--ops 100000] [--steps 10]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from opguard.analysis import diff_runs
from opguard.analysis.tolerant.rule import Tolerance
from opguard.store import Run, sketch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # the trace builder
from traces import TraceBuilder, tensor

NAMES = ("aten::mm.default", "aten::gelu.default", "aten::add.Tensor", "aten::mul.Tensor")


def write(path: Path, ops: int, steps: int, noise: float, seed: int) -> None:
    """A chain of ``ops`` ops; ``noise``: run B's buckets' relative perturbation."""
    rng = np.random.default_rng(seed)
    base = np.random.default_rng(0)
    per_step = ops // steps
    with TraceBuilder(path) as run:
        previous: dict[str, object] | None = None
        for index in range(ops):
            norm = 64.0
            buckets = base.standard_normal(sketch.BUCKETS) * norm / 4
            moved = buckets + noise * norm * rng.standard_normal(sketch.BUCKETS) / 4
            out = tensor("0", index * 2 + seed, shape=(4096,), w=sketch.encode(norm, list(moved)))
            inputs = [] if previous is None else [{**previous, "n": "self", "p": [index - 1, 0]}]
            run.op(NAMES[index % len(NAMES)], inputs, [out], step=index // per_step)
            previous = out


def timed(paths: tuple[Path, Path], tolerance: Tolerance | None) -> tuple[str, float]:
    start = time.perf_counter()
    with Run(paths[0]) as a, Run(paths[1]) as b:
        verdict = diff_runs(a, b, tolerance=tolerance).verdict
    return verdict, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", type=int, default=100_000)
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        paths = (Path(tmp) / "a", Path(tmp) / "b")
        write(paths[0], args.ops, args.steps, 0.0, 0)
        write(paths[1], args.ops, args.steps, 2.0**-24, 1)
        bitwise, t_bitwise = timed(paths, None)
        tolerant, t_tolerant = timed(paths, Tolerance())
    print(f"{args.ops:,} ops a side, every aligned pair differing")
    print(f"  bitwise:  {bitwise:16s} {t_bitwise:6.2f} s")
    print(
        f"  tolerant: {tolerant:16s} {t_tolerant:6.2f} s ({t_tolerant / args.ops * 1e6:.1f} µs/op)"
    )
    assert tolerant == "within-rounding", tolerant


if __name__ == "__main__":
    main()
