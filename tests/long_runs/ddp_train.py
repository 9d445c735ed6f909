"""A 2-rank DistributedDataParallel run on gloo (CPU) for tests/test_hunt.py: each rank trains
on its own batches (seeded by rank and step), DDP averages the gradients in backward.

    torchrun --nproc-per-node 2 ddp_train.py [--steps 30] [--lr-rank R --lr-at K]

``--lr-rank R --lr-at K``: rank R alone takes step K with 1.5 times the learning rate (a
rank-local schedule slip): its parameters part from the other rank's at step K, and through
DDP's all-reduce every rank's gradients from step K+1 on.
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

LR = 0.05

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=30)
parser.add_argument("--lr-rank", type=int, default=-1)
parser.add_argument("--lr-at", type=int, default=-1)
args = parser.parse_args()

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
ddp = DistributedDataParallel(model)
opt = torch.optim.SGD(ddp.parameters(), lr=LR, momentum=0.9)
for step in range(args.steps):
    x = torch.randn(8, 4, generator=torch.Generator().manual_seed(1000 * rank + step))
    loss = ddp(x).sub(x.sum(dim=1, keepdim=True).sin()).pow(2).mean()
    opt.zero_grad()
    loss.backward()
    slip = rank == args.lr_rank and step == args.lr_at
    for group in opt.param_groups:
        group["lr"] = LR * 1.5 if slip else LR
    opt.step()  # <- opt.step
dist.destroy_process_group()
