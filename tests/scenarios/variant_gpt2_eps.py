"""gpt2_base.py with the layer-norm epsilon of the config changed from 1e-5 to 1e-6."""

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")

import torch
from transformers import GPT2Config, GPT2LMHeadModel

STEPS = 2
LAYER_NORM_EPSILON = 1e-6  # <- eps  CHANGED


def main() -> None:
    torch.manual_seed(0)
    config = GPT2Config(
        n_layer=2,
        n_head=2,
        n_embd=32,
        vocab_size=64,
        n_positions=16,
        layer_norm_epsilon=LAYER_NORM_EPSILON,
    )
    model = GPT2LMHeadModel(config)
    model.train()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    for step in range(STEPS):
        tokens = torch.randint(0, 64, (2, 16))
        loss = model(input_ids=tokens, labels=tokens).loss  # <- model
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(f"step {step} loss {loss.item():.6f}")


if __name__ == "__main__":
    main()
