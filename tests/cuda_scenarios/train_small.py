"""A small GPU training loop printing exact losses (float.hex)."""

import torch
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(
    nn.Linear(64, 256), nn.GELU(), nn.Dropout(0.1), nn.LayerNorm(256), nn.Linear(256, 10)
).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
data = torch.randn(6, 32, 64, device="cuda")
labels = torch.randint(0, 10, (6, 32), device="cuda")
for step in range(6):
    loss = nn.functional.cross_entropy(model(data[step]), labels[step])
    opt.zero_grad()
    loss.backward()
    opt.step()
    print(step, loss.item().hex())
