"""Where the host time of a recorded GPU training step goes, for the GPT-2 step of
``bench/overhead.py``:

1. CPU time per step of each thread of the process (the training thread, autograd's device
   thread, OpGuard's trace writer), from /proc: a step whose threads are busy for its whole
   length is host-bound;
2. wall time per step inside each part of the recorder reached from Python (the dispatch
   handler, the native per-op path, and the Python path's work before and after an op, for
   random ops, collectives and captures), measured by wrapping those functions with a timer;
   parts nest, so shares overlap. With ``--steps-only``, both for the step level alone
   (``opguard record --steps-only``), whose parts are the step recorder's hooks and the
   native calls that fingerprint each group of tensors;
3. with ``--gpu``, the GPU time of the recorded steps by kernel, from torch.profiler (OpGuard's
   own kernel collection off, since CUPTI takes one subscriber): the fingerprint kernels' share
   of the device;
4. with ``--phases``, plain and recorded side by side: when each phase of the step (forward,
   backward, optimizer) returns on the host and when the GPU finishes it, from the step's
   start. A phase whose GPU end follows its host end by little had the GPU waiting for the host.
   Also how long the trace writer spent committing to LMDB during each phase: each commit
   trades the GIL with the recording thread once per record. With ``--steps-only``, for the
   step level alone.

    python bench/overhead_profile.py [--steps 3] [--top 20] [--batch 8] [--seq 1024]
                                     [--gpu | --phases] [--bf16] [--compile] [--steps-only]

``--bf16``: the forward under bf16 autocast, ``--compile``: the model through ``torch.compile``
(bench/overhead.py's ``--bf16`` and ``--compile``; a warm-up step compiles it before anything is
timed).
"""

from __future__ import annotations

import argparse
import collections
import gc
import os
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from overhead import build

import opguard
from opguard import _C
from opguard.recorder import mode, step_records
from opguard.store.writer import TraceWriter

# (owner, function name) of the recorder parts timed (the default mode)
PARTS: list[tuple[Any, str]] = [
    (mode.OpRecorder, "__torch_dispatch__"),
    (_C.CallRecorder, "call"),  # the native per-op path: walks, op, call site, record
    (mode.OpRecorder, "_before"),  # the Python path: random ops, collectives, captures
    (mode.OpRecorder, "_after"),
    (_C.OpPlan, "inputs"),
    (_C.CallRecorder, "finish"),
]
# ... and with --steps-only: the step recorder's hooks, and the native call each makes per
# group of tensors (loss, gradients, parameters, optimizer states, buffers and RNG states)
STEP_PARTS: list[tuple[Any, str]] = [
    (step_records.StepRecorder, "loss"),
    (step_records.StepRecorder, "gradients"),
    (step_records.StepRecorder, "updated"),
    (step_records.StepRecorder, "end_step"),
    (step_records, "fingerprint_all"),
]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--top", type=int, default=20)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--gpu", action="store_true", help="GPU time by kernel instead")
    parser.add_argument("--phases", action="store_true", help="host and GPU time by phase")
    parser.add_argument("--bf16", action="store_true", help="the forward under bf16 autocast")
    parser.add_argument("--compile", action="store_true", help="torch.compile the model")
    parser.add_argument(
        "--steps-only", action="store_true", help="the step level alone, and its parts"
    )
    args = parser.parse_args()

    step, _ = build(args.batch, args.seq, compile=args.compile, bf16=args.bf16)
    step()  # warm-up outside the recording
    if args.gpu:
        gpu_time_by_kernel(step, args.steps, args.top)
    elif args.phases:
        time_by_phase(step, args.steps, args.steps_only)
    else:
        cpu_by_thread(step, args.steps, args.steps_only)
        time_by_part(step, args.steps, args.steps_only)


def recorded(
    step: Callable[[], float],
    steps: int,
    before: Callable[[], None],
    after: Callable[[], None] = lambda: None,
    steps_only: bool = False,
) -> tuple[Any, float]:
    """Records a warm-up step, then ``steps`` more between ``before()`` and ``after()`` (both
    called while the session, and so its writer thread, is alive): (the session, wall seconds
    per step). ``steps_only``: step-level records alone."""
    with (
        tempfile.TemporaryDirectory() as workdir,
        opguard.record(Path(workdir) / "run", steps_only=steps_only) as run,
    ):
        step()
        torch.cuda.synchronize()
        before()
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        torch.cuda.synchronize()
        wall = (time.perf_counter() - t0) / steps
        after()
        return run, wall


def cpu_by_thread(step: Callable[[], float], steps: int, steps_only: bool = False) -> None:
    before: dict[int, tuple[str, float]] = {}
    after: dict[int, tuple[str, float]] = {}
    collections_timed = GcTimer()
    run, wall = recorded(
        step,
        steps,
        lambda: (before.update(thread_cpu_seconds()), collections_timed.start()),
        lambda: (after.update(thread_cpu_seconds()), collections_timed.stop()),
        steps_only,
    )
    names = {
        threading.main_thread().native_id: "training (main)",
        run.writer._thread.native_id: "opguard writer",
    }
    print(f"recorded step {wall * 1e3:.1f} ms; CPU ms per step by thread:")
    used = {tid: after[tid][1] - before.get(tid, ("", 0.0))[1] for tid in after}
    for tid, seconds in sorted(used.items(), key=lambda item: -item[1])[:4]:
        print(f"  {names.get(tid, after[tid][0]):<24} {seconds / steps * 1e3:8.1f}")
    print("cyclic garbage collections per step (all threads):")
    for generation, (count, seconds) in enumerate(collections_timed.by_generation()):
        print(f"  generation {generation}: {count / steps:6.1f} × {seconds / steps * 1e3:8.1f} ms")


class GcTimer:
    """Counts the cyclic collector's runs and their time by generation, through
    ``gc.callbacks``: each collection stops the thread that triggered it."""

    def __init__(self) -> None:
        self._started: dict[int, float] = {}
        self._count = [0, 0, 0]
        self._seconds = [0.0, 0.0, 0.0]

    def _on_collection(self, phase: str, info: dict[str, Any]) -> None:
        generation = info["generation"]
        if phase == "start":
            self._started[generation] = time.perf_counter()
        elif generation in self._started:
            self._seconds[generation] += time.perf_counter() - self._started.pop(generation)
            self._count[generation] += 1

    def start(self) -> None:
        gc.callbacks.append(self._on_collection)

    def stop(self) -> None:
        gc.callbacks.remove(self._on_collection)

    def by_generation(self) -> list[tuple[int, float]]:
        return list(zip(self._count, self._seconds, strict=True))


def time_by_part(step: Callable[[], float], steps: int, steps_only: bool = False) -> None:
    """Wall time by part of the recorder (:data:`PARTS`, or with ``steps_only`` the step
    level's, :data:`STEP_PARTS`)."""
    total: dict[str, float] = collections.defaultdict(float)
    calls: collections.Counter[str] = collections.Counter()
    parts = STEP_PARTS if steps_only else PARTS
    originals = [(owner, name, getattr(owner, name)) for owner, name in parts]

    def timer(name: str, function: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            t0 = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                total[name] += time.perf_counter() - t0
                calls[name] += 1

        return timed

    for owner, name, function in originals:
        setattr(owner, name, timer(name, function))
    try:
        _, wall = recorded(
            step, steps, lambda: (total.clear(), calls.clear()), steps_only=steps_only
        )
    finally:
        for owner, name, function in originals:
            setattr(owner, name, function)
    print(f"recorded step {wall * 1e3:.1f} ms (parts timed); wall time by part:")
    for name, seconds in sorted(total.items(), key=lambda item: -item[1]):
        print(
            f"  {name:<20} {seconds / steps * 1e3:8.1f} ms/step {calls[name] // steps:6d} "
            f"calls/step {seconds / calls[name] * 1e6:7.1f} µs/call"
        )


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
    own = sum(e.device_time_total for e in kernels if "opguard::" in e.key)
    print(
        f"GPU kernel time per recorded step: {total / steps / 1e3:.1f} ms, of which OpGuard's "
        f"fingerprint kernels {own / steps / 1e3:.1f} ms"
    )
    for e in sorted(kernels, key=lambda e: -e.device_time_total)[:top]:
        print(f"  {e.device_time_total / steps / 1e3:8.2f} ms {e.count // steps:6d}x  {e.key[:90]}")


def time_by_phase(step: Callable[..., float], steps: int, steps_only: bool = False) -> None:
    def phases(commits: list[tuple[float, float]]) -> dict[str, tuple[float, float, float]]:
        """{phase: (host ms, GPU ms, ms of it the writer spent committing)} from the step's
        start, medians over ``steps``; ``commits`` fills with the writer's (start, end)."""
        samples: dict[str, list[tuple[float, float, float]]] = collections.defaultdict(list)
        for _ in range(steps):
            torch.cuda.synchronize()
            start = torch.cuda.Event(enable_timing=True)
            marks: list[tuple[str, float, torch.cuda.Event]] = []

            def mark(phase: str, marks: list = marks) -> None:
                event = torch.cuda.Event(enable_timing=True)
                event.record()
                marks.append((phase, time.perf_counter(), event))

            start.record()
            t0 = time.perf_counter()
            step(mark)
            torch.cuda.synchronize()
            begun = t0
            for phase, host, event in marks:
                writing = sum(max(0.0, min(end, host) - max(t, begun)) for t, end in commits)
                samples[phase].append(((host - t0) * 1e3, start.elapsed_time(event), writing * 1e3))
                begun = host
        return {
            phase: tuple(statistics.median(v[k] for v in values) for k in range(3))
            for phase, values in samples.items()
        }

    plain = phases([])
    commits: list[tuple[float, float]] = []
    commit = TraceWriter._commit

    def timed_commit(self: TraceWriter, *args: Any, **kwargs: Any) -> Any:
        t0 = time.perf_counter()
        try:
            return commit(self, *args, **kwargs)
        finally:
            commits.append((t0, time.perf_counter()))

    TraceWriter._commit = timed_commit  # type: ignore[method-assign]
    try:
        with (
            tempfile.TemporaryDirectory() as workdir,
            opguard.record(Path(workdir) / "run", steps_only=steps_only),
        ):
            step()
            recorded = phases(commits)
    finally:
        TraceWriter._commit = commit  # type: ignore[method-assign]
    print("ms from the step's start: host returns / GPU finishes; ms of the phase's host time")
    print("the trace writer spent committing")
    print(
        f"  {'phase':<10} {'plain host':>10} {'plain GPU':>10} {'rec. host':>10} {'rec. GPU':>10}"
        f" {'committing':>10}"
    )
    for phase, (host, gpu, _) in plain.items():
        rec_host, rec_gpu, writing = recorded[phase]
        print(
            f"  {phase:<10} {host:10.1f} {gpu:10.1f} {rec_host:10.1f} {rec_gpu:10.1f}"
            f" {writing:10.1f}"
        )


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
