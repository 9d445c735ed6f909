"""A small CNN with BatchNorm, SGD with momentum and a StepLR schedule, whose loss adds an L2
penalty summed over the parameters; ``--reversed`` sums the same squares in the other order.
The runs compute the same things in another order: the penalty's partial sums differ, its total
only in the last bits (the gradients do not depend on the order at all).

    penalty.py [--reversed]
"""

import argparse

import torch
import torch.nn.functional as F
from torch import nn


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, 8, 3, padding=1)
        self.norm = nn.BatchNorm2d(8)
        self.fc = nn.Linear(8 * 8 * 8, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.relu(self.norm(self.conv(x))).flatten(1))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--reversed", action="store_true", help="sum the penalty backwards")
    args = parser.parse_args()
    torch.manual_seed(0)
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    schedule = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    images, labels = torch.randn(16, 3, 8, 8), torch.randint(0, 10, (16,))
    for step in range(3):
        params = list(model.parameters())
        if args.reversed:
            params.reverse()
        penalty = sum(p.pow(2).sum() for p in params)  # <- penalty
        loss = F.cross_entropy(model(images), labels) + 1e-3 * penalty
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
        print(f"step {step} loss {loss.item():.6f}")


if __name__ == "__main__":
    main()
