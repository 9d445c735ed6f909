"""A small MLP trained for two SGD steps on the CPU, seeded, reading its batch through four
views of the data (a slice, a ``narrow``, a ``select``, an ``as_strided``): issue 38's view ops
with other arguments.

    shifted_views.py                    # each view at offset 0
    shifted_views.py --shift narrow     # the narrow one row later (a data-loading bug, as a
                                        # rank that slices its batch one row later)

Recorded once with ``opguard record --perturb-rounding 1`` (every op rounding otherwise) and
once with ``--shift KIND``: the view with the other argument is the real change, named at the
view op under ``--tolerant`` as bit for bit.
"""

import argparse

import torch
from torch import nn

ROWS, WIDTH, STEPS = 8, 16, 2
KINDS = ("slice", "narrow", "select", "as_strided")


def batch(data: torch.Tensor, step: int, shift: str) -> torch.Tensor:
    """The step's batch: the sum of four views of ``data``, the ``shift`` one a row (the
    ``select``: a step) later."""
    at = {kind: int(kind == shift) for kind in KINDS}
    rows = data[step]
    sliced = rows[at["slice"] : at["slice"] + ROWS]
    narrowed = rows.narrow(0, at["narrow"], ROWS)
    selected = data.select(0, step + at["select"])[:ROWS]
    offset = rows.storage_offset() + at["as_strided"] * WIDTH
    strided = rows.as_strided((ROWS, WIDTH), (WIDTH, 1), offset)
    return sliced + narrowed + selected + strided


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--shift", choices=KINDS, default=None, help="the view one row later")
    args = parser.parse_args()
    torch.manual_seed(0)
    data = torch.randn(STEPS + 1, ROWS + 1, WIDTH)
    model = nn.Sequential(nn.Linear(WIDTH, WIDTH), nn.Tanh(), nn.Linear(WIDTH, 1))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(STEPS):
        loss = model(batch(data, step, args.shift)).pow(2).mean()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"step {step} loss {loss.item():.6f}")


if __name__ == "__main__":
    main()
