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

The GPU runs (``gpu_*``, issue 38's calibration: :data:`GPU_PAIRS`) need CUDA; half of their
pairs are the calibration's fit, the other half held out (``tests/test_cuda.py`` holds them).

Test code, not shipped: tests import it, and benchmarks (``bench/tolerant_pairs.py``) put
``tests/`` on ``sys.path``.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import warm
from run_once import BATCH_TIMEOUT

SCENARIOS = Path(__file__).resolve().parent / "data" / "tolerant"
AUTOCAST = SCENARIOS / "autocast_block.py"
TP_MLP = SCENARIOS / "tp_mlp.py"
GPT = SCENARIOS.parent.parent / "cuda_scenarios" / "gpt_numerics.py"
GPT2 = SCENARIOS.parent.parent / "cuda_scenarios" / "gpt2_long.py"
MLP = SCENARIOS.parent / "cross_version" / "mlp.py"
HF = SCENARIOS.parent / "cross_version" / "hf_models.py"
ADAM = SCENARIOS / "adam_bn.py"
SOLVE = SCENARIOS / "solve.py"
ATTENTION = SCENARIOS / "attention_views.py"
SHIFTED = SCENARIOS / "shifted_views.py"
SHIFTED_KINDS = ("slice", "narrow", "select", "as_strided")

# GPT-2 124M, two steps of 8 x 1024 tokens: long enough for the memory-efficient attention's
# backward to add in another order from run to run
GPT2_EFFICIENT = (
    str(GPT2),
    "--steps",
    "2",
    "--batch",
    "8",
    "--seq",
    "1024",
    "--attention",
    "efficient",
)
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
    "hf_llama": (1, (str(HF), "llama")),
    "hf_llama_lr": (1, (str(HF), "llama", "--lr-from-step-1", "2e-3")),
    "hf_gpt2": (1, (str(HF), "gpt2")),
    "hf_gpt2_lr": (1, (str(HF), "gpt2", "--lr-from-step-1", "2e-3")),
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
    # on the GPU: a small GPT or Llama (gpt_numerics.py), GPT-2 124M with dropout (gpt2_long.py)
    "gpu_ref": (1, (str(GPT),)),
    "gpu_tf32": (1, (str(GPT), "--tf32")),
    "gpu_fused": (1, (str(GPT), "--optimizer", "fused")),
    "gpu_efficient": (1, (str(GPT), "--backend", "efficient")),
    "gpu_scale": (1, (str(GPT), "--backend", "efficient", "--scale", "0.2")),
    "gpu_efficient_lr": (1, (str(GPT), "--backend", "efficient", "--lr", "2e-3")),
    "gpu_bf16": (1, (str(GPT), "--bf16")),
    "gpu_bf16_wd": (1, (str(GPT), "--bf16", "--weight-decay", "0.1")),
    "gpu_llama": (1, (str(GPT), "--arch", "llama")),
    "gpu_llama_bf16": (1, (str(GPT), "--arch", "llama", "--bf16")),
    "gpu_llama_flash": (1, (str(GPT), "--arch", "llama", "--bf16", "--backend", "flash")),
    "gpu_llama_eps": (
        1,
        (str(GPT), "--arch", "llama", "--bf16", "--backend", "flash", "--eps", "1e-3"),
    ),
    "gpu_index_add": (1, (str(GPT), "--index-add", "--tf32")),
    "gpu_index_add_again": (1, (str(GPT), "--index-add", "--tf32")),
    "gpu_index_add_lr": (1, (str(GPT), "--index-add", "--tf32", "--lr", "2e-3")),
    "gpu_gpt2": (1, GPT2_EFFICIENT),
    "gpu_gpt2_again": (1, GPT2_EFFICIENT),
    "gpu_gpt2_scaled": (1, (*GPT2_EFFICIENT, "--scale-at", "1")),
}
# opguard record's own options of a run: the runs that perturb rounding (each its own seed)
RECORD_OPTIONS: dict[str, tuple[str, ...]] = {
    "adam_perturbed": ("--perturb-rounding", "1"),
    "solve_perturbed": ("--perturb-rounding", "1"),
    "solve_control": ("--perturb-rounding", "2"),
    "attention_reshaped": ("--perturb-rounding", "1"),
    "shifted": ("--perturb-rounding", "1"),
}


@dataclass(frozen=True)
class GpuPair:
    """A GPU pair of issue 38's calibration and the answer it must get: within rounding
    (``kind`` None), or the real change named (its kind, the op's name containing ``op``, its
    step); ``held_out`` pairs were not looked at while the bounds were fitted."""

    a: str
    b: str
    held_out: bool
    kind: str | None = None
    op: str = ""
    step: int = 0

    def check(self, out: dict[str, Any]) -> tuple[bool, str]:
        """Whether ``opguard diff --tolerant --json``'s ``out`` is this pair's answer, and what
        it said (the first divergence's kind, op, step and line)."""
        first = out.get("first_divergence")
        if first is None:
            return self.kind is None and out["verdict"] == "within-rounding", out["verdict"]
        side = first.get("a") or first.get("b") or {}
        site = side.get("call_site") or {}
        said = f"{first['kind']} at {side.get('op', '?')} step {first['step']}, "
        said += f"{Path(site.get('file') or '?').name}:{site.get('line')}"
        said += f" ({side['source']})" if side.get("source") else ""
        expected = (self.kind, self.step)
        right = (first["kind"], first["step"]) == expected and self.op in side.get("op", "")
        return right, said


GPU_PAIRS: dict[str, GpuPair] = {
    # the fit: TF32, bf16 autocast, another attention kernel, atomics, GPT-2 with dropout
    "tf32": GpuPair("gpu_ref", "gpu_tf32", held_out=False),
    "bf16": GpuPair("gpu_ref", "gpu_bf16", held_out=False),
    "bf16+weight_decay": GpuPair("gpu_ref", "gpu_bf16_wd", False, "argument", "_foreach_mul_"),
    "efficient": GpuPair("gpu_ref", "gpu_efficient", held_out=False),
    "efficient+scale": GpuPair("gpu_efficient", "gpu_scale", False, "argument", "attention"),
    "llama bf16": GpuPair("gpu_llama", "gpu_llama_bf16", held_out=False),
    "index_add": GpuPair("gpu_index_add", "gpu_index_add_again", held_out=False),
    "gpt2 efficient": GpuPair("gpu_gpt2", "gpu_gpt2_again", held_out=False),
    # held out
    "fused": GpuPair("gpu_ref", "gpu_fused", held_out=True),
    "efficient+lr": GpuPair("gpu_ref", "gpu_efficient_lr", True, "argument", "_foreach_mul_"),
    "llama flash": GpuPair("gpu_llama_bf16", "gpu_llama_flash", held_out=True),
    "llama flash+eps": GpuPair("gpu_llama_bf16", "gpu_llama_eps", True, "argument", "add"),
    "tf32 bf16": GpuPair("gpu_tf32", "gpu_bf16", held_out=True),
    "index_add+lr": GpuPair("gpu_index_add", "gpu_index_add_lr", True, "argument", "_foreach_mul_"),
    "gpt2 efficient+scale": GpuPair("gpu_gpt2", "gpu_gpt2_scaled", True, "argument", "mul", 1),
    "llama": GpuPair("gpu_llama", "gpu_llama_flash", held_out=True),
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


def record_runs(root: Path, names: list[str], options: tuple[str, ...] = ()) -> dict[str, Path]:
    """Records the runs ``names`` under ``root`` with ``opguard record OPTIONS``, all at once,
    and returns their directories."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    jobs = {  # cwd=root: never the repository root (see conftest.run_cli)
        name: warm.Popen(record_command(name, root / name, options), cwd=root, env=env)
        for name in names
    }
    for name, job in jobs.items():
        out, err = job.communicate(timeout=BATCH_TIMEOUT)
        if job.returncode != 0:
            raise RuntimeError(f"recording {name} failed:\n{out}{err}")
    return {name: root / name for name in names}
