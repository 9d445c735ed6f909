"""A tiny causal-attention language model (an embedding tied to the head, one pre-norm block)
trained for two AdamW steps on the CPU, seeded: issue 38's pairs whose tensors are read through
views the sketches do not measure.

    attention_views.py                        # fp32, scaled_dot_product_attention
    attention_views.py --autocast             # bf16 autocast: the tied head reads a cast of
                                              # the transposed embedding, made in one run only
    attention_views.py --autocast --weight-decay 0.1   # and a real change: the weight decay
    attention_views.py --attention math       # attention written out (another backend): its
                                              # gradients are views stacked, of other ops
    attention_views.py --extra-view           # a reshape only one run makes (as another torch
                                              # build's autograd may): the attention backward
                                              # reads its gradient through it

Each variant differs from the first by rounding alone, except ``--weight-decay``. In each, a
differing tensor some op reads has no distance: a view in one run (its values were never read,
and its base's sketch is keyed in the base's order), written in the other by ops of that run
only. ``opguard diff --tolerant`` judges it by what it feeds.
"""

import argparse
import contextlib

import torch
import torch.nn.functional as F
from torch import nn

VOCAB, WIDTH, HEADS, TOKENS, BATCH, STEPS = 64, 32, 2, 8, 4, 2


class Block(nn.Module):
    def __init__(self, attention: str, extra_view: bool) -> None:
        super().__init__()
        self.attention, self.extra_view = attention, extra_view
        self.norm1, self.norm2 = nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH)
        self.qkv, self.proj = nn.Linear(WIDTH, 3 * WIDTH), nn.Linear(WIDTH, WIDTH)
        self.fc, self.out = nn.Linear(WIDTH, 4 * WIDTH), nn.Linear(4 * WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch = x.shape[0]
        qkv = self.qkv(self.norm1(x)).view(batch, TOKENS, 3, HEADS, -1)
        q, k, v = qkv.permute(2, 0, 3, 1, 4)
        if self.attention == "sdpa":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            scores = (q @ k.transpose(-2, -1)) * (q.shape[-1] ** -0.5)
            future = torch.ones(TOKENS, TOKENS, dtype=torch.bool).triu(1)
            y = torch.softmax(scores.masked_fill(future, float("-inf")), -1) @ v
        if self.extra_view:
            y = y.view(y.shape)
        x = x + self.proj(y.transpose(1, 2).reshape(batch, TOKENS, WIDTH))
        return x + self.out(F.gelu(self.fc(self.norm2(x))))


class LanguageModel(nn.Module):
    def __init__(self, attention: str, extra_view: bool) -> None:
        super().__init__()
        self.embedding = nn.Embedding(VOCAB, WIDTH)
        self.block = Block(attention, extra_view)
        self.norm = nn.LayerNorm(WIDTH)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.norm(self.block(self.embedding(ids))) @ self.embedding.weight.t()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--autocast", action="store_true", help="bf16 autocast on the CPU")
    parser.add_argument("--weight-decay", type=float, default=0.01)
    parser.add_argument("--attention", choices=("sdpa", "math"), default="sdpa")
    parser.add_argument("--extra-view", action="store_true", help="a reshape of one run only")
    args = parser.parse_args()
    torch.manual_seed(0)
    model = LanguageModel(args.attention, args.extra_view)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=args.weight_decay)
    ids = torch.randint(0, VOCAB, (STEPS, BATCH, TOKENS + 1))
    precision = (
        torch.autocast("cpu", dtype=torch.bfloat16) if args.autocast else contextlib.nullcontext()
    )
    for step in range(STEPS):
        with precision:
            logits = model(ids[step, :, :-1])
        loss = F.cross_entropy(logits.float().reshape(-1, VOCAB), ids[step, :, 1:].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"step {step} loss {loss.item():.6f}")


if __name__ == "__main__":
    main()
