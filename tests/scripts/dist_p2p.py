"""Rank 0 sends a tensor to rank 1, which computes with it. ``--shift`` changes what rank 0
draws: rank 0 is then the origin, rank 1 a receiver at the receive."""

import argparse

import torch
import torch.distributed as dist

parser = argparse.ArgumentParser()
parser.add_argument("--shift", action="store_true")
args = parser.parse_args()

dist.init_process_group("gloo")
if dist.get_rank() == 0:
    sent = torch.randn(3, generator=torch.Generator().manual_seed(7 if args.shift else 3))
    dist.send(sent, 1)
else:
    received = torch.zeros(3)
    dist.recv(received, 0)
    print((received * 2).sum().item())
dist.destroy_process_group()
