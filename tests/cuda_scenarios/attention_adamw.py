"""A small attention model trained with AdamW on the GPU, memory-efficient attention forced.

With ``dropout_p=0`` that kernel returns its philox seed and offset as ``torch.empty`` scalars it
never writes: their bits are whatever the allocator left there, so runs whose allocation
histories differ "differ" at every attention forward, though the backward ignores them.

    attention_adamw.py foreach|fused [--ballast]

``fused`` steps with the fused AdamW kernel instead of the foreach one (the first real
difference: the optimizer step); ``--ballast`` allocates one extra tensor before the model (an
allocation history of its own, nothing else).
"""

import sys

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

STEPS, BATCH, TOKENS, WIDTH, HEADS = 3, 4, 64, 64, 4


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.qkv = nn.Linear(WIDTH, 3 * WIDTH)
        self.out = nn.Linear(WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(x).view(BATCH, TOKENS, 3, HEADS, -1).permute(2, 0, 3, 1, 4)
        with sdpa_kernel(SDPBackend.EFFICIENT_ATTENTION):
            y = F.scaled_dot_product_attention(q, k, v, dropout_p=0.0)  # <- attention
        return x + self.out(y.transpose(1, 2).reshape(BATCH, TOKENS, WIDTH))


def main() -> None:
    optimizer, ballast = sys.argv[1], "--ballast" in sys.argv
    torch.manual_seed(0)
    kept = torch.empty(3 << 20, device="cuda") if ballast else None  # noqa: F841
    model = nn.Sequential(Block(), Block()).cuda()
    opt = torch.optim.AdamW(
        model.parameters(), lr=1e-3, foreach=optimizer == "foreach", fused=optimizer == "fused"
    )
    data = torch.randn(STEPS, BATCH, TOKENS, WIDTH, device="cuda")
    for step in range(STEPS):
        loss = model(data[step]).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()  # <- opt.step
        print(f"step {step} loss {loss.item():.6f}")


if __name__ == "__main__":
    main()
