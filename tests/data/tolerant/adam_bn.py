"""AdamW's first steps on gradients some of whose elements are rounding noise: an MLP whose input
has a constant feature (a column of ones: the first layer's bias) feeding a BatchNorm, trained
for three AdamW steps on the CPU, seeded.

    adam_bn.py

The constant feature's weights get the gradient ``sum over the batch of grad_output``, which
the BatchNorm makes zero but for rounding: elements of pure noise inside a weight gradient whose
other elements are not, so the gradient tensor's relative difference is a rounding's. AdamW divides each gradient element by its own magnitude
(``m / (sqrt(v) + eps)``): where the noise changes sign between two runs, the update does by
twice the learning rate, though the gradient tensor moved by a rounding. Recorded plainly and
with ``opguard record --perturb-rounding SEED`` (one-ulp noise on the ops that round), the pair
differs by rounding alone.
"""

import torch
import torch.nn.functional as F
from torch import nn

FEATURES, HIDDEN, CLASSES, BATCH, STEPS = 16, 32, 4, 64, 3


def main() -> None:
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(FEATURES, HIDDEN, bias=False),
        nn.BatchNorm1d(HIDDEN),
        nn.Tanh(),
        nn.Linear(HIDDEN, CLASSES),
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.randn(STEPS, BATCH, FEATURES)
    data[..., 0] = 1.0  # the constant feature
    target = torch.randint(0, CLASSES, (STEPS, BATCH))
    for step in range(STEPS):
        loss = F.cross_entropy(model(data[step]), target[step])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"step {step} loss {loss.item():.6f}")


if __name__ == "__main__":
    main()
