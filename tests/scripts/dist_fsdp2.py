"""A 2-rank FSDP2 (fully_shard) training loop on gloo: parameters sharded across the ranks,
gathered for each layer, gradients reduce-scattered. ``--shift-rank K`` makes rank K read a
different data shard."""

import argparse

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard

parser = argparse.ArgumentParser()
parser.add_argument("--shift-rank", type=int, default=-1)
args = parser.parse_args()
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
for layer in model:
    if isinstance(layer, torch.nn.Linear):
        fully_shard(layer)
fully_shard(model)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
shard = rank + (100 if rank == args.shift_rank else 0)
for step in range(2):
    generator = torch.Generator().manual_seed(shard * 10 + step)
    x = torch.randn(4, 8, generator=generator)  # <- data
    loss = model(x).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
dist.destroy_process_group()
