"""A tiny MLP with a GELU, two SGD steps on the CPU, seeded: the script behind the cross-version
fixture. The same script recorded with two torch builds (on two machines) must be named an
origin whose likely cause is the environment, not an unrecorded write.

Record it with each torch, from the repository root, and keep the traces here:

    opguard record -o tests/data/cross_version/torch-$(python -c 'import torch; print(".".join(torch.__version__.split(".")[:2]))') -- tests/data/cross_version/mlp.py
"""

import torch

torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.GELU(), torch.nn.Linear(32, 4))
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
data = torch.randn(8, 16)
target = torch.randn(8, 4)
for step in range(2):
    loss = torch.nn.functional.mse_loss(model(data), target)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print(f"step {step} loss {loss.item():.6f}")
