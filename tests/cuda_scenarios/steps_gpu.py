"""GPU training steps recorded at step level (``steps``: ``--steps-only``; ``window``: ops of
step 1 of 3 only) with CUDA's sync debug mode set to error: a host synchronisation in the
recorder would raise. Prints ``loss STEP <float.hex>`` per step; saves the last step's
gradients, then the parameters and optimizer states after it, as CPU copies to SAVE.

    python steps_gpu.py RUN_DIR steps|window SAVE
"""

import sys

import torch
from torch import nn

import opguard

run_dir, mode, save = sys.argv[1:4]
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(64, 256), nn.BatchNorm1d(256), nn.ReLU(), nn.Linear(256, 10))
model = model.cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
data = torch.randn(3, 32, 64, device="cuda")
labels = torch.randint(0, 10, (3, 32), device="cuda")
options = {"steps_only": True} if mode == "steps" else {"window": (1, 2)}
losses, grads = [], []
with opguard.record(run_dir, overwrite=True, **options) as session:
    torch.cuda.set_sync_debug_mode("error")
    for step in range(3):
        loss = nn.functional.cross_entropy(model(data[step]), labels[step])
        opt.zero_grad()
        loss.backward()
        grads = [p.grad.clone() for p in model.parameters()]
        opt.step()
        losses.append(loss.detach())
    torch.cuda.set_sync_debug_mode("default")
assert session.failure is None, session.failure
for step, loss in enumerate(losses):
    print("loss", step, loss.item().hex())
torch.save(
    {
        "grads": [g.cpu() for g in grads],
        "params": [p.detach().cpu() for p in model.parameters()],
        "states": [{k: v.cpu() for k, v in opt.state[p].items()} for p in model.parameters()],
    },
    save,
)
