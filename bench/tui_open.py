"""Time for ``opguard tui`` to open a pair of large traces, and to answer keys once open.

Builds two synthetic runs of ``--ops`` ops (default 1M) with tests/traces.py (once; they are kept in
``--dir`` and reused), B's outputs differing from one op late in the run, then measures with
``app.run_test()``: time from opening the runs to the first rendered screen; time per key while
a key is held (presses arriving faster than handled) during the background diff and after it;
time until the diff has landed on the first divergence and the loss curves are drawn.

    python bench/tui_open.py [--ops 1000000] [--ops-per-step 2000] [--dir /tmp/opguard-tui-bench]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import struct
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # the trace builder
from traces import TraceBuilder, tensor

SCRIPT = "/bench/train.py"
OP_NAMES = ("aten::addmm.default", "aten::gelu.default", "aten::add.Tensor", "aten::mul.Tensor")
LOSS_ITEM = "aten::_local_scalar_dense.default"
LINES = 40  # distinct call lines, each with its own source


def _source(line: int) -> list[list[Any]]:
    return [[n, f"    x = layer_{n}(x)  # line {n}"] for n in range(line - 2, line + 3)]


def _tensor(slot: str, fingerprint: int, producer: int | None) -> dict[str, Any]:
    head = struct.pack("<4f", 0.5, -1.25, 2.0, fingerprint % 7)
    stats = [-3.0, 3.0, 0.01, 3.0, 0, 0]
    return tensor(slot, fingerprint, producer, shape=(64, 64), b=head, m=stats)


def write_run(path: Path, ops: int, per_step: int, diverge_at: int | None) -> None:
    """One rank of ``ops`` ops; from ``diverge_at`` on, outputs carry other fingerprints."""
    start = time.time()
    run = TraceBuilder(path, meta={"command": ["bench"], "status": "running"})
    sites = [run.site(SCRIPT, line, "forward", _source(line)) for line in range(10, 10 + LINES)]
    stacks = [run.stack([site]) for site in sites]
    for i in range(ops):
        step, within = divmod(i, per_step)
        salt = 1 if diverge_at is not None and i >= diverge_at else 0
        site, stack = sites[within % LINES], stacks[within % LINES]
        inputs = [_tensor("self", (i * 31) & 0xFFFFFFFF, i - 1 if i else None)]
        if within == per_step - 1:  # the step's loss.item()
            loss = 5.0 / (1 + step) + salt * 1e-3
            run.op(LOSS_ITEM, inputs, [], step=step, site=site, k=stack, v=loss)
        else:
            outputs = [_tensor("0", (i * 17 + salt) & 0xFFFFFFFF, None)]
            run.op(OP_NAMES[i % len(OP_NAMES)], inputs, outputs, step=step, site=site, k=stack)
    run.close(
        {"status": "finished", "ops": ops},
        meta={"status": "finished", "started": start, "ended": time.time()},
    )


def build(root: Path, ops: int, per_step: int) -> tuple[Path, Path]:
    stamp = root / "built.json"
    wanted = {"ops": ops, "per_step": per_step}
    a, b = root / "a", root / "b"
    if stamp.exists() and json.loads(stamp.read_text()) == wanted:
        return a, b
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    started = time.perf_counter()
    write_run(a, ops, per_step, None)
    write_run(b, ops, per_step, ops * 9 // 10 + per_step // 2)
    print(f"built 2 x {ops:,} ops in {time.perf_counter() - started:.1f} s")
    stamp.write_text(json.dumps(wanted))
    return a, b


async def _held_key(pilot: Any, key: str, count: int) -> float:
    """Seconds per key when ``count`` presses arrive faster than they are handled (a key held
    down), until the screen has caught up."""
    from textual import events

    started = time.perf_counter()
    for _ in range(count):
        event = events.Key(key, None)
        event.set_sender(pilot.app)
        pilot.app._driver.send_message(event)
    await pilot.pause()
    return (time.perf_counter() - started) / count


async def measure(a: Path, b: Path, keys: int) -> dict[str, float]:
    from opguard.tui.app import OpguardApp
    from opguard.tui.session import Session

    started = time.perf_counter()
    app = OpguardApp(Session.open(a, b))
    async with app.run_test(size=(160, 50)) as pilot:
        await pilot.pause()
        result = {"first_render_s": time.perf_counter() - started}
        result["key_while_diffing_ms"] = await _held_key(pilot, "j", keys) * 1000
        assert app.cursor.position.row == keys, "every key press moves the cursor"
        await app.workers.wait_for_complete()  # the diff, then the loss curves
        await pilot.pause()
        result["diverged_s"] = time.perf_counter() - started
        await pilot.press("d")  # keys were pressed meanwhile, so it did not jump by itself
        result["landed_on_step"] = app.cursor.position.step
        result["key_ms"] = await _held_key(pilot, "j", keys) * 1000
        result["page_ms"] = await _held_key(pilot, "pagedown", keys // 10) * 1000
        return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ops", type=int, default=1_000_000)
    parser.add_argument("--ops-per-step", type=int, default=2000)
    parser.add_argument("--dir", type=Path, default=Path("/tmp/opguard-tui-bench"))
    parser.add_argument("--keys", type=int, default=200, help="key presses per held-key burst")
    args = parser.parse_args()
    a, b = build(args.dir, args.ops, args.ops_per_step)
    result = asyncio.run(measure(a, b, args.keys))
    print(
        f"{args.ops:,} ops per run: first render {result['first_render_s']:.2f} s; "
        f"{result['key_while_diffing_ms']:.1f} ms per key while the diff runs; "
        f"on the first divergence (step {result['landed_on_step']:.0f}) with both loss "
        f"curves after {result['diverged_s']:.1f} s; then {result['key_ms']:.1f} ms per key, "
        f"{result['page_ms']:.1f} ms per page"
    )


if __name__ == "__main__":
    main()
