"""Issue 28's GPU targets for long runs, each printed with the figure measured for it.

From ``bench/overhead.py --json FILE`` (GPT-2 124M; ``--overhead FILE``): ``--steps-only``
costs at most 1.02x the plain step with peak memory +0%; a ``--window`` run at most 1.02x
outside its window and, inside it, what full recording costs; step-level records take at most
64 KiB a step per rank.

Measured here: ``--keep-last 20`` over 1,000 GPT-2 124M steps keeps the trace no larger than
about 25 steps of op-level trace. The flight recorder keeps two things: the ops of the last 20
steps, which it bounds, and the step-level records of every step, which grow with the run by
design (about 45 KiB a step); both are printed, in steps of op-level trace, and the target is
judged on the op records. The op-level trace of a step is measured by a full recording of
``--reference`` steps of the same model. Sizes are of ``data.mdb`` (and, beside, the blocks it
takes on disk: LMDB's file may hold unwritten room).

    python bench/long_runs.py [--overhead overhead.json] [--steps 1000] [--keep-last 20]
                              [--reference 25] [--batch 2] [--seq 256] [--layers 12]
                              [--width 768] [--device cuda] [--json long_runs.json]

``--layers 2 --steps 40 --device cpu`` checks the script in a minute on a machine without a GPU;
``--layers 2 --width 128 --batch 1 --seq 32 --device cpu`` runs all 1,000 steps on a CPU in
minutes (a narrower model of GPT-2's shape: the flight recorder's bound in steps of op-level
trace depends on the ops a step records, not on their size).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import lmdb
import torch

import opguard

MIB = 2**20
# The targets
RATIO = 1.02  # --steps-only, and a window outside it: step time against the plain step
STEP_RECORD_KIB = 64  # step-level records a step per rank
KEEP_LAST_SLACK = 1.25  # --keep-last 20: disk no larger than ~25 steps of op-level trace


def verdict(met: bool) -> str:
    return "met" if met else "NOT MET"


def overhead_targets(path: Path) -> dict[str, Any]:
    """Prints the targets ``bench/overhead.py``'s JSON measures, and returns the figures."""
    result = json.loads(path.read_text())
    modes = result["modes"]
    steps, outside = modes["opguard-steps"], modes["opguard-window"]
    inside, full = modes.get("opguard-window-inside"), modes["opguard"]
    step_kib = result["step_trace_bytes_per_step"] / 1024
    print(
        f"{path.name}: GPT-2 124M, batch {result['batch']} x {result['seq']}, {result['device']}, "
        f"torch {result['torch']}, {result['world_size']} rank(s)"
    )
    memory = (steps["peak_ratio"] - 1) * 100
    print(
        f"target: --steps-only <= {RATIO}x the plain step: {steps['ratio']:.3f}x "
        f"({verdict(steps['ratio'] <= RATIO)})"
    )
    print(
        f"target: --steps-only peak memory +0%: {memory:+.1f}% ({verdict(round(memory, 1) <= 0)})"
    )
    print(
        f"target: --window, a step outside the window <= {RATIO}x: {outside['ratio']:.3f}x "
        f"({verdict(outside['ratio'] <= RATIO)})"
    )
    if inside is None:
        print(
            "target: --window, inside it what full recording costs: not measured (an older "
            "overhead.py without the opguard-window-inside mode)"
        )
    else:
        print(
            f"target: --window, a step inside the window costs what full recording costs: "
            f"{inside['ratio']:.3f}x against {full['ratio']:.3f}x "
            f"({verdict(inside['ratio'] <= full['ratio'] * RATIO)}, within 2%)"
        )
    print(
        f"target: step-level records <= {STEP_RECORD_KIB} KiB a step per rank: {step_kib:.1f} KiB "
        f"({verdict(step_kib <= STEP_RECORD_KIB)})"
    )
    return {
        "steps_only_ratio": steps["ratio"],
        "steps_only_peak_ratio": steps["peak_ratio"],
        "window_outside_ratio": outside["ratio"],
        "window_inside_ratio": inside["ratio"] if inside else None,
        "full_ratio": full["ratio"],
        "step_record_kib": step_kib,
    }


def footprint(run: Path) -> dict[str, int]:
    """The size of a run's ``data.mdb``, the blocks it takes on disk, and the bytes of the
    pages its step-level records take."""
    rank = run / "rank-0"
    stat = (rank / "data.mdb").stat()
    env = lmdb.open(str(rank), readonly=True, max_dbs=16, lock=False)
    try:
        with env.begin() as txn:
            pages = txn.stat(env.open_db(b"steps", txn=txn, create=False))
    finally:
        env.close()
    used = pages["branch_pages"] + pages["leaf_pages"] + pages["overflow_pages"]
    return {
        "file": stat.st_size,
        "disk": stat.st_blocks * 512,
        "step_records": pages["psize"] * used,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--overhead", type=Path, help="bench/overhead.py's --json output")
    parser.add_argument("--steps", type=int, default=1000)
    parser.add_argument("--keep-last", type=int, default=20)
    parser.add_argument("--reference", type=int, default=25)
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--seq", type=int, default=256)
    parser.add_argument("--layers", type=int, default=12)
    parser.add_argument("--width", type=int, default=768, help="n_embd (heads of 64)")
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    figures: dict[str, Any] = {}
    if args.overhead is not None:
        figures["overhead"] = overhead_targets(args.overhead)
    if args.device == "cuda" and not torch.cuda.is_available():
        print("no CUDA GPU here: the --keep-last run is not measured")
        return
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(
        n_positions=args.seq,
        n_layer=args.layers,
        n_embd=args.width,
        n_head=max(1, args.width // 64),
    )
    model = GPT2LMHeadModel(config).to(args.device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    tokens = torch.randint(0, config.vocab_size, (args.batch, args.seq), device=args.device)

    def train(steps: int) -> float:
        started = time.perf_counter()
        for _ in range(steps):
            loss = model(tokens, labels=tokens).loss
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
        if args.device == "cuda":
            torch.cuda.synchronize()
        return time.perf_counter() - started

    workdir = Path(tempfile.mkdtemp(prefix="opguard-long-"))
    try:
        train(2)  # warm-up: allocator, cuBLAS handles
        with opguard.record(workdir / "full"):
            train(args.reference)
        full = footprint(workdir / "full")
        with opguard.record(workdir / "keep", keep_last=args.keep_last):
            seconds = train(args.steps)
        kept = footprint(workdir / "keep")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    bound = round(args.keep_last * KEEP_LAST_SLACK)
    per_step = (full["file"] - full["step_records"]) / args.reference  # op-level trace a step
    ops_kept = kept["file"] - kept["step_records"]
    in_steps = ops_kept / per_step
    total_steps = kept["file"] / per_step
    name = (
        "GPT-2 124M"
        if (args.layers, args.width) == (12, 768)
        else f"GPT-2 with {args.layers} layer(s) of width {args.width}"
    )
    device = torch.cuda.get_device_name() if args.device == "cuda" else args.device
    print(f"{name}, batch {args.batch} x {args.seq}, {device}, torch {torch.__version__}")
    print(
        f"op-level trace: {per_step / MIB:.2f} MiB a step (a full recording of {args.reference} "
        f"steps: {full['file'] / MIB:.1f} MiB, its step-level records "
        f"{full['step_records'] / MIB:.1f} MiB)"
    )
    print(
        f"--keep-last {args.keep_last} over {args.steps} steps ({seconds / args.steps * 1e3:.0f} ms "
        f"a step): data.mdb {kept['file'] / MIB:.1f} MiB ({kept['disk'] / MIB:.1f} MiB on disk): "
        f"op records {ops_kept / MIB:.1f} MiB, step-level records of every step "
        f"{kept['step_records'] / MIB:.1f} MiB"
    )
    print(
        f"target: --keep-last {args.keep_last} over {args.steps} steps, disk no larger than "
        f"~{bound} steps of op-level trace: op records {in_steps:.1f} steps "
        f"({verdict(in_steps <= bound)}); with the step-level records of all "
        f"{args.steps} steps, {total_steps:.1f} steps ({verdict(total_steps <= bound)})"
    )
    figures["keep_last"] = {
        "steps": args.steps,
        "keep_last": args.keep_last,
        "batch": args.batch,
        "seq": args.seq,
        "layers": args.layers,
        "width": args.width,
        "device": device,
        "op_trace_bytes_per_step": per_step,
        "reference": full,
        "kept": kept,
        "op_records_in_steps": in_steps,
        "total_in_steps": total_steps,
        "seconds_per_step": seconds / args.steps,
    }
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
