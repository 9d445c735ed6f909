"""Where the host time of a recorded GPU training step goes: the GPT-2 step of
``bench/overhead.py`` recorded under cProfile (training thread only), top functions by own time.

cProfile slows Python code several-fold, so read the shares, not the absolute times.

    python bench/overhead_profile.py [--steps 3] [--top 25] [--batch 8] [--seq 1024]
"""

from __future__ import annotations

import argparse
import cProfile
import pstats
import tempfile
from pathlib import Path

import torch
from overhead import build

import opguard


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--seq", type=int, default=1024)
    args = parser.parse_args()

    step, _ = build(args.batch, args.seq)
    step()  # warm-up outside the recording
    with tempfile.TemporaryDirectory() as workdir, opguard.record(Path(workdir) / "run"):
        step()
        torch.cuda.synchronize()
        profile = cProfile.Profile()
        profile.enable()
        for _ in range(args.steps):
            step()
        torch.cuda.synchronize()
        profile.disable()
    pstats.Stats(profile).sort_stats("tottime").print_stats(args.top)


if __name__ == "__main__":
    main()
