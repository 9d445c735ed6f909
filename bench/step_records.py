"""Step-level records of GPT-2 124M (``opguard record --steps-only``) on the CPU: what one step's
record holds and takes on disk, and the host time the recorder spends on it.

GPT-2 124M (transformers, from a config) trains a few AdamW steps on a tiny batch (the state's
size, not the batch, sets the record's). Reports the entries per step, the record's packed and
stored (compressed) size, the pages its database takes per step, and the time of the recorder's
calls on the training thread per step (hooks and the backward wrapper: CPU fingerprints
included, which on the GPU are kernels launched without waiting). The GPU figures, step time
and peak memory, are bench/overhead.py's ``opguard-steps`` mode.

    python bench/step_records.py [--steps 4] [--json F]
"""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import lmdb
import msgpack
import torch

import opguard
from opguard.recorder import step_records
from opguard.store import Run


def timed_recorder() -> dict[str, float]:
    """Wraps the StepRecorder's training-thread calls to add up their time."""
    spent = {"seconds": 0.0}
    for name in ("loss", "gradients", "updated", "end_step"):
        original = getattr(step_records.StepRecorder, name)

        def timed(self: Any, *args: Any, _original: Any = original) -> None:
            started = time.perf_counter()
            try:
                _original(self, *args)
            finally:
                spent["seconds"] += time.perf_counter() - started

        setattr(step_records.StepRecorder, name, timed)
    return spent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    model = GPT2LMHeadModel(GPT2Config())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    tokens = torch.randint(0, model.config.vocab_size, (1, 16))
    spent = timed_recorder()
    run = Path(tempfile.mkdtemp(prefix="opguard-steps-")) / "run"
    with opguard.record(run, steps_only=True):
        for _ in range(args.steps):
            model(tokens, labels=tokens).loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
    with Run(run) as opened:
        states = list(opened.rank(0).step_states())
    env = lmdb.open(str(run / "rank-0"), readonly=True, max_dbs=16, lock=False)
    with env.begin() as txn:
        db = env.open_db(b"steps", txn=txn, create=False)
        stored = [len(value) for _, value in txn.cursor(db=db)]
        pages = txn.stat(db)
        packed = [
            len(zlib.decompress(msgpack.unpackb(bytes(v))["z"])) for _, v in txn.cursor(db=db)
        ]
    env.close()
    result = {
        "torch": torch.__version__,
        "steps": len(states),
        "entries_per_step": len(states[-1].entries),
        "stored_bytes_per_step": sum(stored) / len(stored),
        "packed_bytes_per_step": sum(packed) / len(packed),  # before compression
        "pages_bytes_per_step": pages["psize"]
        * (pages["branch_pages"] + pages["leaf_pages"] + pages["overflow_pages"])
        / len(stored),
        "recorder_host_ms_per_step": spent["seconds"] * 1e3 / args.steps,
    }
    print(
        f"GPT-2 124M step-level records, torch {torch.__version__}: "
        f"{result['entries_per_step']} entries per step, "
        f"{result['packed_bytes_per_step'] / 1024:.1f} KiB packed, "
        f"{result['stored_bytes_per_step'] / 1024:.1f} KiB stored "
        f"({result['pages_bytes_per_step'] / 1024:.1f} KiB of pages), "
        f"recorder {result['recorder_host_ms_per_step']:.1f} ms per step on the CPU"
    )
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
