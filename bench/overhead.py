"""GPU recording overhead: a GPT-2 124M training step (transformers, from a config, batch
8 x 1024, AdamW) on one GPU, plain vs under ``opguard.record`` vs under PyTorch's DebugMode with
``log_tensor_hashes(hash_fn="hash_tensor")``, side by side in one process.

Modes are interleaved in rounds after a warm-up so clock and thermal drift hit all alike; each
figure is the median step time. Prints a table and writes JSON next to it with --json PATH.

``--compile`` runs the model through ``torch.compile`` (Inductor) in every mode: plain compiled
steps against recorded compiled steps, where OpGuard records each compiled region, its Triton
kernels and the ATen ops it falls back to. Compiled regions are visible to a recorder only when
compiled with ``torch._inductor.config.wrap_inductor_compiled_regions`` set (``opguard record``
sets it before the script runs); the benchmark compiles once, with it set, for all modes.
DebugMode is left out: it does not see inside compiled regions.

    python bench/overhead.py [--steps 6] [--rounds 3] [--batch 8] [--seq 1024] [--compile]
                             [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import Any

import torch

import opguard
from opguard.store import Run


def build(
    batch: int, seq: int, compile: bool = False
) -> tuple[Callable[[], float], torch.nn.Module]:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config(n_positions=seq)).cuda()
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    tokens = torch.randint(0, model.config.vocab_size, (batch, seq), device="cuda")
    forward: Callable[..., Any] = model
    if compile:
        from torch._inductor import config as inductor_config

        inductor_config.wrap_inductor_compiled_regions = True
        forward = torch.compile(model)

    def step() -> float:
        out = forward(tokens, labels=tokens)
        opt.zero_grad(set_to_none=True)
        out.loss.backward()
        opt.step()
        return 0.0

    return step, model


def timed(
    step: Callable[[], float], context: Callable[[], AbstractContextManager], n: int
) -> list[float]:
    times = []
    with context():
        for _ in range(n):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            step()
            torch.cuda.synchronize()
            times.append(time.perf_counter() - t0)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=6, help="steps per mode per round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--no-debugmode", action="store_true")
    parser.add_argument("--compile", action="store_true", help="torch.compile the model")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    step, _ = build(args.batch, args.seq, compile=args.compile)
    workdir = Path(tempfile.mkdtemp(prefix="opguard-bench-"))
    traces: list[Path] = []

    def recording() -> AbstractContextManager:
        path = workdir / f"run{len(traces)}"
        traces.append(path)
        return opguard.record(path)

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

    modes: dict[str, Callable[[], AbstractContextManager]] = {
        "plain": nullcontext,
        "opguard": recording,
    }
    if not (args.no_debugmode or args.compile):
        modes["debugmode"] = debugmode
    for ctx in modes.values():  # warm-up: allocator, cuBLAS handles, autotuning
        timed(step, ctx, 2)
    times: dict[str, list[float]] = {name: [] for name in modes}
    peak: dict[str, int] = {}
    for _ in range(args.rounds):
        for name, ctx in modes.items():
            torch.cuda.reset_peak_memory_stats()
            times[name] += timed(step, ctx, args.steps)
            peak[name] = max(peak.get(name, 0), torch.cuda.max_memory_allocated())

    from opguard.recorder import tensors as recorder_tensors

    launches = recorder_tensors._GPU.launches if recorder_tensors._GPU is not None else 0
    last = Run(traces[-1])
    ops = len(last.rank(0))
    trace_bytes = sum(f.stat().st_size for f in traces[-1].rglob("*.mdb"))
    steps_recorded = args.steps
    plain = statistics.median(times["plain"])
    rows = {}
    for name in modes:
        median = statistics.median(times[name])
        rows[name] = {
            "median_s": median,
            "ratio": median / plain,
            "peak_gib": peak[name] / 2**30,
            "peak_ratio": peak[name] / peak["plain"],
        }
    result = {
        "device": torch.cuda.get_device_name(),
        "torch": torch.__version__,
        "batch": args.batch,
        "seq": args.seq,
        "compiled": args.compile,
        "rounds": args.rounds,
        "steps": args.steps,
        "ops_per_step": ops / steps_recorded,
        "trace_bytes_per_step": trace_bytes / steps_recorded,
        "fingerprint_launches_per_step": launches / (args.steps * args.rounds + 2),
        "modes": rows,
    }
    compiled = ", torch.compile" if args.compile else ""
    print(
        f"GPT-2 124M{compiled}, batch {args.batch} x {args.seq}, {result['device']}, "
        f"torch {torch.__version__}"
    )
    print(f"{'mode':<10} {'median step':>12} {'ratio':>7} {'peak GiB':>9} {'peak ratio':>10}")
    for name, row in rows.items():
        print(
            f"{name:<10} {row['median_s'] * 1e3:>10.1f}ms {row['ratio']:>7.3f} "
            f"{row['peak_gib']:>9.2f} {row['peak_ratio']:>10.3f}"
        )
    print(
        f"ops per step {result['ops_per_step']:.0f}, trace {trace_bytes / steps_recorded / 2**20:.2f} MiB per step"
    )
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    last.close()
    shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
