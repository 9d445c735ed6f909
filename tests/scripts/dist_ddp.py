"""A 2-rank DistributedDataParallel training loop on gloo (tests/test_long_runs.py): each rank
draws its own data, DDP averages the gradients in backward."""

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
ddp = DistributedDataParallel(model)
optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1, momentum=0.9)
for step in range(2):
    generator = torch.Generator().manual_seed(rank * 10 + step)
    x = torch.randn(8, 4, generator=generator)
    loss = ddp(x).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
dist.destroy_process_group()
