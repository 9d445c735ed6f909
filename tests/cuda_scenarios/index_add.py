"""index_add_ with many duplicate indices in float32: atomics make the sum order, and so the
bits, differ from run to run."""

import torch

torch.manual_seed(0)
values = torch.randn(1 << 22, device="cuda")
index = torch.randint(0, 16, (1 << 22,), device="cuda")
out = torch.zeros(16, device="cuda")
out.index_add_(0, index, values)
print(out.sum().item())
