"""The same matmul with TF32 off (argv[1] == "off") or on: only the kernel's precision differs."""

import sys

import torch

torch.backends.cuda.matmul.allow_tf32 = sys.argv[1] == "on"
torch.manual_seed(0)
a = torch.randn(512, 512, device="cuda")
b = torch.randn(512, 512, device="cuda")
print((a @ b).sum().item())
