"""A small training loop to be killed, made to fail and paused while it is recorded
(tests/test_crash.py).

``python crash_train.py STEPS [--sleep S] [--raise-at STEP:WHERE] [--pause-at STEP --resume-file
PATH]`` prints one ``loss STEP <float.hex>`` line per step (flushed, so a test sees how far the
training got). ``--raise-at`` raises ``RuntimeError`` in step STEP after its ``forward``,
``backward`` or ``optimizer`` part; ``--pause-at`` waits before step STEP until PATH exists
(it prints ``paused`` first).
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.nn.functional as F
from torch import nn


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("steps", type=int)
    parser.add_argument("--sleep", type=float, default=0.0)
    parser.add_argument("--raise-at", default=None)
    parser.add_argument("--pause-at", type=int, default=None)
    parser.add_argument("--resume-file", default=None)
    args = parser.parse_args()
    raise_step, _, raise_where = (args.raise_at or "-1:").partition(":")

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Dropout(0.1), nn.Linear(16, 4))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    for step in range(args.steps):
        if step == args.pause_at:
            print("paused", flush=True)
            while not os.path.exists(args.resume_file):
                time.sleep(0.02)
        x, y = torch.randn(4, 8), torch.randn(4, 4)
        loss = F.mse_loss(model(x), y)
        fail = step == int(raise_step)
        if fail and raise_where == "forward":
            raise RuntimeError(f"injected failure in step {step} after forward")
        opt.zero_grad()
        loss.backward()
        if fail and raise_where == "backward":
            raise RuntimeError(f"injected failure in step {step} after backward")
        opt.step()
        if fail and raise_where == "optimizer":
            raise RuntimeError(f"injected failure in step {step} after optimizer")
        print("loss", step, loss.item().hex(), flush=True)
        time.sleep(args.sleep)


if __name__ == "__main__":
    main()
