"""A side stream reads a buffer that the default stream is about to overwrite. ``sync``: the side
stream waits for the default stream first (correct); ``race``: it does not, so the read runs
while the write is still queued behind a busy kernel and sees the old contents."""

import sys

import torch

torch.manual_seed(0)
source = torch.randn(1 << 22, device="cuda")
target = torch.zeros(1 << 22, device="cuda")
side = torch.cuda.Stream()
torch.cuda.synchronize()
torch.cuda._sleep(20_000_000)  # keeps the default stream busy for ~10 ms
target.copy_(source)  # the write, queued behind it
if sys.argv[1] == "sync":
    side.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(side):
    total = target.sum()  # the read
torch.cuda.current_stream().wait_stream(side)
print(total.item())
