"""base.py logging two independent statistics of the logits. Changes no numerics."""

import torch
import torch.nn.functional as F
from torch import nn

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
        std = logits.detach().std()  # CHANGED
        mag = logits.detach().abs().mean()  # CHANGED
        opt.step()  # <- opt.step
        print(f"step {step} loss {loss.item():.6f} {std.item():.4f} {mag.item():.4f}")  # CHANGED


if __name__ == "__main__":
    main()
