"""A tiny model trained with torch.compile, for the compiled-code scenarios (tests/test_compiled.py).

Options change one thing each: the activation inside the compiled region, the implementation of
a custom op (``opguard_tests::scale``, opaque to Inductor) it calls, a write into the input
through a NumPy view that no recorded op sees, and the device.
"""

import argparse

import torch
import torch.nn.functional as F

parser = argparse.ArgumentParser()
parser.add_argument("--activation", default="relu")
parser.add_argument("--scale", choices=("multiply", "divide"), default="multiply")
parser.add_argument("--numpy-write", action="store_true")
parser.add_argument("--device", default="cpu")
args = parser.parse_args()


@torch.library.custom_op("opguard_tests::scale", mutates_args=())
def scale(x: torch.Tensor) -> torch.Tensor:
    # x * 0.1 and x / 10 round differently: the same op, another implementation.
    return x * 0.1 if args.scale == "multiply" else x / 10  # <- scale


@scale.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


def _scale_backward(ctx: object, grad: torch.Tensor) -> torch.Tensor:
    return grad * 0.1


scale.register_autograd(_scale_backward)


class Model(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc1 = torch.nn.Linear(8, 16)
        self.norm = torch.nn.LayerNorm(16)
        self.fc2 = torch.nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm(self.fc1(x))
        h = getattr(F, args.activation)(h)  # <- activation
        return self.fc2(scale(h))


torch.manual_seed(0)
model = Model().to(args.device)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
compiled = torch.compile(model)
data = torch.randn(4, 8, device=args.device)
for _ in range(2):
    x = data * 1.5  # <- input
    if args.numpy_write:
        x.numpy()[0, 0] += 1.0  # a write the dispatcher never sees
    loss = compiled(x).square().mean()  # <- model
    opt.zero_grad()
    loss.backward()
    opt.step()
    print(f"loss {loss.item()!r}")  # every bit of it
print(f"weights {sum(p.double().sum().item() for p in model.parameters())!r}")
