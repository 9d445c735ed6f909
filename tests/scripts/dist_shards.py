"""A 2-rank data-parallel training loop on gloo: each rank draws its own data shard, gradients
are averaged with all_reduce. ``--shift-rank K`` makes rank K read a different shard."""

import argparse

import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--shift-rank", type=int, default=-1)
args = parser.parse_args()

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = torch.nn.Linear(4, 2)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
shard = rank + (100 if rank == args.shift_rank else 0)
for step in range(2):
    generator = torch.Generator().manual_seed(shard * 10 + step)
    x = torch.randn(8, 4, generator=generator)  # <- data
    loss = model(x).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    for p in model.parameters():
        dist.all_reduce(p.grad)
        p.grad /= dist.get_world_size()
    optimizer.step()
dist.destroy_process_group()
