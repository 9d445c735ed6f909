"""GPT-2 small (124M, transformers, from a config) trained for 200 AdamW steps on the GPU, each
step on its own batch (a CUDA generator seeded by the step number), meant to be bit for bit
reproducible: deterministic algorithms, and attention by the math kernel (the fused ones'
backward may add in another order from run to run). For the late difference ``opguard hunt`` finds
(tests/test_cuda.py, bench/gpu_session.sh's ``long`` part).

    gpt2_long.py [--steps 200] [--scale-at K [--scale 1.0001]] [--batch 4] [--seq 128]
                 [--attention efficient]

``--attention efficient``: the memory-efficient attention kernel instead, whose backward adds in
another order from run to run: the script run twice differs by rounding alone (with dropout's
masks equal: they come from the seeded generator).

``--scale-at K``: step K's loss is multiplied by 1.0001 (every step multiplies it, by 1.0
elsewhere, so both runs hold the same ops). Prints the last step's loss.
"""

import argparse
import os

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")  # before CUDA starts
os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch
from transformers import GPT2Config, GPT2LMHeadModel

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=200)
parser.add_argument("--scale-at", type=int, default=-1)
parser.add_argument("--scale", type=float, default=1.0001)
parser.add_argument("--batch", type=int, default=4)
parser.add_argument("--seq", type=int, default=128)
parser.add_argument("--attention", choices=("math", "efficient"), default="math")
args = parser.parse_args()

# Deterministic kernels where PyTorch has them (a warning, not an error, where it has none)
torch.use_deterministic_algorithms(True, warn_only=True)
torch.backends.cuda.enable_flash_sdp(False)
torch.backends.cuda.enable_mem_efficient_sdp(args.attention == "efficient")
torch.backends.cuda.enable_cudnn_sdp(False)
torch.manual_seed(0)
model = GPT2LMHeadModel(GPT2Config(n_positions=args.seq)).cuda()
opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
vocab = model.config.vocab_size
loss = torch.zeros((), device="cuda")
for step in range(args.steps):
    data = torch.Generator(device="cuda").manual_seed(step)
    tokens = torch.randint(0, vocab, (args.batch, args.seq), device="cuda", generator=data)
    scale = args.scale if step == args.scale_at else 1.0
    loss = model(tokens, labels=tokens).loss * scale  # <- scale
    opt.zero_grad()
    loss.backward()
    opt.step()
print(f"loss {loss.item():.6f}")
