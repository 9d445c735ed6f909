"""A tiny transformer language-model training loop, recorded by tests/test_record.py.

Lines tagged ``# SITE:<name>`` are looked up by the tests (call sites are checked against
them): keep each tag on the line of the call it names. ``python record_tiny_transformer.py
[--steps N] [--dropout P]`` prints one ``loss <float.hex>`` line per step.
"""

from __future__ import annotations

import argparse
import math

import torch
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    """Pre-norm self-attention (hand-written, causal) and an MLP."""

    def __init__(self, dim: int, heads: int, dropout: float) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(dim)
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.ln2 = nn.LayerNorm(dim)
        self.fc1 = nn.Linear(dim, 4 * dim)
        self.fc2 = nn.Linear(4 * dim, dim)
        self.drop = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        h = self.ln1(x)
        qkv = self.qkv(h)  # SITE:qkv
        q, k, v = qkv.view(b, t, 3, self.heads, d // self.heads).permute(2, 0, 3, 1, 4)
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(d // self.heads)  # SITE:scores
        mask = torch.ones(t, t, dtype=torch.bool).triu(1)
        att = self.drop(scores.masked_fill(mask, float("-inf")).softmax(dim=-1))
        y = (att @ v).transpose(1, 2).reshape(b, t, d)
        x = x + self.drop(self.proj(y))  # SITE:proj
        x = x + self.drop(self.fc2(F.gelu(self.fc1(self.ln2(x)))))  # SITE:mlp
        return x


class TinyTransformer(nn.Module):
    def __init__(
        self,
        vocab: int = 32,
        dim: int = 16,
        heads: int = 2,
        layers: int = 1,
        seq: int = 8,
        dropout: float = 0.0,
    ) -> None:
        super().__init__()
        self.tok = nn.Embedding(vocab, dim)
        self.pos = nn.Embedding(seq, dim)
        self.blocks = nn.ModuleList(Block(dim, heads, dropout) for _ in range(layers))
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))  # SITE:embed
        for block in self.blocks:
            x = block(x)  # SITE:block
        return self.head(self.ln(x))  # SITE:head


def make_batch(vocab: int, batch: int, seq: int) -> tuple[torch.Tensor, torch.Tensor]:
    data = torch.randint(0, vocab, (batch, seq + 1))
    return data[:, :-1], data[:, 1:]


def train(
    steps: int = 3,
    dropout: float = 0.0,
    vocab: int = 32,
    batch: int = 2,
    seq: int = 8,
    seed: int = 0,
    report=print,
) -> list[float]:
    torch.manual_seed(seed)
    model = TinyTransformer(vocab=vocab, seq=seq, dropout=dropout)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(steps):
        idx, target = make_batch(vocab, batch, seq)
        logits = model(idx)  # SITE:model
        loss = F.cross_entropy(logits.reshape(-1, vocab), target.reshape(-1))  # SITE:loss
        losses.append(loss.item())
        report(f"loss {losses[-1].hex()}")
        opt.zero_grad()
        loss.backward()  # SITE:backward
        opt.step()  # SITE:opt
    return losses


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--dropout", type=float, default=0.0)
    args = parser.parse_args()
    train(args.steps, args.dropout, report=lambda line: print(line, flush=True))
