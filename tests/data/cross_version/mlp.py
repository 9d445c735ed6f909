"""A small MLP classifier (GELU, layer norm, cross-entropy), three SGD steps with momentum on the
CPU, seeded: the script behind the cross-version fixture. The same script recorded with two torch builds (on
two machines) must be named an origin whose likely cause is the environment, not an unrecorded
write.

Record it with each torch, from the repository root, and keep the traces here:

    opguard record -o tests/data/cross_version/torch-$(python -c 'import torch; print(".".join(torch.__version__.split(".")[:2]))') -- tests/data/cross_version/mlp.py

(``bash bench/gpu_session.sh fixture`` does it on the GPU machine.) ``--momentum-from-step-1 M``
changes the momentum after the first step: a real change behind the builds' rounding.
"""

import sys

import torch
import torch.nn.functional as F
from torch import nn

torch.manual_seed(0)
model = nn.Sequential(nn.Linear(64, 256), nn.GELU(), nn.LayerNorm(256), nn.Linear(256, 10))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
data = torch.randn(64, 64)
target = torch.randint(0, 10, (64,))
changed = sys.argv.index("--momentum-from-step-1") + 1 if len(sys.argv) > 1 else None
for step in range(3):
    if step == 1 and changed is not None:
        optimizer.param_groups[0]["momentum"] = float(sys.argv[changed])
    loss = F.cross_entropy(model(data), target)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print(f"step {step} loss {loss.item():.6f}")
