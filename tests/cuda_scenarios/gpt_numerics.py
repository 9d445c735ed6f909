"""A small GPT (token and position embeddings, two pre-norm blocks, causal attention through
``scaled_dot_product_attention``, tied head) trained for three AdamW steps, seeded: the GPU pairs
of issue 30 that differ by rounding alone, and real changes behind them.

    gpt_numerics.py                         # the reference: TF32 off, foreach AdamW, math attention
    gpt_numerics.py --tf32                  # TF32 matmuls (within rounding)
    gpt_numerics.py --optimizer fused       # the fused AdamW kernel (within rounding)
    gpt_numerics.py --backend efficient     # memory-efficient attention (within rounding)
    gpt_numerics.py --backend efficient --scale 0.2   # and a real change: the softmax scale

    gpt_numerics.py --bf16                  # bf16 autocast (within rounding)
    gpt_numerics.py --index-add             # a bucket sum by token id through index_add_'s atomics
    gpt_numerics.py --arch llama            # Llama-class blocks: RMSNorm, rotary positions, SwiGLU

Real changes to put behind them: ``--weight-decay``, ``--lr``, ``--eps`` (the norms'), ``--scale``.
Runs on the GPU when there is one, else on the CPU (where ``--tf32`` changes nothing, the
fused AdamW is a CPU kernel too, and ``--backend`` takes ``math`` or ``flash``).
"""

import argparse

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

VOCAB, WIDTH, HEADS, TOKENS, BATCH, LAYERS, STEPS = 256, 128, 4, 64, 8, 2, 3
HEAD = WIDTH // HEADS
BUCKETS = 8
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
        x = x + self.proj(y.transpose(1, 2).reshape(batch, tokens, WIDTH))  # <- proj
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


class RMSNorm(nn.Module):
    """Llama's norm, written out as its implementations do: x · rsqrt(mean(x²) + eps) · w."""

    def __init__(self, eps: float) -> None:
        super().__init__()
        self.eps, self.weight = eps, nn.Parameter(torch.ones(WIDTH))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x32 = x.float()
        normed = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)  # <- rms eps
        return self.weight * normed.to(x.dtype)


def rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary position embedding: each (first half, second half) pair turned by its angle."""
    first, second = x.chunk(2, dim=-1)
    return x * cos + torch.cat((-second, first), dim=-1) * sin


class LlamaBlock(nn.Module):
    def __init__(self, backend: SDPBackend, scale: float | None, eps: float) -> None:
        super().__init__()
        self.backend, self.scale = backend, scale
        self.norm1, self.norm2 = RMSNorm(eps), RMSNorm(eps)
        self.qkv = nn.Linear(WIDTH, 3 * WIDTH, bias=False)
        self.proj = nn.Linear(WIDTH, WIDTH, bias=False)
        self.gate_up = nn.Linear(WIDTH, 2 * 3 * WIDTH, bias=False)
        self.down = nn.Linear(3 * WIDTH, WIDTH, bias=False)
        angles = torch.outer(torch.arange(TOKENS), 1e4 ** -(torch.arange(0, HEAD, 2) / HEAD))
        self.register_buffer("cos", angles.cos().repeat(1, 2), persistent=False)
        self.register_buffer("sin", angles.sin().repeat(1, 2), persistent=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, tokens, _ = x.shape
        q, k, v = self.qkv(self.norm1(x)).view(batch, tokens, 3, HEADS, -1).permute(2, 0, 3, 1, 4)
        q, k = rotate(q, self.cos, self.sin), rotate(k, self.cos, self.sin)
        with sdpa_kernel(self.backend):
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=self.scale)
        x = x + self.proj(y.transpose(1, 2).reshape(batch, tokens, WIDTH))
        gate, up = self.gate_up(self.norm2(x)).chunk(2, dim=-1)
        return x + self.down(F.silu(gate) * up)


class Llama(nn.Module):
    def __init__(self, backend: SDPBackend, scale: float | None, eps: float) -> None:
        super().__init__()
        self.tokens = nn.Embedding(VOCAB, WIDTH)
        self.blocks = nn.Sequential(*(LlamaBlock(backend, scale, eps) for _ in range(LAYERS)))
        self.norm, self.head = RMSNorm(eps), nn.Linear(WIDTH, VOCAB, bias=False)
        nn.init.normal_(self.tokens.weight, std=0.02)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.norm(self.blocks(self.tokens(ids))))


class BucketSum(nn.Module):
    """Adds to each token the mean activation of the tokens in its bucket (its id modulo
    ``BUCKETS``), summed by ``index_add_``: on a GPU its atomics add each bucket's tens of terms
    in another order from run to run."""

    def forward(self, x: torch.Tensor, ids: torch.Tensor) -> torch.Tensor:
        flat, index = x.reshape(-1, WIDTH), ids.reshape(-1) % BUCKETS
        sums = torch.zeros(BUCKETS, WIDTH, device=x.device, dtype=x.dtype).index_add_(
            0, index, flat
        )
        counts = torch.bincount(index, minlength=BUCKETS).clamp(min=1).unsqueeze(1)
        return x + (sums / counts)[ids % BUCKETS]


def build(args: argparse.Namespace) -> nn.Module:
    """The model the arguments name, its token ids first through the bucket sum if asked."""
    backend = BACKENDS[args.backend]
    if args.arch == "llama":
        model: nn.Module = Llama(backend, args.scale, args.eps)
    else:
        model = GPT(backend, args.scale)
        model.norm.eps = args.eps
    if args.index_add:
        model.tokens.register_forward_hook(lambda _, inputs, x: BucketSum()(x, inputs[0]))
    return model


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--tf32", action="store_true", help="TF32 matmuls and convolutions")
    parser.add_argument("--bf16", action="store_true", help="the forward under bf16 autocast")
    parser.add_argument("--optimizer", choices=("foreach", "fused"), default="foreach")
    parser.add_argument("--backend", choices=tuple(BACKENDS), default="math")
    parser.add_argument("--scale", type=float, default=None, help="softmax scale (1/sqrt(d))")
    parser.add_argument("--arch", choices=("gpt", "llama"), default="gpt")
    parser.add_argument("--index-add", action="store_true", help="a bucket sum by token id")
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--weight-decay", type=float, default=0.01)
    parser.add_argument("--eps", type=float, default=1e-5, help="the final norm's (all, Llama)")
    args = parser.parse_args()
    torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = args.tf32
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    model = build(args).to(device)
    fused = args.optimizer == "fused"
    optimizer = torch.optim.AdamW(
        model.parameters(),
        lr=args.lr,
        weight_decay=args.weight_decay,
        foreach=not fused,
        fused=fused,
    )
    ids = torch.randint(0, VOCAB, (STEPS, BATCH, TOKENS + 1), device=device)
    for step in range(STEPS):
        with torch.autocast(device, dtype=torch.bfloat16, enabled=args.bf16):
            logits = model(ids[step, :, :-1])
        loss = F.cross_entropy(logits.float().reshape(-1, VOCAB), ids[step, :, 1:].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"step {step} loss {loss.item():.6f}")


if __name__ == "__main__":
    main()
