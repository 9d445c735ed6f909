"""Where a recorded forward pass's host time goes on this machine.

The GPT-2 124M step of ``bench/overhead.py`` at a small batch (1 x 128 by default), so that the
host, not the GPU, bounds every op: the forward pass's host time (until the model returns) is
then the host cost of its ops. It is timed plain, under a pass-through dispatch mode, under
``opguard.record``, and under ``opguard.record`` without CUPTI's kernel collection
(``OPGUARD_KERNELS=0``), alternating in rounds; medians over the steps of each. The recorder's
cost per op is the recorded time less the pass-through's, per op; a part's is the recorded time
less the time without it.

The rest of a recorded op (its walks, call site and record) is one native call
(``csrc/call_recorder.h``), which cannot be taken apart from Python; docs/PERFORMANCE.md says
how its sections were timed.

    python bench/host_parts.py [--rounds 3] [--steps 6] [--batch 1] [--seq 128]
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import tempfile
import time
from collections.abc import Callable

import torch
from overhead import Passthrough, build, kernels_off

import opguard

# The recorder with one part switched off: (name, context that switches it off)
WITHOUT: dict[str, Callable[[], contextlib.AbstractContextManager]] = {"kernels": kernels_off}


class CountingPassthrough(Passthrough):
    """Counts the ops dispatched until ``stop()``."""

    def __init__(self) -> None:
        super().__init__()
        self.count = 0
        self.counting = True

    def stop(self) -> None:
        self.counting = False

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.count += self.counting
        return super().__torch_dispatch__(func, types, args, kwargs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=6, help="timed steps per mode per round")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--seq", type=int, default=128)
    args = parser.parse_args()

    step, _ = build(args.batch, args.seq)
    forward_ms: list[float] = []

    def timed_steps(count: int, recorded: bool = False) -> None:
        for _ in range(count):
            started = time.perf_counter()

            def mark(phase: str, started: float = started) -> None:
                if phase == "forward":
                    forward_ms.append((time.perf_counter() - started) * 1e3)

            step(mark)
            torch.cuda.synchronize()
            if recorded:
                opguard.step()

    counter = CountingPassthrough()
    with counter:
        step(lambda phase: counter.stop() if phase == "forward" else None)
    ops = counter.count

    results: dict[str, list[float]] = {}
    modes = ["plain", "pass-through", "recorded", *(f"without {part}" for part in WITHOUT)]
    with tempfile.TemporaryDirectory() as scratch:
        timed_steps(3)  # warm-up: CUDA context, kernels, allocator
        for round_ in range(args.rounds):
            for name in modes:
                forward_ms.clear()
                if name in ("plain", "pass-through"):
                    with contextlib.nullcontext() if name == "plain" else Passthrough():
                        timed_steps(2 + args.steps)
                else:
                    part = name.removeprefix("without ")
                    off = WITHOUT[part]() if part in WITHOUT else contextlib.nullcontext()
                    with off, opguard.record(f"{scratch}/{name}-{round_}"):
                        timed_steps(2 + args.steps, recorded=True)
                results.setdefault(name, []).extend(forward_ms[2:])

    base = statistics.median(results["pass-through"])
    recorded = statistics.median(results["recorded"])
    print(
        f"GPT-2 124M forward pass, batch {args.batch} x {args.seq}, {ops} ops: host time "
        f"(median of {args.rounds * args.steps} steps each)"
    )
    print(f"{'mode':24s} {'host':>9s} {'per op over pass-through':>26s} {'part':>12s}")
    for name in modes:
        median = statistics.median(results[name])
        over = (median - base) / ops * 1e3
        part = f"{(recorded - median) / ops * 1e3:8.1f} us" if name.startswith("without") else ""
        print(f"{name:24s} {median:6.1f} ms {over:20.1f} us {part:>12s}")


if __name__ == "__main__":
    main()
