"""Between two recorded ops, code OpGuard does not record writes into a tensor through the CUDA
driver, as a custom extension would: ``cuMemsetD32Async`` called through ctypes on the current
stream. ``same`` writes the value the tensor already holds (nothing changes), ``other`` a
different one."""

import ctypes
import struct
import sys

import torch

value = {"same": 1.0, "other": 2.0}[sys.argv[1]]
libcuda = ctypes.CDLL("libcuda.so.1")
weights = torch.full((4096,), 1.0, device="cuda")  # the producer
total = weights.sum()  # reads it as written
bits = struct.unpack("<I", struct.pack("<f", value))[0]
status = libcuda.cuMemsetD32Async(
    ctypes.c_uint64(weights.data_ptr()),
    ctypes.c_uint(bits),
    ctypes.c_size_t(weights.numel()),
    ctypes.c_void_p(torch.cuda.current_stream().cuda_stream),
)
assert status == 0, f"cuMemsetD32Async failed: CUresult {status}"
scaled = weights * 3  # reads what the memset left
print(total.item(), scaled.sum().item())
