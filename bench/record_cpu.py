"""CPU recording overhead, side by side in one process: plain training steps and steps under
``opguard.record``, alternating after a warm-up, medians over ``--steps`` of each.

Models: a small transformer (the one tests/scripts/record_tiny_transformer.py trains, sized so a
plain step takes ~50-200 ms), GPT-2 from the tests' tiny config, and a small GPT-2 config. For
each: the plain and recorded step times and their ratio, ops per step, the recorder's cost per op
((recorded - plain) / ops), the tensor bytes fingerprinted per step, and the trace bytes per
step (packed records, and the LMDB file's growth).

Runs on one intra-op thread unless ``--threads`` says otherwise: the recorder's cost is per op and
single-threaded, and on a shared or small machine OpenMP threads that lose their core to another
process make plain steps erratic (and the bench slow).

One recording session stays open for the whole model; plain steps run with the dispatch mode
popped (``_disable_current_modes``), so they pay nothing for it. A recorded step's time includes
waiting for the trace writer to commit that step's records (it packs them on a background
thread that competes for the same cores), so nothing a recorded step costs leaks into the next
plain one.

    python bench/record_cpu.py [--steps 10] [--only transformer,gpt2-tiny,gpt2-small]
                               [--threads 1] [--json F]
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import _disable_current_modes

import opguard

ROOT = Path(__file__).resolve().parent.parent
TINY_SCRIPT = ROOT / "tests" / "scripts" / "record_tiny_transformer.py"

Step = Callable[[], float]


# -- models ------------------------------------------------------------------------------------


def _tiny_module():  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location("record_tiny_transformer", TINY_SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def transformer(
    vocab: int = 512, dim: int = 128, heads: int = 4, layers: int = 2, seq: int = 64, batch: int = 8
) -> Step:
    tiny = _tiny_module()
    torch.manual_seed(0)
    model = tiny.TinyTransformer(
        vocab=vocab, dim=dim, heads=heads, layers=layers, seq=seq, dropout=0.1
    )
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    idx, target = tiny.make_batch(vocab, batch, seq)

    def step() -> float:
        logits = model(idx)
        loss = F.cross_entropy(logits.reshape(-1, vocab), target.reshape(-1))
        opt.zero_grad()
        loss.backward()
        opt.step()
        return loss.item()

    return step


def gpt2(n_layer: int, n_head: int, n_embd: int, vocab: int, seq: int, batch: int) -> Step:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(
        n_layer=n_layer,
        n_head=n_head,
        n_embd=n_embd,
        vocab_size=vocab,
        n_positions=seq,
        bos_token_id=0,
        eos_token_id=0,
    )
    model = GPT2LMHeadModel(config)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    idx = torch.randint(0, vocab, (batch, seq))

    def step() -> float:
        out = model(input_ids=idx, labels=idx)
        opt.zero_grad()
        out.loss.backward()
        opt.step()
        return out.loss.item()

    return step


MODELS: dict[str, tuple[str, Callable[[], Step]]] = {
    "transformer": (
        "TinyTransformer d=192 L=3 vocab=512, batch 16 x 64",
        lambda: transformer(vocab=512, dim=192, heads=4, layers=3, seq=64, batch=16),
    ),
    "gpt2-tiny": (
        "GPT-2 n_layer=2 n_embd=32 vocab=64 (tests' config), batch 2 x 8",
        lambda: gpt2(2, 2, 32, 64, 16, 2),
    ),
    "gpt2-small": (
        "GPT-2 n_layer=2 n_embd=256 vocab=1024, batch 8 x 64",
        lambda: gpt2(2, 4, 256, 1024, 64, 8),
    ),
}


# -- measuring ---------------------------------------------------------------------------------


@dataclass
class Result:
    model: str
    description: str
    plain_ms: float
    recorded_ms: float
    ratio: float
    ops_per_step: int
    us_per_op: float
    trace_bytes_per_step: int  # packed msgpack records handed to LMDB
    disk_bytes_per_step: int  # growth of data.mdb per recorded step
    hashed_bytes_per_step: int  # tensor bytes read and fingerprinted (approximate, see below)
    steps: int


def _drain(session: opguard.recorder.RecordingSession, ops: int) -> None:
    """Waits until the writer has committed ``ops`` records."""
    writer = session.writer
    while writer.records_written < ops:
        if writer.error is not None:
            raise RuntimeError(f"trace writer failed: {writer.error}")
        writer.wake()  # write now, not at the next flush interval
        time.sleep(0.0005)


def _bytes_hashed(run_dir: Path, last_ops: int) -> int:
    """Tensor bytes the last ``last_ops`` recorded ops read: outputs that were fingerprinted (not
    views, whose fingerprint is derived, nor uninitialized memory) and inputs no recorded op
    produced (parameters and data read for the first time, tensors made outside the
    dispatcher)."""
    from opguard.store import Run

    total = 0
    with Run(run_dir) as run:
        trace = run.rank(0)
        for op in trace.ops(max(0, len(trace) - last_ops)):
            total += sum(t.nbytes for t in op.outputs if t.hash is not None and not t.is_view)
            total += sum(t.nbytes for t in op.inputs if t.producer is None and t.hash is not None)
    return total


def measure(
    name: str, description: str, build: Callable[[], Step], steps: int, workdir: Path
) -> Result:
    step = build()
    for _ in range(3):  # warm-up: allocator, kernels, optimizer state
        step()
    run_dir = workdir / name
    plain: list[float] = []
    recorded: list[float] = []
    ops: list[int] = []
    packed: list[int] = []
    with opguard.record(run_dir, overwrite=True) as session:
        recorder = session._recorder
        assert recorder is not None
        writer = session.writer

        def recorded_step() -> tuple[float, int, int]:
            ops0, bytes0 = recorder.next_index, writer.bytes_written
            t0 = time.perf_counter()
            step()
            _drain(session, recorder.next_index)
            elapsed = time.perf_counter() - t0
            return elapsed, recorder.next_index - ops0, writer.bytes_written - bytes0

        def plain_step() -> float:
            with _disable_current_modes():
                t0 = time.perf_counter()
                step()
                return time.perf_counter() - t0

        for _ in range(2):  # warm-up under the recorder: op tables, interned sites
            recorded_step()
        disk0 = (run_dir / "rank-0" / "data.mdb").stat().st_size
        for k in range(2 * steps):
            if k % 2 == 0:
                plain.append(plain_step())
            else:
                elapsed, n, nbytes = recorded_step()
                recorded.append(elapsed)
                ops.append(n)
                packed.append(nbytes)
        if recorder.active is False or session.failure is not None:
            raise RuntimeError(f"recording failed: {session.failure}")
    disk1 = (run_dir / "rank-0" / "data.mdb").stat().st_size
    hashed = _bytes_hashed(run_dir, sum(ops)) // steps
    p, r = statistics.median(plain), statistics.median(recorded)
    n = int(statistics.median(ops))
    result = Result(
        model=name,
        description=description,
        plain_ms=p * 1e3,
        recorded_ms=r * 1e3,
        ratio=r / p,
        ops_per_step=n,
        us_per_op=(r - p) / n * 1e6,
        trace_bytes_per_step=int(statistics.median(packed)),
        disk_bytes_per_step=(disk1 - disk0) // steps,
        hashed_bytes_per_step=hashed,
        steps=steps,
    )
    shutil.rmtree(run_dir, ignore_errors=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10, help="plain and recorded steps each")
    parser.add_argument("--only", default=",".join(MODELS), help="comma-separated models")
    parser.add_argument(
        "--threads",
        type=int,
        default=1,
        help="torch intra-op threads (default 1: steadiest on shared machines; 0: torch's own)",
    )
    parser.add_argument("--json", metavar="PATH", help="also write the results as JSON")
    args = parser.parse_args()
    if args.threads > 0:
        torch.set_num_threads(args.threads)

    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} intra-op threads, "
        f"{os.cpu_count()} CPUs; medians of {args.steps} alternating plain/recorded steps"
    )
    header = (
        f"{'model':<12} {'plain ms':>9} {'recorded ms':>12} {'ratio':>6} "
        f"{'ops/step':>9} {'µs/op':>7} {'MiB hashed':>11} {'trace KiB':>10} {'disk KiB':>9}"
    )
    print(header)
    results = []
    with tempfile.TemporaryDirectory(prefix="opguard-bench-") as tmp:
        for name in args.only.split(","):
            description, build = MODELS[name]
            r = measure(name, description, build, args.steps, Path(tmp))
            results.append(r)
            print(
                f"{r.model:<12} {r.plain_ms:>9.2f} {r.recorded_ms:>12.2f} {r.ratio:>6.2f} "
                f"{r.ops_per_step:>9} {r.us_per_op:>7.1f} "
                f"{r.hashed_bytes_per_step / 2**20:>11.1f} "
                f"{r.trace_bytes_per_step / 1024:>10.1f} {r.disk_bytes_per_step / 1024:>9.1f}"
                f"   {r.description}",
                flush=True,
            )
    if args.json:
        Path(args.json).write_text(json.dumps([asdict(r) for r in results], indent=2))


if __name__ == "__main__":
    main()
