"""A small Hugging Face Llama or GPT-2 built from a config (no download), three AdamW steps on the
CPU, seeded: the scripts behind the cross-build fixtures of ``opguard diff --tolerant``. The same
script recorded with two torch builds on two machines differs by rounding alone; the GPU
machine's recording is kept here (``bash bench/gpu_session.sh fixture``):

    opguard record -o tests/data/cross_version/llama-torch-2.11 -- tests/data/cross_version/hf_models.py llama

``--lr-from-step-1 LR`` changes the learning rate after the first step: a real change behind the
builds' rounding.
"""

import argparse
import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM

VOCAB, WIDTH, LAYERS, HEADS, TOKENS, BATCH, STEPS = 128, 64, 2, 4, 32, 4, 3


def model_of(name: str) -> torch.nn.Module:
    if name == "llama":
        config = LlamaConfig(
            vocab_size=VOCAB,
            hidden_size=WIDTH,
            intermediate_size=2 * WIDTH,
            num_hidden_layers=LAYERS,
            num_attention_heads=HEADS,
            num_key_value_heads=HEADS // 2,
            max_position_embeddings=TOKENS,
        )
        return LlamaForCausalLM(config)
    config = GPT2Config(
        vocab_size=VOCAB, n_embd=WIDTH, n_layer=LAYERS, n_head=HEADS, n_positions=TOKENS
    )
    return GPT2LMHeadModel(config)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("model", choices=("llama", "gpt2"))
    parser.add_argument("--lr-from-step-1", type=float, default=None)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = model_of(args.model)
    model.config._attn_implementation = "sdpa"  # the same kernel whichever default a build has
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    ids = torch.randint(0, VOCAB, (STEPS, BATCH, TOKENS))
    for step in range(STEPS):
        if step == 1 and args.lr_from_step_1 is not None:
            optimizer.param_groups[0]["lr"] = args.lr_from_step_1
        loss = model(ids[step], labels=ids[step]).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"step {step} loss {loss.item():.6f}")


if __name__ == "__main__":
    main()
