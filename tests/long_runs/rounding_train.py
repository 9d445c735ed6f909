"""Runs that differ by rounding over many steps, for the step-level tolerant rule's tests
(tests/test_step_tolerant.py): a small MLP (a LayerNorm between two layers) trained by SGD with
momentum and weight decay, each step on its own batch drawn from a generator seeded by the step
number.

    rounding_train.py [--steps 12] [--rounded] [--lr-from K] [--lr 0.05]

``--rounded``: each batch is taken through ``(x * 3) / 3``, which moves some of its values by
one unit in the last place: the same data up to rounding, as another data-loading path (a
cast, a normalization computed otherwise) gives it, every step, so the two runs' states drift
apart by rounding alone. ``--lr-from K``: from step K on, the learning rate is 1.5 times
``--lr`` (a real change at step K: the gradients of step K are still within rounding, its
update is not). Prints the last step's loss.
"""

from __future__ import annotations

import argparse

import torch
import torch.nn.functional as F
from torch import nn

FEATURES, HIDDEN, OUTPUTS, BATCH = 16, 64, 4, 32


def batch(step: int, rounded: bool) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(step)
    x = torch.randn(BATCH, FEATURES, generator=generator)
    y = torch.randn(BATCH, OUTPUTS, generator=generator)
    return ((x * 3) / 3 if rounded else x), y


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--rounded", action="store_true")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--lr-from", type=int, default=-1)
    args = parser.parse_args()

    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(FEATURES, HIDDEN),
        nn.Tanh(),
        nn.LayerNorm(HIDDEN),
        nn.Linear(HIDDEN, OUTPUTS),
    )
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9, weight_decay=1e-3)
    loss = torch.zeros(())
    for step in range(args.steps):
        changed = 0 <= args.lr_from <= step
        for group in opt.param_groups:
            group["lr"] = args.lr * 1.5 if changed else args.lr  # <- lr
        x, y = batch(step, args.rounded)
        loss = F.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()  # <- opt.step
    print(f"loss {loss.item():.6f}")


if __name__ == "__main__":
    main()
