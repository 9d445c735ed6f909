"""A side stream reads a buffer the default stream is still overwriting. argv[1] == "wait"
adds the missing ``wait_stream`` (the correct program); "race" leaves it out."""

import sys

import torch

torch.manual_seed(0)
x = torch.zeros(1 << 24, device="cuda")
new = torch.randn(1 << 24, device="cuda")
side = torch.cuda.Stream()
torch.cuda.synchronize()
torch.cuda._sleep(50_000_000)  # keep the default stream busy so the write lands late
x.copy_(new)
if sys.argv[1] == "wait":
    side.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(side):
    y = x * 3
torch.cuda.synchronize()
print(y.sum().item())
