"""The recorded runs of issue 30's and issue 38's CPU pairs (scripts in ``tests/data/tolerant/``):
each run's command line, and one function that records any set of them at once (each recording
is mostly interpreter start-up and ``import torch``). Pairs that differ by rounding alone: fp32 /
bf16, tp1 / tp2, on the CPU the GPU script's gpt / gpt_fused (AdamW) and gpt / gpt_flash
(attention backend), adam / adam_perturbed and solve / solve_perturbed (one-ulp noise on the ops
that round: ``opguard record --perturb-rounding``, :data:`RECORD_OPTIONS`); real changes behind
them: bf16 / bf16_eps, bf16 / bf16_nudge (a weight changed through NumPy), tp1 or tp2 / tp2_bug,
gpt_flash / gpt_scale, mlp / mlp_momentum (the cross-version script, momentum changed at step
1) and solve / solve_nudge. solve_control is the control run of ``--noise``. Issue 38's pairs
whose tensors are read through views no sketch measures: attention against attention_bf16,
attention_math (another attention backend) and attention_reshaped (a reshape of one run only,
its rounding perturbed), within rounding, and attention_bf16_decay (the weight decay changed);
shifted (rounding perturbed) against shifted_KIND (one view of the batch a row later).

Test code, not shipped: tests import it, and benchmarks (``bench/tolerant_pairs.py``) put
``tests/`` on ``sys.path``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

SCENARIOS = Path(__file__).resolve().parent / "data" / "tolerant"
AUTOCAST = SCENARIOS / "autocast_block.py"
TP_MLP = SCENARIOS / "tp_mlp.py"
GPT = SCENARIOS.parent.parent / "cuda_scenarios" / "gpt_numerics.py"
MLP = SCENARIOS.parent / "cross_version" / "mlp.py"
ADAM = SCENARIOS / "adam_bn.py"
SOLVE = SCENARIOS / "solve.py"
ATTENTION = SCENARIOS / "attention_views.py"
SHIFTED = SCENARIOS / "shifted_views.py"
SHIFTED_KINDS = ("slice", "narrow", "select", "as_strided")

# run name -> (ranks, the script and its arguments)
RUNS: dict[str, tuple[int, tuple[str, ...]]] = {
    "fp32": (1, (str(AUTOCAST),)),
    "bf16": (1, (str(AUTOCAST), "--autocast")),
    "bf16_eps": (1, (str(AUTOCAST), "--autocast", "--eps", "1e-3")),
    "tp1": (1, (str(TP_MLP),)),
    "tp2": (2, (str(TP_MLP),)),
    "tp2_bug": (2, (str(TP_MLP), "--bug")),
    "gpt": (1, (str(GPT),)),
    "gpt_fused": (1, (str(GPT), "--optimizer", "fused")),
    "gpt_flash": (1, (str(GPT), "--backend", "flash")),
    "gpt_scale": (1, (str(GPT), "--backend", "flash", "--scale", "0.2")),
    "mlp": (1, (str(MLP),)),
    "mlp_momentum": (1, (str(MLP), "--momentum-from-step-1", "0.8")),
    "bf16_nudge": (1, (str(AUTOCAST), "--autocast", "--nudge", "1e-2")),
    "adam": (1, (str(ADAM),)),
    "adam_perturbed": (1, (str(ADAM),)),
    "solve": (1, (str(SOLVE),)),
    "solve_perturbed": (1, (str(SOLVE),)),
    "solve_control": (1, (str(SOLVE),)),
    "solve_nudge": (1, (str(SOLVE), "--nudge", "1e-2")),
    "attention": (1, (str(ATTENTION),)),
    "attention_bf16": (1, (str(ATTENTION), "--autocast")),
    "attention_bf16_decay": (1, (str(ATTENTION), "--autocast", "--weight-decay", "0.1")),
    "attention_math": (1, (str(ATTENTION), "--attention", "math")),
    "attention_reshaped": (1, (str(ATTENTION), "--extra-view")),
    "shifted": (1, (str(SHIFTED),)),
    **{f"shifted_{kind}": (1, (str(SHIFTED), "--shift", kind)) for kind in SHIFTED_KINDS},
}
# opguard record's own options of a run: the runs that perturb rounding (each its own seed)
RECORD_OPTIONS: dict[str, tuple[str, ...]] = {
    "adam_perturbed": ("--perturb-rounding", "1"),
    "solve_perturbed": ("--perturb-rounding", "1"),
    "solve_control": ("--perturb-rounding", "2"),
    "attention_reshaped": ("--perturb-rounding", "1"),
    "shifted": ("--perturb-rounding", "1"),
}


def record_command(name: str, run_dir: Path, options: tuple[str, ...] = ()) -> list[str]:
    """``opguard record OPTIONS`` of run ``name`` into ``run_dir``, as a user types it
    (torchrun for the two-rank runs), with the run's own options (:data:`RECORD_OPTIONS`)."""
    ranks, script = RUNS[name]
    options = (*options, *RECORD_OPTIONS.get(name, ()))
    launcher: tuple[str, ...] = ()
    if ranks > 1:
        torchrun = str(Path(sys.executable).with_name("torchrun"))
        launcher = (torchrun, "--standalone", "--nproc-per-node", str(ranks))
    record = [sys.executable, "-m", "opguard", "record", "-o", str(run_dir), *options, "--"]
    return [*record, *launcher, *script]


def record_runs(
    root: Path, names: list[str], options: tuple[str, ...] = (), timeout: float = 300
) -> dict[str, Path]:
    """Records the runs ``names`` under ``root`` with ``opguard record OPTIONS``, all at once,
    and returns their directories."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    jobs = {
        name: subprocess.Popen(  # cwd=root: never the repository root (see conftest.run_cli)
            record_command(name, root / name, options),
            cwd=root,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for name in names
    }
    for name, job in jobs.items():
        out, _ = job.communicate(timeout=timeout)
        if job.returncode != 0:
            raise RuntimeError(f"recording {name} failed:\n{out}")
    return {name: root / name for name in names}
