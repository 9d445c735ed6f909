"""Recordings of the scenario scripts (tests/scenarios/), shared by every test module and bench
that needs them, so a pytest session records each script once.

Each recording runs ``opguard record`` in a process of its own, as a user would (warm.py), and
keeps the script's stdout and stderr beside the run directory (``NAME.stdout``,
``NAME.stderr``): the benchmark of the evidence bundle compares its size against them.
"""

from __future__ import annotations

import os
import shutil
import sys
import threading
from pathlib import Path

import pytest
import warm
from run_once import BATCH_TIMEOUT, DONE, FAILED, run_dir, run_lock

SCENARIOS = Path(__file__).resolve().parent / "scenarios"
BASE = SCENARIOS / "base.py"
GPT2_BASE = SCENARIOS / "gpt2_base.py"
COMPILED = SCENARIOS / "compiled_model.py"
ACCUMULATE = SCENARIOS / "accumulate.py"
PENALTY = SCENARIOS / "penalty.py"

VARIANTS = (  # variant_NAME.py: base.py with one change
    "lr",
    "init_seed",
    "seed",
    "no_zero_grad",
    "eval",
    "gelu_tanh",
    "loss_scaled",
    "logging",
    "refactor",
    # ties between equally long alignments (settled by data flow, opguard/analysis/align/ties.py)
    "item_log",
    "stats_once",
    "stats_twice",
    "peaks_2",
    "peaks_3",
    "reorder_1",
    "reorder_2",
    "deeper",
    # differences every reader absorbs (opguard/analysis/divergence/reach.py)
    "workspace",
    "workspace_ballast",
    "workspace_ballast_lr",
)
# name -> (script, extra `opguard record` options). "rerun" is the baseline recorded again.
RECORDINGS: dict[str, tuple[Path, tuple[str, ...]]] = {
    "base": (BASE, ()),
    "rerun": (BASE, ()),
    "base_2_steps": (BASE, ("--steps", "2")),
    **{name: (SCENARIOS / f"variant_{name}.py", ()) for name in VARIANTS},
    "gpt2": (GPT2_BASE, ()),
    "gpt2_eps": (SCENARIOS / "variant_gpt2_eps.py", ()),
    # torch.compile (tests/test_compiled.py): options of compiled_model.py in SCRIPT_ARGS
    "compiled": (COMPILED, ()),
    "compiled_rerun": (COMPILED, ()),
    "compiled_gelu": (COMPILED, ()),
    "compiled_divide": (COMPILED, ()),
    "compiled_verified": (COMPILED, ("--verify-inputs",)),
    "eager": (COMPILED, ("--eager",)),
    "eager_numpy": (COMPILED, ("--eager",)),
    "eager_verified": (COMPILED, ("--eager", "--verify-inputs")),
    "eager_numpy_verified": (COMPILED, ("--eager", "--verify-inputs")),
    # rounding-only pairs (docs/COMPARING.md): the thread count, a sum in another order
    "accum_threads_1": (ACCUMULATE, ()),
    "accum_threads_2": (ACCUMULATE, ()),
    "one_batch_threads_1": (ACCUMULATE, ()),
    "one_batch_threads_2": (ACCUMULATE, ()),
    "penalty": (PENALTY, ()),
    "penalty_reversed": (PENALTY, ()),
}
# The script's own arguments, for recordings that pass any.
SCRIPT_ARGS: dict[str, tuple[str, ...]] = {
    "compiled_gelu": ("--activation", "gelu"),
    "compiled_divide": ("--scale", "divide"),
    "eager_numpy": ("--numpy-write",),
    "eager_numpy_verified": ("--numpy-write",),
    "accum_threads_1": ("--threads", "1", "--accum", "2"),
    "accum_threads_2": ("--threads", "2", "--accum", "2"),
    "one_batch_threads_1": ("--threads", "1", "--accum", "1"),
    "one_batch_threads_2": ("--threads", "2", "--accum", "1"),
    "penalty_reversed": ("--reversed",),
}
# Variants compared with each other rather than with base.py (the second of each pair).
BETWEEN_VARIANTS = {
    "stats_twice": "stats_once",
    "peaks_3": "peaks_2",
    "reorder_2": "reorder_1",
    "workspace_ballast": "workspace",
    "workspace_ballast_lr": "workspace",
}
# Every scenario pair: each variant against its baseline, and the baseline against itself.
PAIRS: tuple[tuple[str, str], ...] = (
    ("base", "rerun"),
    *(
        (BETWEEN_VARIANTS.get(name, "base"), name)
        for name in VARIANTS
        if name not in BETWEEN_VARIANTS.values()
    ),
    ("gpt2", "gpt2_eps"),
)
ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error", "PYTHONUNBUFFERED": "1"}


class Recordings:
    """Run directories of the scenario scripts, each recorded once on first use; the runs a
    caller asks for together are recorded in parallel. The test workers of a pytest run share
    one set (:func:`session_recordings`): what one worker recorded, or failed to record, is
    read from ``root`` by the others (``NAME.done`` or ``NAME.failed`` beside each run)."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self._lock = threading.Lock()  # the threads of one process; run_lock: the workers

    def __call__(self, *names: str) -> list[Path]:
        with self._lock, run_lock(self.root):
            wanted = [n for n in dict.fromkeys(names) if self._outcome(n) is None]
            for name in wanted:  # left half made by a worker that died
                shutil.rmtree(self.root / name, ignore_errors=True)
            running = [(name, self._start(name)) for name in wanted]
            try:
                for name, proc in running:
                    out, err = proc.communicate(timeout=BATCH_TIMEOUT)
                    (self.root / f"{name}.stdout").write_text(out)
                    (self.root / f"{name}.stderr").write_text(err)
                    if proc.returncode == 0:
                        (self.root / f"{name}{DONE}").touch()
                    else:
                        failure = f"exit {proc.returncode}\n{out}\n{err}"
                        (self.root / f"{name}{FAILED}").write_text(failure)
            finally:  # a recording that hangs: none of the batch is left running
                for _, proc in running:
                    if proc.poll() is None:
                        proc.kill()
                        proc.wait()
        for name in names:
            failure = self._outcome(name)
            if failure:
                pytest.fail(f"recording {name} failed: {failure}")
        return [self.root / n for n in names]

    def _outcome(self, name: str) -> str | None:
        """'' if ``name`` is recorded, why recording it failed, or None if not recorded yet."""
        if (self.root / f"{name}{DONE}").exists():
            return ""
        failed = self.root / f"{name}{FAILED}"
        return failed.read_text() if failed.exists() else None

    def _start(self, name: str) -> warm.Popen:
        """``opguard record -o ROOT/NAME [OPTIONS] -- SCRIPT [ARGS]``, as a user runs it."""
        script, options = RECORDINGS[name]
        command = [
            "record",
            "-o",
            str(self.root / name),
            *options,
            "--",
            str(script),
            *SCRIPT_ARGS.get(name, ()),
        ]
        return warm.Popen(
            [sys.executable, "-m", "opguard", *command], cwd=self.root, env={**os.environ, **ENV}
        )


_SESSION: Recordings | None = None


def session_recordings(factory: pytest.TempPathFactory) -> Recordings:
    """The recordings of this pytest run: one set, whichever test module or worker asks first."""
    global _SESSION
    if _SESSION is None:
        root = run_dir(factory) / "scenarios"
        root.mkdir(exist_ok=True)
        _SESSION = Recordings(root)
    return _SESSION
