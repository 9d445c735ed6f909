"""How ``opguard diff`` scales on step-level records: wall time and peak memory of two
10,000-step runs of GPT-2 124M recorded at step level (``opguard record --steps-only``).

The traces are genuine: written through tests/traces.py's builder (the real writer's
``put_step`` and ``intern_state``, and :func:`~opguard.store.meta.write_meta`), each step record
shaped like the recorder's: the loss, the gradient of each of GPT-2's 148 parameter tensors
(nanoGPT's names, ``transformer.h.3.mlp.c_fc.weight``), the parameters after AdamW's update,
its three states per parameter (``exp_avg``, ``exp_avg_sq``, ``step``) and the CPU and CUDA
generators' states: 743 entries a step, each with dtype, shape, a 64-bit fingerprint that
changes every step, the leading raw values and the stats. Run B equals run A up to step
``--at`` (default: 10 before the end, so the walk covers nearly the whole run), where its
loss is scaled as by ``loss * 1.0001``: from that step on the loss, every gradient, parameter
and optimizer state differ. The diff must name that step, cause ``loss``, and the first
differing gradient.

``--stats-differ`` gives run B's entries the means another device's reduction order would
(the fingerprints stay equal), ``--names-differ`` interns its state names in another order
(ids differ, names do not): no step's bytes then equal run A's, and every step is unpacked and
compared without its stats, names mapped (``opguard._C.step_contents``).

    python bench/step_diff_scale.py [--steps 10000] [--at N] [--stats-differ] [--names-differ]
        [--dir DIR] [--repeat N] [--json FILE]

Each diff runs as a user runs it, ``python -m opguard diff A B --json`` in a subprocess
(:func:`diff_scale.run_diff`: wall time, the child's own peak RSS), on a warm page cache.
Traces are cached in ``--dir`` and reused when built by this version of the builder.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import struct
import sys
import tempfile
import time
import zlib
from dataclasses import asdict, dataclass
from multiprocessing import get_context
from pathlib import Path
from typing import Any

from diff_scale import run_diff, warm
from traces import TraceBuilder  # diff_scale puts tests/ on sys.path

from opguard.store import schema

BUILDER_VERSION = 2
LAYERS, WIDTH, VOCAB, CONTEXT = 12, 768, 50257, 1024
ADAMW_SLOTS = ("exp_avg", "exp_avg_sq", "step")
HEAD_VALUES = 4  # leading elements kept, as the recorder keeps them


def gpt2_parameters() -> list[tuple[str, tuple[int, ...]]]:
    """nanoGPT's GPT-2 124M parameters (``lm_head`` shares ``wte``), in module order."""
    params = [
        ("transformer.wte.weight", (VOCAB, WIDTH)),
        ("transformer.wpe.weight", (CONTEXT, WIDTH)),
    ]
    for layer in range(LAYERS):
        block = f"transformer.h.{layer}"
        params += [
            (f"{block}.ln_1.weight", (WIDTH,)),
            (f"{block}.ln_1.bias", (WIDTH,)),
            (f"{block}.attn.c_attn.weight", (3 * WIDTH, WIDTH)),
            (f"{block}.attn.c_attn.bias", (3 * WIDTH,)),
            (f"{block}.attn.c_proj.weight", (WIDTH, WIDTH)),
            (f"{block}.attn.c_proj.bias", (WIDTH,)),
            (f"{block}.ln_2.weight", (WIDTH,)),
            (f"{block}.ln_2.bias", (WIDTH,)),
            (f"{block}.mlp.c_fc.weight", (4 * WIDTH, WIDTH)),
            (f"{block}.mlp.c_fc.bias", (4 * WIDTH,)),
            (f"{block}.mlp.c_proj.weight", (WIDTH, 4 * WIDTH)),
            (f"{block}.mlp.c_proj.bias", (WIDTH,)),
        ]
    return [*params, ("transformer.ln_f.weight", (WIDTH,)), ("transformer.ln_f.bias", (WIDTH,))]


# (kind, name, slot, dtype, shape) of each entry of a step, in the order the recorder writes them.
Entry = tuple[str, str, str, str, tuple[int, ...]]


def step_entries() -> list[Entry]:
    params = gpt2_parameters()
    return [
        ("loss", "loss", "", "float32", ()),
        *(("grad", name, "", "float32", shape) for name, shape in params),
        *(("param", name, "", "float32", shape) for name, shape in params),
        *(
            ("state", name, slot, "float32", () if slot == "step" else shape)
            for name, shape in params
            for slot in ADAMW_SLOTS
        ),
        ("rng", "cpu", "", "uint8", (5056,)),
        ("rng", "cuda:0", "", "uint8", (16,)),
    ]


@dataclass(frozen=True)
class Plan:
    steps: int
    at: int  # the step whose loss run B scales
    names_differ: bool
    stats_differ: bool


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for dim in shape:
        n *= dim
    return n


def _fields(entry: Entry, value: int, other_mean: bool) -> dict[str, Any]:
    """A state tensor's stored entry (d, s, h, z, b, m, f) for content ``value``; with
    ``other_mean``, its mean rounded as another device would sum it."""
    kind, _, _, dtype, shape = entry
    nbytes = _numel(shape) * (1 if dtype == "uint8" else 4)
    fields: dict[str, Any] = {"d": dtype, "s": list(shape), "h": value, "z": nbytes, "f": 0}
    if kind == "rng":
        return fields
    count = min(HEAD_VALUES, _numel(shape))
    values = [((value >> (16 + 12 * k)) & 0xFFF) / 2048 - 1 for k in range(count)]
    head = struct.pack(f"<{count}f", *values)
    mean = sum(values) / count * (1 + 1e-7 if other_mean else 1)
    stats = [min(values), max(values), mean, max(map(abs, values)), 0, 0]
    return {**fields, "b": head, "m": stats}


def _content(entry: Entry, step: int, side: str, plan: Plan) -> int:
    """The fingerprint of ``entry`` after ``step``: new every step; run B's loss, gradients,
    parameters and optimizer states differ from ``plan.at`` on (the generators' do not)."""
    kind, name, slot, _, _ = entry
    changed = side == "b" and step >= plan.at and kind != "rng"
    return zlib.crc32(f"{kind} {name} {slot} {step}{'*' if changed else ''}".encode()) << 16 | step


def write_side(run_dir: Path, plan: Plan, side: str) -> int:
    """Writes run ``side`` with the real writer; returns the bytes of its trace."""
    started = time.time()
    run_dir.mkdir(parents=True, exist_ok=True)
    meta = {
        "schema": schema.SCHEMA_VERSION,
        "opguard": "synthetic",
        "command": ["opguard", "record", "-o", str(run_dir), "--", "train.py"],
        "cwd": "/home/user/nanogpt",
        "torch": "synthetic (bench/step_diff_scale.py)",
        "world_size": 1,
        "started": started,
        "status": "running",
    }
    start = {"pid": os.getpid(), "started": started}
    run = TraceBuilder(run_dir, meta=meta, start=start)
    entries = step_entries()
    names = sorted({e[1] for e in entries}, reverse=plan.names_differ and side == "b")
    ids = {name: run.state_name(name) for name in names}
    other_mean = plan.stats_differ and side == "b"
    for step in range(plan.steps):
        stored = [
            (
                entry[0],
                ids[entry[1]],
                entry[2],
                _fields(entry, _content(entry, step, side, plan), other_mean),
            )
            for entry in entries
        ]
        run.step_record(step, stored)
    end = {"status": "finished", "steps": plan.steps, "exit_code": 0, "error": None}
    run.close(end, meta={**end, "ended": time.time()})
    return (run.rank_dir / "data.mdb").stat().st_size


def build_pair(root: Path, plan: Plan, *, parallel: bool = True) -> tuple[float, bool, int]:
    """Runs A and B under ``root`` (both at once with ``parallel``), reusing an earlier build
    of the same plan: (build seconds, reused, bytes of run A's trace)."""
    stamp = root / "build.json"
    wanted = {"builder": BUILDER_VERSION, "plan": asdict(plan)}
    if stamp.exists() and json.loads(stamp.read_text()).get("build") == wanted:
        return 0.0, True, (root / "a" / "rank-0" / "data.mdb").stat().st_size
    for side in ("a", "b"):
        shutil.rmtree(root / side, ignore_errors=True)
    root.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    sides = [(root / "a", plan, "a"), (root / "b", plan, "b")]
    if parallel:
        with get_context("spawn").Pool(2) as pool:
            size_a, _ = pool.starmap(write_side, sides)
    else:
        size_a, _ = (write_side(*side) for side in sides)
    elapsed = time.perf_counter() - started
    stamp.write_text(json.dumps({"build": wanted}))
    return elapsed, False, size_a


def check(result: dict[str, Any], plan: Plan) -> list[str]:
    """What the diff had to find: the planted step, the loss first, the first gradient."""
    first = result.get("first_divergence") or {}
    problems = []
    if (first.get("kind"), first.get("step"), first.get("cause")) != ("state", plan.at, "loss"):
        problems.append(f"named {first.get('kind')} {first.get('step')} {first.get('cause')}")
    grads = (first.get("states_differ") or {}).get("by_kind", {}).get("grad", {})
    if grads.get("first") != "grad transformer.wte.weight" or grads.get("count") != 148:
        problems.append(f"first differing gradient: {grads}")
    return problems


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=10_000, help="steps per run")
    parser.add_argument("--at", type=int, help="the step run B changes (default: steps - 10)")
    parser.add_argument("--names-differ", action="store_true", help="see above")
    parser.add_argument("--stats-differ", action="store_true", help="see above")
    parser.add_argument("--dir", type=Path, help="cache of built traces (default: a temp dir)")
    parser.add_argument("--repeat", type=int, default=3, help="diffs (fastest kept, highest RSS)")
    parser.add_argument("--json", type=Path, help="also write the results here")
    args = parser.parse_args()
    at = args.steps - 10 if args.at is None else args.at
    plan = Plan(args.steps, at, args.names_differ, args.stats_differ)
    temp = args.dir is None
    root = Path(tempfile.mkdtemp(prefix="opguard-step-diff-")) if temp else args.dir
    try:
        print(f"building {plan.steps:,} steps per side in {root} ...", file=sys.stderr, flush=True)
        build_s, reused, size = build_pair(root, plan)
        warm(root / "a", root / "b")
        times, peaks, problems = [], [], []
        for _ in range(args.repeat):
            result, diff_s, rss, code = run_diff(root / "a", root / "b")
            problems += check(result, plan) + ([] if code == 1 else [f"exit {code}, not 1"])
            times.append(diff_s)
            peaks.append(rss)
    finally:
        if temp:
            shutil.rmtree(root, ignore_errors=True)
    row = {
        "date": time.strftime("%Y-%m-%d"),
        "cpus": os.cpu_count(),
        "load": round(os.getloadavg()[0], 2),
        "python": platform.python_version(),
        "steps": plan.steps,
        "entries_per_step": len(step_entries()),
        "names_differ": plan.names_differ,
        "stats_differ": plan.stats_differ,
        "trace_mib_per_side": round(size / 2**20, 1),
        "kib_per_step": round(size / plan.steps / 1024, 1),
        "build_s": None if reused else round(build_s, 1),
        "diff_s": round(min(times), 2),
        "diff_s_all": [round(t, 2) for t in times],
        "peak_rss_mib": round(max(peaks) / 2**20, 1),
        "found": not problems,
    }
    print(json.dumps(row))
    for problem in dict.fromkeys(problems):
        print(f"the diff missed what was planted: {problem}", file=sys.stderr)
    if args.json:
        args.json.write_text(json.dumps(row, indent=2))
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())
