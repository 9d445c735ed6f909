"""A tiny transformer block (LayerNorm, self-attention, GELU MLP) trained for three AdamW steps on
the CPU, seeded: the bf16-autocast-against-fp32 pair of issue 30.

    autocast_block.py                     # fp32
    autocast_block.py --autocast          # the same model under torch.autocast("cpu", bfloat16)
    autocast_block.py --autocast --eps 1e-3   # and a real change: the first LayerNorm's eps
    autocast_block.py --autocast --nudge 1e-2 # another: one weight changed through NumPy

Recorded with and without ``--autocast``, every op differs by bf16 rounding from the first
matmul on; the pair is expected to be within rounding. ``--eps`` (default 1e-5, the LayerNorm
default) changes one argument inside it: a real change the tolerant diff must name. ``--nudge
REL`` (default 0) adds REL times the norm of the attention's ``qkv.weight`` to its first element
through NumPy after step 0: a real change of REL relative that no recorded op makes, first read
by autocast's cast of the weight in step 1.
"""

import argparse
import contextlib

import torch
import torch.nn.functional as F
from torch import nn

WIDTH, HEADS, TOKENS, BATCH, STEPS = 64, 4, 16, 8, 3


class Block(nn.Module):
    def __init__(self, eps: float) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(WIDTH, eps=eps)
        self.qkv = nn.Linear(WIDTH, 3 * WIDTH)
        self.proj = nn.Linear(WIDTH, WIDTH)
        self.norm2 = nn.LayerNorm(WIDTH)
        self.fc = nn.Linear(WIDTH, 4 * WIDTH)
        self.out = nn.Linear(4 * WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(self.norm1(x)).view(BATCH, TOKENS, 3, HEADS, -1).permute(2, 0, 3, 1, 4)
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(BATCH, TOKENS, WIDTH))
        return x + self.out(F.gelu(self.fc(self.norm2(x))))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--autocast", action="store_true", help="bf16 autocast on the CPU")
    parser.add_argument("--eps", type=float, default=1e-5, help="the first LayerNorm's eps")
    parser.add_argument("--nudge", type=float, default=0.0, help="qkv.weight changed after step 0")
    args = parser.parse_args()
    torch.manual_seed(0)
    model = nn.Sequential(Block(args.eps), nn.LayerNorm(WIDTH), nn.Linear(WIDTH, 10))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.randn(STEPS, BATCH, TOKENS, WIDTH)
    target = torch.randint(0, 10, (STEPS, BATCH * TOKENS))
    precision = (
        torch.autocast("cpu", dtype=torch.bfloat16) if args.autocast else contextlib.nullcontext()
    )
    for step in range(STEPS):
        with precision:
            logits = model(data[step])
        loss = F.cross_entropy(logits.float().view(-1, 10), target[step])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"step {step} loss {loss.item():.6f}")
        if step == 0 and args.nudge:
            weight = model[0].qkv.weight.detach()
            weight.numpy().flat[0] += args.nudge * float(weight.norm())


if __name__ == "__main__":
    main()
