"""Two training steps of a tiny Hugging Face GPT-2 built from a config (no download).

Recorded by tests/test_record.py; prints one ``loss <float.hex>`` line per step.
"""

from __future__ import annotations

import os
import sys

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch
from transformers import GPT2Config, GPT2LMHeadModel


def build() -> GPT2LMHeadModel:
    config = GPT2Config(
        n_layer=2,
        n_head=2,
        n_embd=32,
        vocab_size=64,
        n_positions=16,
        bos_token_id=0,
        eos_token_id=0,
    )
    return GPT2LMHeadModel(config)


def main(steps: int) -> None:
    torch.manual_seed(0)
    model = build()
    model.train()  # dropout active (GPT-2's default p=0.1)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for _ in range(steps):
        idx = torch.randint(0, 64, (2, 8))
        out = model(input_ids=idx, labels=idx)  # SITE:model
        opt.zero_grad()
        out.loss.backward()
        print(f"loss {out.loss.item().hex()}", flush=True)
        opt.step()  # SITE:opt


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 2)
