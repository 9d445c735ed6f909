"""Calibrates the tolerant diff's rule ``d_out <= A * d_in + R * u`` (opguard/analysis/tolerant/rule.py)
on rounding-only pairs: a small MLP trained a few steps in float32 twice, once as PyTorch computes
it (run A) and once with every op computed in float64 and rounded to float32 (run B: another,
correctly rounded implementation of every kernel). Both runs execute the same ops in the same
order, so op k of one is op k of the other; for each op with floating-point outputs it measures
the true relative L2 distances (no sketch) of its inputs (``d_in``, the largest) and outputs
(``d_out``), and prints, per op, the amplification ``d_out / d_in`` and the rounding left over
``(d_out - A * d_in) / u``, then the largest of each.

    python bench/tolerant_calibration.py [--steps 3] [--width 256] [--momentum-b 0.9]

``--momentum-b 0.8`` makes run B a real change (SGD momentum): its optimizer ops then leave far
more than rounding over.
"""

from __future__ import annotations

import argparse
import math

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_map

from opguard.analysis.tolerant.rule import A_FACTOR, R_FACTOR

U32 = 2.0**-24


class Tape(TorchDispatchMode):
    """Keeps each op's name, floating-point inputs and outputs (copies); ``exact``: computes
    float32 ops in float64 and rounds their results to float32."""

    def __init__(self, exact: bool) -> None:
        super().__init__()
        self.exact = exact
        self.ops: list[tuple[str, list[torch.Tensor], list[torch.Tensor]]] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
        kwargs = kwargs or {}
        floats = [
            t.detach().clone()
            for t in _tensors((args, kwargs))
            if t.is_floating_point() and t.numel()
        ]
        if self.exact and func._schema.name not in {"aten::copy_", "aten::_to_copy"}:
            out = self._exact(func, args, kwargs)
        else:
            out = func(*args, **kwargs)
        outputs = [t.detach().clone() for t in _tensors(out) if t.is_floating_point() and t.numel()]
        self.ops.append((func._schema.name, floats, outputs))
        return out

    def _exact(self, func, args, kwargs):  # type: ignore[no-untyped-def]
        up = lambda t: t.double() if isinstance(t, torch.Tensor) and t.dtype == torch.float32 else t  # noqa: E731
        mutated = [a for a in _tensors(args) if a.dtype == torch.float32]
        try:
            wide = func(*tree_map(up, args), **tree_map(up, kwargs))
        except (RuntimeError, TypeError):
            return func(*args, **kwargs)
        if func._schema.is_mutable:  # in place: write the rounded result back
            result = func(*args, **kwargs)
            first = next(iter(_tensors(wide)), None)
            if first is not None and mutated and first.shape == mutated[0].shape:
                mutated[0].copy_(first.float())
            return result
        return tree_map(
            lambda t: t.float() if isinstance(t, torch.Tensor) and t.dtype == torch.float64 else t,
            wide,
        )


def _tensors(tree: object) -> list[torch.Tensor]:
    found: list[torch.Tensor] = []
    tree_map(lambda t: found.append(t) if isinstance(t, torch.Tensor) else None, tree)
    return found


def train(exact: bool, steps: int, width: int, momentum: float) -> Tape:
    torch.manual_seed(0)
    model = torch.nn.Sequential(
        torch.nn.Linear(width, 4 * width),
        torch.nn.GELU(),
        torch.nn.LayerNorm(4 * width),
        torch.nn.Linear(4 * width, 10),
    )
    data = torch.randn(64, width)
    target = torch.randint(0, 10, (64,))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=momentum, foreach=False)
    tape = Tape(exact)
    with tape:
        for step in range(steps):
            if step == 1:
                for group in optimizer.param_groups:
                    group["momentum"] = momentum
            optimizer.zero_grad()
            loss = torch.nn.functional.cross_entropy(model(data), target)
            loss.backward()
            optimizer.step()
    return tape


def relative(a: torch.Tensor, b: torch.Tensor) -> float:
    if a.shape != b.shape:
        return math.nan
    norm = a.double().norm().item()
    diff = (a.double() - b.double()).norm().item()
    return diff / norm if norm else (0.0 if diff == 0 else math.inf)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--momentum-b", type=float, default=0.9)
    args = parser.parse_args()
    run_a = train(False, args.steps, args.width, 0.9)
    run_b = train(True, args.steps, args.width, args.momentum_b)
    assert [n for n, _, _ in run_a.ops] == [n for n, _, _ in run_b.ops], "op sequences differ"
    amplifications, leftovers, worst = [], [], []
    for (name, ins_a, outs_a), (_, ins_b, outs_b) in zip(run_a.ops, run_b.ops, strict=True):
        if not outs_a:
            continue
        d_in = max((relative(a, b) for a, b in zip(ins_a, ins_b, strict=True)), default=0.0)
        d_out = max(relative(a, b) for a, b in zip(outs_a, outs_b, strict=True))
        if not (math.isfinite(d_in) and math.isfinite(d_out)) or d_out == 0:
            continue
        leftover = (d_out - A_FACTOR * d_in) / U32
        leftovers.append(leftover)
        if d_in > 0:
            amplifications.append(d_out / d_in)
        worst.append((leftover, name, d_in, d_out))
    worst.sort(reverse=True)
    print(f"{len(leftovers)} differing ops; rule A = {A_FACTOR:g}, R = {R_FACTOR:g}")
    for leftover, name, d_in, d_out in worst[:8]:
        amp = d_out / d_in if d_in else math.inf
        print(
            f"  {name:40s} d_in {d_in:.2e} d_out {d_out:.2e} amp {amp:8.3g} left {leftover:8.3g} u"
        )
    amplifications.sort()
    if amplifications:
        median = amplifications[len(amplifications) // 2]
        print(f"amplification d_out/d_in: median {median:.3g}, max {amplifications[-1]:.3g}")
    print(f"left over past A*d_in, in u: max {max(leftovers):.3g} (rule allows {R_FACTOR:g})")


if __name__ == "__main__":
    main()
