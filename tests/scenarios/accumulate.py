"""A tiny causal language model (two blocks, LayerNorm, attention, GELU MLP) trained with gradient
accumulation, clipping and AdamW on the CPU; the thread count and the number of micro-batches are
arguments. Run with another ``--threads`` it differs only in how reductions are split: the first
op that rounds differently is a LayerNorm backward (its weight and bias gradients are sums over
the batch), which reaches ``.grad`` through a ``detach`` view and meets the next micro-batch's
gradient in one ``add_``.

    accumulate.py --threads 1 --accum 2
"""

import argparse

import torch
import torch.nn.functional as F
from torch import nn

VOCAB, WIDTH, TOKENS, BATCH, STEPS = 50, 32, 16, 4, 2


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.norm1 = nn.LayerNorm(WIDTH)
        self.qkv = nn.Linear(WIDTH, 3 * WIDTH)
        self.proj = nn.Linear(WIDTH, WIDTH)
        self.norm2 = nn.LayerNorm(WIDTH)
        self.fc = nn.Linear(WIDTH, 4 * WIDTH)
        self.out = nn.Linear(4 * WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(self.norm1(x)).chunk(3, dim=-1)
        scores = (q @ k.transpose(-2, -1)) / WIDTH**0.5
        mask = torch.triu(torch.ones(TOKENS, TOKENS, dtype=torch.bool), 1)
        x = x + self.proj(scores.masked_fill(mask, float("-inf")).softmax(-1) @ v)
        return x + self.out(F.gelu(self.fc(self.norm2(x))))


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.blocks = nn.ModuleList([Block(), Block()])
        self.norm = nn.LayerNorm(WIDTH)
        self.head = nn.Linear(WIDTH, VOCAB)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))  # <- final_norm


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--accum", type=int, default=2, help="micro-batches a step")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    model = Model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    data = torch.randint(0, VOCAB, (STEPS * args.accum, BATCH, TOKENS + 1))
    for step in range(STEPS):
        for micro in range(args.accum):
            batch = data[step * args.accum + micro]
            logits = model(batch[:, :-1])
            loss = F.cross_entropy(logits.reshape(-1, VOCAB), batch[:, 1:].reshape(-1))
            (loss / args.accum).backward()  # <- backward
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
        print(f"step {step} loss {loss.item():.6f}")


if __name__ == "__main__":
    main()
