"""A small training loop for the step-level recorder's tests (tests/test_long_runs.py).

A linear layer, a BatchNorm (running stats: buffers), dropout (the CPU generator), a second
linear layer, and a parameter no module owns (its own optimizer group). Prints ``loss STEP
<float.hex>`` and, with ``--show-modes``, ``modes STEP N`` (dispatch modes pushed at the step's
start) per step.

``--optimizer sgd|adam``; ``--save PATH``: the last step's gradients, then the parameters,
optimizer states, buffers and CPU RNG state after it, for the test to fingerprint;
``--checkpoint-at K --checkpoint PATH``: saves model, optimizer and RNG before step K;
``--resume PATH``: starts from that checkpoint at its step, telling OpGuard the step's number
with ``opguard.step(K)`` unless ``--no-renumber`` (then ``opguard record --first-step K`` does);
``--sleep S``: per step.
"""

from __future__ import annotations

import argparse
import time

import torch
from torch import nn


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Dropout(0.2))
        self.head = nn.Linear(8, 2)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--optimizer", choices=("sgd", "adam"), default="sgd")
    parser.add_argument("--save")
    parser.add_argument("--checkpoint-at", type=int)
    parser.add_argument("--checkpoint")
    parser.add_argument("--resume")
    parser.add_argument("--no-renumber", action="store_true")
    parser.add_argument("--show-modes", action="store_true")
    parser.add_argument("--sleep", type=float, default=0.0)
    args = parser.parse_args()

    torch.manual_seed(0)
    model = Net()
    scale = nn.Parameter(torch.ones(1))
    groups = [{"params": model.parameters()}, {"params": [scale]}]
    if args.optimizer == "sgd":
        opt: torch.optim.Optimizer = torch.optim.SGD(groups, lr=0.1, momentum=0.9)
    else:
        opt = torch.optim.Adam(groups, lr=0.01)
    first = 0
    if args.resume:
        saved = torch.load(args.resume, weights_only=False)
        model.load_state_dict(saved["model"])
        scale.data.copy_(saved["scale"])
        opt.load_state_dict(saved["optimizer"])
        torch.set_rng_state(saved["rng"])
        first = saved["step"]
        if not args.no_renumber:
            import opguard

            opguard.step(first)
    grads: list[torch.Tensor] = []
    for step in range(first, args.steps):
        if step == args.checkpoint_at:
            torch.save(
                {
                    "model": model.state_dict(),
                    "scale": scale.detach().clone(),
                    "optimizer": opt.state_dict(),
                    "rng": torch.get_rng_state(),
                    "step": step,
                },
                args.checkpoint,
            )
        if args.show_modes:
            print("modes", step, torch._C._len_torch_dispatch_stack(), flush=True)
        x = torch.randn(6, 4)
        loss = (model(x) * scale).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        grads = [p.grad.clone() for p in [*model.parameters(), scale]]
        opt.step()
        print("loss", step, loss.item().hex(), flush=True)
        time.sleep(args.sleep)
    if args.save:
        torch.save(
            {
                "grads": grads,
                "params": [p.detach().clone() for p in [*model.parameters(), scale]],
                "states": [opt.state[p] for p in [*model.parameters(), scale]],
                "buffers": dict(model.named_buffers()),
                "rng": torch.get_rng_state(),
            },
            args.save,
        )


if __name__ == "__main__":
    main()
