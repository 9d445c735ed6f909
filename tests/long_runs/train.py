"""A long run in miniature for issue 28's acceptance tests (tests/test_hunt.py): a tiny MLP
trained for 400 SGD steps (momentum) in a few seconds, each step on its own batch (drawn from a
generator seeded by the step number, so a resumed run sees the batches the original saw).

    train.py [--steps 400] [--scale-at K [--scale 1.0001]] [--lr-at K] [--once FILE]
             [--checkpoint-at K --checkpoint PATH] [--resume PATH [--renumber]]

``--scale-at K``: step K's loss is multiplied by 1.0001 (every step multiplies it, by 1.0
elsewhere, so both runs hold the same ops); ``--lr-at K``: step K's learning rate is 1.5 times
the others' (the gradients stay equal, the update differs); ``--once FILE``: the change is made
only while FILE does not exist, and FILE is created (a change that a second run does not
repeat, as a nondeterministic cause behaves). ``--checkpoint-at K``: saves the model, optimizer
and RNG state as step K starts; ``--resume``: starts from such a checkpoint, at its step, and
with ``--renumber`` says so with ``opguard.step(K)`` (else ``opguard record --first-step K``
does). Prints the last step's loss.
"""

from __future__ import annotations

import argparse
import os

import torch
import torch.nn.functional as F
from torch import nn

LR = 0.05


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(torch.tanh(self.fc1(x)))


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(step)
    x = torch.randn(16, 8, generator=generator)
    return x, x.sum(dim=1, keepdim=True).sin()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--scale-at", type=int, default=-1)
    parser.add_argument("--scale", type=float, default=1.0001)
    parser.add_argument("--lr-at", type=int, default=-1)
    parser.add_argument("--once")
    parser.add_argument("--checkpoint-at", type=int, default=-1)
    parser.add_argument("--checkpoint")
    parser.add_argument("--resume")
    parser.add_argument("--renumber", action="store_true")
    args = parser.parse_args()
    change = not (args.once and os.path.exists(args.once))
    if args.once and change:
        open(args.once, "w").close()

    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=0.9)
    first = 0
    if args.resume:
        saved = torch.load(args.resume, weights_only=False)
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["optimizer"])
        torch.set_rng_state(saved["rng"])
        first = saved["step"]
        if args.renumber:
            import opguard

            opguard.step(first)
    loss = torch.zeros(())
    for step in range(first, args.steps):
        if step == args.checkpoint_at:
            state = {"model": model.state_dict(), "optimizer": opt.state_dict()}
            torch.save({**state, "rng": torch.get_rng_state(), "step": step}, args.checkpoint)
        x, y = batch(step)
        scale = args.scale if change and step == args.scale_at else 1.0
        loss = F.mse_loss(model(x), y) * scale  # <- scale
        opt.zero_grad()
        loss.backward()
        for group in opt.param_groups:
            group["lr"] = LR * 1.5 if change and step == args.lr_at else LR
        opt.step()  # <- opt.step
    print(f"loss {loss.item():.6f}")


if __name__ == "__main__":
    main()
