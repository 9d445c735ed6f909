"""GPU recording overhead: a GPT-2 124M training step (transformers, from a config, batch
8 x 1024, AdamW) on one GPU, plain vs under ``opguard.record`` vs under PyTorch's DebugMode with
``log_tensor_hashes(hash_fn="hash_tensor")``, side by side in one process.

Two more modes explain the figure: ``passthrough``, a dispatch mode that only calls each op (the
floor of any recorder built on a Python dispatch mode), and ``opguard-nokernels`` (kernel
collection off, ``OPGUARD_KERNELS=0``). Three measure long runs (docs/LONG_RUNS.md):
``opguard-steps`` records step-level records only (``opguard record --steps-only``),
``opguard-window`` records with an op-level window that starts after the measured steps, so
they show what a step outside a window costs, and ``opguard-window-inside`` with one that holds
every measured step (a step inside a window, against full recording's). Each mode also reports
its host time: how long the step takes to *return* before the final synchronise. A step whose
host time approaches its step time is host-bound (the GPU waits for launches); otherwise the
cost is GPU work.

Modes are interleaved in rounds after a warm-up so clock and thermal drift hit all alike; each
figure is the median step time. Prints a table and writes JSON next to it with --json PATH. On a
machine without a CUDA GPU it says so and measures nothing.

Under torchrun (``torchrun --nproc-per-node 2 bench/overhead.py``) every rank trains the model
wrapped in DistributedDataParallel over NCCL, one GPU each, and rank 0 reports its own times
(DDP's all-reduces keep the ranks in step).

``--compile`` runs the model through ``torch.compile`` (Inductor) in every mode: plain compiled
steps against recorded compiled steps, where OpGuard records each compiled region, its Triton
kernels and the ATen ops it falls back to. Compiled regions are visible to a recorder only when
compiled with ``torch._inductor.config.wrap_inductor_compiled_regions`` set (``opguard record``
sets it before the script runs); the benchmark compiles once, with it set, for all modes.
DebugMode and the passthrough mode are left out: under them Dynamo runs the model eagerly (or,
for DebugMode, records nothing inside compiled regions).

``--bf16`` runs the forward under bf16 autocast (the loss and the backward as autocast leaves
them), as most training runs: with ``--compile``, the configuration whose steps are shortest.

    python bench/overhead.py [--steps 6] [--rounds 3] [--batch 8] [--seq 1024] [--compile]
                             [--bf16] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from pathlib import Path
from typing import Any

import lmdb
import torch
from torch.utils._python_dispatch import TorchDispatchMode

import opguard
from opguard.store import Run

OUTSIDE = (1_000_000, 1_000_001)  # an op-level window no benchmark session reaches
INSIDE = (0, OUTSIDE[0])  # one that holds every step a benchmark session takes


def distributed() -> bool:
    """Whether this process is one rank of a torchrun job (then NCCL is initialised)."""
    if int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return False
    if not torch.distributed.is_initialized():
        torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
        torch.distributed.init_process_group("nccl")
    return True


def build(
    batch: int, seq: int, compile: bool = False, bf16: bool = False
) -> tuple[Callable[..., float], torch.nn.Module]:
    from transformers import GPT2Config, GPT2LMHeadModel

    ranked = distributed()  # first: it picks this rank's GPU
    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_positions=seq)).cuda()
    model.train()
    trained: torch.nn.Module = model
    if ranked:
        from torch.nn.parallel import DistributedDataParallel

        trained = DistributedDataParallel(model, device_ids=[torch.cuda.current_device()])
    opt = torch.optim.AdamW(trained.parameters(), lr=1e-4)
    tokens = torch.randint(0, model.config.vocab_size, (batch, seq), device="cuda")
    forward: Callable[..., Any] = trained
    if compile:
        from torch._inductor import config as inductor_config

        inductor_config.wrap_inductor_compiled_regions = True
        forward = torch.compile(trained)

    def step(mark: Callable[[str], None] = lambda phase: None) -> float:
        """One training step; ``mark(phase)`` is called as each phase returns."""
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=bf16):
            out = forward(tokens, labels=tokens)
        mark("forward")
        opt.zero_grad(set_to_none=True)
        out.loss.backward()
        mark("backward")
        opt.step()
        mark("optimizer")
        return 0.0

    return step, model


@contextmanager
def kernels_off() -> Iterator[None]:
    """Recording sessions started inside collect no GPU kernels (``OPGUARD_KERNELS=0``)."""
    old = os.environ.get("OPGUARD_KERNELS")
    os.environ["OPGUARD_KERNELS"] = "0"
    try:
        yield
    finally:
        if old is None:
            del os.environ["OPGUARD_KERNELS"]
        else:
            os.environ["OPGUARD_KERNELS"] = old


class Passthrough(TorchDispatchMode):
    """Calls every op and nothing else: what the dispatch mechanism alone costs."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        return func(*args, **(kwargs or {}))


def timed(
    step: Callable[[], float], context: Callable[[], AbstractContextManager], n: int
) -> tuple[list[float], list[float]]:
    """(step times, host times) of ``n`` steps."""
    times, host = [], []
    with context():
        for _ in range(n):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            step()
            host.append(time.perf_counter() - t0)
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
    return times, host


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6, help="steps per mode per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--no-debugmode", action="store_true")
    parser.add_argument("--compile", action="store_true", help="torch.compile the model")
    parser.add_argument("--bf16", action="store_true", help="the forward under bf16 autocast")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    if not torch.cuda.is_available():
        print("no CUDA GPU here: the GPU overhead benchmark measures nothing")
        return
    step, _ = build(args.batch, args.seq, compile=args.compile, bf16=args.bf16)
    if distributed():  # one run directory shared by the ranks, each writing its rank-K
        job = os.environ.get("TORCHELASTIC_RUN_ID", "job")
        workdir = Path(tempfile.gettempdir()) / f"opguard-bench-{job}"
    else:
        workdir = Path(tempfile.mkdtemp(prefix="opguard-bench-"))
    traces: dict[str, Path] = {}  # each recording mode's latest trace
    writers: list = []

    def recorder(mode: str, **options: Any) -> Callable[[], AbstractContextManager]:
        def recording() -> AbstractContextManager:
            path = workdir / f"run{len(writers)}"
            traces[mode] = path
            session = opguard.record(path, **options)
            writers.append(session)
            return session

        return recording

    def debugmode() -> AbstractContextManager:
        from torch.utils._debug_mode import DebugMode

        class Both:
            def __enter__(self) -> None:
                self.dm = DebugMode()
                self.dm.__enter__()
                self.hashes = DebugMode.log_tensor_hashes(hash_fn="hash_tensor")
                self.hashes.__enter__()

            def __exit__(self, *exc: object) -> None:
                self.hashes.__exit__(*exc)
                self.dm.__exit__(*exc)

        return Both()

    @contextmanager
    def recording_without_kernels() -> Iterator[None]:
        with kernels_off(), recorder("opguard-nokernels")():
            yield

    modes: dict[str, Callable[[], AbstractContextManager]] = {
        "plain": nullcontext,
        "passthrough": Passthrough,
        "opguard": recorder("opguard"),
        "opguard-nokernels": recording_without_kernels,
        "opguard-steps": recorder("opguard-steps", steps_only=True),
        # op level from a step no session here reaches: every measured step is outside it
        "opguard-window": recorder("opguard-window", window=OUTSIDE),
        "opguard-window-inside": recorder("opguard-window-inside", window=INSIDE),
    }
    if args.compile:
        del modes["passthrough"]
    elif not args.no_debugmode:
        modes["debugmode"] = debugmode
    from opguard.recorder import tensors as recorder_tensors

    def launched() -> int:
        """Tensors the GPU fingerprinter has fingerprinted so far."""
        return recorder_tensors._GPU.launches if recorder_tensors._GPU is not None else 0

    for ctx in modes.values():  # warm-up: allocator, cuBLAS handles, autotuning
        timed(step, ctx, 2)
    times: dict[str, list[float]] = {name: [] for name in modes}
    host: dict[str, list[float]] = {name: [] for name in modes}
    peak: dict[str, int] = {}
    launches: dict[str, int] = dict.fromkeys(modes, 0)
    for _ in range(args.rounds):
        for name, ctx in modes.items():
            torch.cuda.reset_peak_memory_stats()
            before = launched()
            step_times, host_times = timed(step, ctx, args.steps)
            launches[name] += launched() - before
            times[name] += step_times
            host[name] += host_times
            peak[name] = max(peak.get(name, 0), torch.cuda.max_memory_allocated())

    def trace_bytes(mode: str) -> int:
        """The size of the mode's last trace (one per rank here: this rank's)."""
        return sum(f.stat().st_size for f in traces[mode].rglob("*.mdb"))

    def step_record_bytes(mode: str) -> int:
        """The pages the mode's last trace holds its step-level records in (without the fixed
        part of a trace, which a run of a few steps would spread over them)."""
        env = lmdb.open(
            str(next(traces[mode].glob("rank-*"))), readonly=True, max_dbs=16, lock=False
        )
        try:
            stat = env.open_db(b"steps", create=False)
            with env.begin() as txn:
                pages = txn.stat(stat)
            return pages["psize"] * (
                pages["branch_pages"] + pages["leaf_pages"] + pages["overflow_pages"]
            )
        finally:
            env.close()

    last = Run(traces["opguard"])
    ops = len(last.rank(0))
    steps_recorded = args.steps
    measured = args.steps * args.rounds
    records = sum(session.writer.records_written for session in writers)
    written = sum(session.writer.bytes_written for session in writers)
    busy = sum(session.writer.busy_seconds for session in writers)
    plain = statistics.median(times["plain"])
    rows = {}
    for name in modes:
        median = statistics.median(times[name])
        rows[name] = {
            "median_s": median,
            "ratio": median / plain,
            "host_s": statistics.median(host[name]),
            "peak_gib": peak[name] / 2**30,
            "peak_ratio": peak[name] / peak["plain"],
        }
    result = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "batch": args.batch,
        "seq": args.seq,
        "compiled": args.compile,
        "bf16": args.bf16,
        "rounds": args.rounds,
        "steps": args.steps,
        "ops_per_step": ops / steps_recorded,
        "trace_bytes_per_step": trace_bytes("opguard") / steps_recorded,
        # step-level records alone, and outside a window (the same records, the mode off)
        "step_trace_bytes_per_step": step_record_bytes("opguard-steps") / steps_recorded,
        "window_trace_bytes_per_step": trace_bytes("opguard-window") / steps_recorded,
        "fingerprint_launches_per_step": launches["opguard"] / measured,
        "step_fingerprint_launches_per_step": launches["opguard-steps"] / measured,
        "writer_records_per_s": records / busy,
        "writer_bytes_per_s": written / busy,
        "world_size": torch.distributed.get_world_size() if distributed() else 1,
        "modes": rows,
    }
    if distributed():
        torch.distributed.barrier()
        if torch.distributed.get_rank() != 0:
            return
    print(
        f"GPT-2 124M{', bf16 autocast' if args.bf16 else ''}{', torch.compile' if args.compile else ''}"
        f", batch {args.batch} x {args.seq}, "
        f"{result['device']}, torch {torch.__version__}"
        f", {result['world_size']} rank(s)"
    )
    print(
        f"{'mode':<18} {'median step':>12} {'ratio':>7} {'host':>9} {'peak GiB':>9} {'peak ratio':>10}"
    )
    for name, row in rows.items():
        print(
            f"{name:<18} {row['median_s'] * 1e3:>10.1f}ms {row['ratio']:>7.3f} "
            f"{row['host_s'] * 1e3:>7.1f}ms {row['peak_gib']:>9.2f} {row['peak_ratio']:>10.3f}"
        )
    print(
        f"ops per step {result['ops_per_step']:.0f}, trace {result['trace_bytes_per_step'] / 2**20:.2f} MiB per step, "
        f"writer {records / busy:,.0f} records/s ({written / busy / 2**20:.1f} MiB/s) while busy"
    )
    print(
        f"step-level records: {result['step_trace_bytes_per_step'] / 2**10:.1f} KiB per step "
        f"({result['step_fingerprint_launches_per_step']:.0f} tensors fingerprinted per step)"
    )
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    last.close()
    shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
