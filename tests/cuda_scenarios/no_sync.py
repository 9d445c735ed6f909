"""Records GPU training steps with CUDA's sync debug mode set to error: any host
synchronisation inside the recorder would raise."""

import sys

import torch
from torch import nn

import opguard

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 10)).cuda()
opt = torch.optim.SGD(model.parameters(), lr=1e-2)
data = torch.randn(32, 64, device="cuda")
labels = torch.randint(0, 10, (32,), device="cuda")
with opguard.record(sys.argv[1], overwrite=True) as session:
    torch.cuda.set_sync_debug_mode("error")
    for _ in range(3):
        loss = nn.functional.cross_entropy(model(data), labels)
        opt.zero_grad()
        loss.backward()
        opt.step()
    torch.cuda.set_sync_debug_mode("default")
assert session.failure is None, session.failure
print(session.writer.records_written, "ops recorded")
