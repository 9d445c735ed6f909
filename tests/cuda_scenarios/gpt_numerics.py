"""A small GPT (token and position embeddings, two pre-norm blocks, causal attention through
``scaled_dot_product_attention``, tied head) trained for three AdamW steps, seeded: the GPU pairs
of issue 30 that differ by rounding alone, and real changes behind them.

    gpt_numerics.py                         # the reference: TF32 off, foreach AdamW, math attention
    gpt_numerics.py --tf32                  # TF32 matmuls (within rounding)
    gpt_numerics.py --optimizer fused       # the fused AdamW kernel (within rounding)
    gpt_numerics.py --backend efficient     # memory-efficient attention (within rounding)
    gpt_numerics.py --backend efficient --scale 0.2   # and a real change: the softmax scale

Runs on the GPU when there is one, else on the CPU (where ``--tf32`` changes nothing, the
fused AdamW is a CPU kernel too, and ``--backend`` takes ``math`` or ``flash``).
"""

import argparse

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

VOCAB, WIDTH, HEADS, TOKENS, BATCH, LAYERS, STEPS = 256, 128, 4, 64, 8, 2, 3
BACKENDS = {
    "math": SDPBackend.MATH,
    "efficient": SDPBackend.EFFICIENT_ATTENTION,
    "flash": SDPBackend.FLASH_ATTENTION,
}


class Block(nn.Module):
    def __init__(self, backend: SDPBackend, scale: float | None) -> None:
        super().__init__()
        self.backend, self.scale = backend, scale
        self.norm1, self.norm2 = nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH)
        self.qkv, self.proj = nn.Linear(WIDTH, 3 * WIDTH), nn.Linear(WIDTH, WIDTH)
        self.fc, self.out = nn.Linear(WIDTH, 4 * WIDTH), nn.Linear(4 * WIDTH, WIDTH)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, tokens, _ = x.shape
        qkv = self.qkv(self.norm1(x)).view(batch, tokens, 3, HEADS, -1).permute(2, 0, 3, 1, 4)
        with sdpa_kernel(self.backend):
            y = F.scaled_dot_product_attention(*qkv, is_causal=True, scale=self.scale)  # <- attn
        x = x + self.proj(y.transpose(1, 2).reshape(batch, tokens, WIDTH))
        return x + self.out(F.gelu(self.fc(self.norm2(x))))


class GPT(nn.Module):
    def __init__(self, backend: SDPBackend, scale: float | None) -> None:
        super().__init__()
        self.tokens, self.positions = nn.Embedding(VOCAB, WIDTH), nn.Embedding(TOKENS, WIDTH)
        self.blocks = nn.Sequential(*(Block(backend, scale) for _ in range(LAYERS)))
        self.norm = nn.LayerNorm(WIDTH)
        for table in (self.tokens, self.positions):
            nn.init.normal_(table.weight, std=0.02)  # as GPT-2: the tied head's logits stay O(1)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(ids.shape[1], device=ids.device)
        x = self.blocks(self.tokens(ids) + self.positions(positions))
        return self.norm(x) @ self.tokens.weight.t()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tf32", action="store_true", help="TF32 matmuls and convolutions")
    parser.add_argument("--optimizer", choices=("foreach", "fused"), default="foreach")
    parser.add_argument("--backend", choices=tuple(BACKENDS), default="math")
    parser.add_argument("--scale", type=float, default=None, help="softmax scale (1/sqrt(d))")
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = args.tf32
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    model = GPT(BACKENDS[args.backend], args.scale).to(device)
    fused = args.optimizer == "fused"
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, foreach=not fused, fused=fused)
    ids = torch.randint(0, VOCAB, (STEPS, BATCH, TOKENS + 1), device=device)
    for step in range(STEPS):
        logits = model(ids[step, :, :-1])
        loss = F.cross_entropy(logits.reshape(-1, VOCAB), ids[step, :, 1:].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"step {step} loss {loss.item():.6f}")


if __name__ == "__main__":
    main()
