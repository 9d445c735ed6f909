"""The overlapped-communication race of production training, small: a batched ``torch.matmul``
on the default stream (an ``mm`` whose output the matmul returns through ``_unsafe_view``) is
reduced on a side stream. ``sync``: the side stream waits for the default stream first
(correct); ``race``: it does not, so the reduction reads the buffer while the ``mm`` that writes
it is still queued behind a busy kernel, and sums what the allocator left there."""

import sys

import torch

torch.manual_seed(0)
x = torch.randn(8, 512, 1024, device="cuda")
w = torch.randn(1024, 1024, device="cuda")
side = torch.cuda.Stream()
# Load the kernels now: CUDA loads a kernel's module on its first launch, and that load waits
# for the whole device, which would order the read after the write.
torch.matmul(x, w).sum()
# What the buffer holds before the matmul writes it: the allocator hands the freed block back.
torch.full((8, 512, 1024), 3.0, device="cuda")
torch.cuda.synchronize()
torch.cuda._sleep(20_000_000)  # keeps the default stream busy for ~10 ms
y = torch.matmul(x, w)  # mm, then _unsafe_view to [8, 512, 1024]: queued behind the sleep
if sys.argv[1] == "sync":
    side.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(side):
    total = y.sum()  # the read
torch.cuda.current_stream().wait_stream(side)
print(total.item())
