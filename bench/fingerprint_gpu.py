"""GPU fingerprint throughput against a device-to-device copy of the same tensor (the memory
bandwidth baseline), and against ``torch.hash_tensor`` where torch has it, in one process.

    python bench/fingerprint_gpu.py [--mib 1024] [--blocks-per-sm 4]
"""

from __future__ import annotations

import argparse
import statistics

import torch

from opguard import _C
from opguard.recorder import tensors
from opguard.recorder.tensors import PendingFields, fingerprint_fields


def gbps(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / 1e9


def time_cuda(fn, repeats: int = 10) -> float:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    fn()
    samples = []
    for _ in range(repeats):
        start.record()
        fn()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) / 1e3)
    return statistics.median(samples)


def heads_permuted(x: torch.Tensor) -> torch.Tensor:
    """Attention's output layout: memory ordered [batch, seq, heads, 64], read as
    [batch, heads, seq, 64] (innermost rows contiguous, outer dimensions permuted)."""
    row = 8 * 12 * 64
    return x[: x.numel() // row * row].view(8, -1, 12, 64).permute(0, 2, 1, 3)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mib", type=int, default=1024)
    parser.add_argument("--blocks-per-sm", type=int, help="the recorder's launch size instead")
    args = parser.parse_args()
    if args.blocks_per_sm:
        tensors._GPU = _C.GpuFingerprinter(blocks_per_sm=args.blocks_per_sm)
    print(f"{torch.cuda.get_device_name()}, {args.mib} MiB per tensor, GB/s of tensor bytes read")
    print(f"{'tensor':<24} {'copy':>8} {'opguard':>8} {'hash_tensor':>12}")
    for dtype in (torch.float32, torch.bfloat16, torch.float16, torch.int64):
        n = args.mib * 2**20 // dtype.itemsize
        x = (
            torch.randn(n, device="cuda").to(dtype)
            if dtype.is_floating_point
            else torch.randint(0, 1 << 30, (n,), device="cuda", dtype=dtype)
        )
        for label, t in (
            (f"{str(dtype)[6:]} contiguous", x),
            (f"{str(dtype)[6:]} transposed", x.view(-1, 4096).t()),
            # attention's layout: [batch, seq, heads, 64] read as [batch, heads, seq, 64]
            (f"{str(dtype)[6:]} heads permuted", heads_permuted(x)),
        ):
            nbytes = t.numel() * t.element_size()
            copy = time_cuda(lambda t=t: t.clone())
            pending: list[PendingFields] = []

            def fingerprint(t=t, pending=pending) -> None:
                fields = fingerprint_fields(t)
                assert isinstance(fields, PendingFields)
                pending.append(fields)

            ours = time_cuda(fingerprint)
            for p in pending:
                p.resolve()
            hashed = "-"
            if hasattr(torch, "hash_tensor") and label.endswith("contiguous"):
                hashed = f"{gbps(nbytes, time_cuda(lambda t=t: torch.hash_tensor(t))):.0f}"
            # copy moves 2 bytes per byte; report the bytes it read, like the others
            print(f"{label:<24} {gbps(nbytes, copy):>8.0f} {gbps(nbytes, ours):>8.0f} {hashed:>12}")


if __name__ == "__main__":
    main()
