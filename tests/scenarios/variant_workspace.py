"""base.py logging through two custom ops, the first of which returns a workspace it never writes
(compared with variant_workspace_ballast.py). Changes no numerics.
"""

import torch
import torch.nn.functional as F
from torch import nn

SCRATCH = 1000  # CHANGED: the custom ops below, used to log the logits' direction


@torch.library.custom_op("scenario::normalized", mutates_args=())  # CHANGED
def normalized(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # CHANGED
    # x / |x|, and a workspace the kernel returns but never writes  # CHANGED
    return x / x.norm(), torch.empty(SCRATCH)  # CHANGED


@torch.library.custom_op("scenario::peak", mutates_args=())  # CHANGED
def peak(x: torch.Tensor, workspace: torch.Tensor) -> torch.Tensor:  # CHANGED
    return x.abs().max()  # CHANGED: takes the workspace, ignores its values


STEPS, BATCH, GROUPS, FEATURES, CLASSES = 4, 6, 2, 8, 4


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = nn.Linear(FEATURES, 16)  # <- fc1
        self.fc2 = nn.Linear(16, 16)
        self.head = nn.Linear(16, CLASSES)
        self.drop = nn.Dropout(0.25)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x.view(-1, FEATURES)  # <- flatten
        h = F.gelu(self.fc1(x))  # <- activation
        h = self.drop(h)  # <- dropout
        h = torch.relu(self.fc2(h))  # <- relu
        return self.head(h)  # <- head


def main() -> None:
    torch.manual_seed(0)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)  # <- lr
    inputs = torch.randn(STEPS, BATCH, GROUPS, FEATURES)
    targets = torch.randint(0, CLASSES, (STEPS, BATCH * GROUPS))
    torch.manual_seed(1)  # <- seed
    model.train()  # <- mode
    for step in range(STEPS):
        logits = model(inputs[step])  # <- model
        loss = F.cross_entropy(logits, targets[step])  # <- loss
        opt.zero_grad()  # <- zero_grad
        loss.backward()  # <- backward
        direction, workspace = normalized(logits.detach())  # <- normalized  CHANGED
        top = peak(direction, workspace)  # <- peak  CHANGED
        opt.step()  # <- opt.step
        print(f"step {step} loss {loss.item():.6f} peak {top.item():.6f}")  # CHANGED


if __name__ == "__main__":
    main()
