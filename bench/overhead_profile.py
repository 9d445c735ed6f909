"""Where the host time of a recorded GPU training step goes, for the GPT-2 step of
``bench/overhead.py``: CPU time per step of each thread of the process (the training thread,
autograd's device threads, OpGuard's trace writer), then the recorded steps under cProfile, top
functions by own time (Python 3.12's cProfile sees every thread); then, with ``--gpu``, the
GPU time of the recorded steps by kernel from torch.profiler (OpGuard's own kernel collection
off, since both use CUPTI): how much of the device's time the fingerprint kernels take.

cProfile slows Python code several-fold, so read its shares, not its absolute times.

    python bench/overhead_profile.py [--steps 3] [--top 25] [--batch 8] [--seq 1024]
"""

from __future__ import annotations

import argparse
import cProfile
import os
import pstats
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import torch
from overhead import build

import opguard


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--gpu", action="store_true", help="also GPU time by kernel")
    args = parser.parse_args()

    step, _ = build(args.batch, args.seq)
    step()  # warm-up outside the recording
    if args.gpu:  # first: CUPTI allows one subscriber, and kernel collection would be it
        gpu_time_by_kernel(step, args.steps, args.top)
        return
    host_costs()
    with tempfile.TemporaryDirectory() as workdir, opguard.record(Path(workdir) / "run") as run:
        step()
        torch.cuda.synchronize()
        before = thread_cpu_seconds()
        for _ in range(args.steps):
            step()
        torch.cuda.synchronize()
        after = thread_cpu_seconds()
        names = {
            threading.main_thread().native_id: "training (main)",
            run.writer._thread.native_id: "opguard writer",
        }
        print("CPU ms per recorded step, by thread:")
        used = {tid: after[tid][1] - before.get(tid, ("", 0.0))[1] for tid in after}
        for tid, seconds in sorted(used.items(), key=lambda item: -item[1])[:8]:
            name = names.get(tid, after[tid][0])
            print(f"  {name:<24} {seconds / args.steps * 1e3:8.1f}")
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(args.steps):
            step()
        torch.cuda.synchronize()
        profile.disable()
    pstats.Stats(profile).sort_stats("tottime").print_stats(args.top)


def gpu_time_by_kernel(step: Callable[[], float], steps: int, top: int) -> None:
    from torch.profiler import ProfilerActivity, profile

    os.environ["OPGUARD_KERNELS"] = "0"
    with tempfile.TemporaryDirectory() as workdir, opguard.record(Path(workdir) / "run"):
        step()
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            for _ in range(steps):
                step()
            torch.cuda.synchronize()
    kernels = [e for e in prof.key_averages() if e.device_time_total > 0]
    total = sum(e.device_time_total for e in kernels)
    print(f"GPU kernel time per recorded step: {total / steps / 1e3:.1f} ms")
    for e in sorted(kernels, key=lambda e: -e.device_time_total)[:top]:
        print(f"  {e.device_time_total / steps / 1e3:8.2f} ms {e.count // steps:6d}x  {e.key[:90]}")


def host_costs() -> None:
    """Host microseconds per call of the recorder's native GPU steps, next to a torch launch."""
    from opguard.recorder.tensors import fingerprint_fields, resolve_all

    def per_call(fn: Callable[[], object], n: int = 2000) -> float:
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        elapsed = time.perf_counter() - t0
        torch.cuda.synchronize()
        return elapsed / n * 1e6

    print("host µs per call:")
    for label, numel in (("4 KiB", 1 << 10), ("24 MiB", 6 << 20)):
        t = torch.randn(numel, device="cuda")
        pending: list = []
        launch = per_call(lambda t=t: t.add_(0))
        fingerprint = per_call(lambda t=t, pending=pending: pending.append(fingerprint_fields(t)))
        t0 = time.perf_counter()
        resolve_all(pending)
        resolve = (time.perf_counter() - t0) / len(pending) * 1e6
        print(f"  torch add_ (one launch)    {label:<7} {launch:8.2f}")
        print(f"  fingerprint_fields         {label:<7} {fingerprint:8.2f}")
        print(f"  resolve_all, per tensor    {label:<7} {resolve:8.2f}")
    stream = torch._C._cuda_getCurrentRawStream
    print(f"  _cuda_getCurrentRawStream         {per_call(lambda: stream(0)):8.2f}")


def thread_cpu_seconds() -> dict[int, tuple[str, float]]:
    """(name, user + system CPU seconds) of every thread of this process, from /proc."""
    ticks = os.sysconf("SC_CLK_TCK")
    out = {}
    for task in Path("/proc/self/task").iterdir():
        try:
            name = (task / "comm").read_text().strip()
            fields = (task / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # the thread ended meanwhile
            continue
        out[int(task.name)] = (name, (int(fields[11]) + int(fields[12])) / ticks)
    return out


if __name__ == "__main__":
    main()
