"""An MLP whose hidden features are whitened by a linear solve against a fixed, ill-conditioned
matrix (condition number 1e4, as a preconditioner or a Gaussian-process layer may be), trained
for three SGD steps on the CPU, seeded.

    solve.py                    # the run
    solve.py --nudge 1e-2       # a real change: fc1.weight changed through NumPy after step 0

A solve amplifies a relative difference of its operands by up to the matrix's condition number,
which no record holds: rounding alone moves its output by about cond * u, far beyond what a
well-conditioned op's rounding does. ``opguard diff --tolerant`` cannot know that from the
trace; ``--noise CONTROL`` (a run of this script recorded with ``--perturb-rounding``) measures
it. ``--nudge REL`` adds REL times fc1.weight's norm to its first element after step 0.
"""

import argparse

import torch
import torch.nn.functional as F
from torch import nn

FEATURES, HIDDEN, CLASSES, BATCH, STEPS, DECADES = 32, 64, 10, 64, 3, 4


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--nudge", type=float, default=0.0, help="fc1.weight changed after step 0")
    args = parser.parse_args()
    torch.manual_seed(0)
    fc1, head = nn.Linear(FEATURES, HIDDEN), nn.Linear(HIDDEN, CLASSES)
    basis, _ = torch.linalg.qr(torch.randn(HIDDEN, HIDDEN))
    # eigenvalues from 1 down to 10**-DECADES: the condition number 10**DECADES
    matrix = basis @ torch.diag(torch.logspace(0, -DECADES, HIDDEN)) @ basis.T
    optimizer = torch.optim.SGD([*fc1.parameters(), *head.parameters()], lr=0.05)
    data = torch.randn(STEPS, BATCH, FEATURES)
    target = torch.randint(0, CLASSES, (STEPS, BATCH))
    for step in range(STEPS):
        hidden = torch.tanh(fc1(data[step]))
        whitened = torch.linalg.solve(matrix, hidden.T).T * 10.0**-DECADES
        loss = F.cross_entropy(head(whitened), target[step])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"step {step} loss {loss.item():.6f}")
        if step == 0 and args.nudge:
            weight = fc1.weight.detach()
            weight.numpy().flat[0] += args.nudge * float(weight.norm())


if __name__ == "__main__":
    main()
