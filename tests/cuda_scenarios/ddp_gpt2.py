"""GPT-2 small (124M, transformers, from a config) trained with DistributedDataParallel over
NCCL, one GPU per rank, each rank on its own data. ``--tf32-rank K``: rank K alone lets its
matmuls use TF32, a rank-local setting slip that DDP's gradient all-reduce spreads to every rank.
Rank 0 prints each step's loss bits."""

import argparse
import os

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel
from transformers import GPT2Config, GPT2LMHeadModel

parser = argparse.ArgumentParser()
parser.add_argument("--tf32-rank", type=int, default=-1)
parser.add_argument("--steps", type=int, default=2)
args = parser.parse_args()

dist.init_process_group("nccl")
rank = dist.get_rank()
device = int(os.environ.get("LOCAL_RANK", rank))
torch.cuda.set_device(device)
torch.backends.cuda.matmul.allow_tf32 = rank == args.tf32_rank
torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config(n_positions=256)).cuda()
ddp = DistributedDataParallel(model, device_ids=[device])
optimizer = torch.optim.AdamW(ddp.parameters(), lr=1e-4)
data = torch.Generator(device="cuda").manual_seed(1000 + rank)
for step in range(args.steps):
    tokens = torch.randint(0, model.config.vocab_size, (2, 256), device="cuda", generator=data)
    loss = ddp(tokens, labels=tokens).loss
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    if rank == 0:
        print(f"step {step} loss {loss.item().hex()}")
dist.destroy_process_group()
