"""Runs a training script as ``__main__`` and reports, exactly, every value its own lines got
from ``Tensor.item()`` (the losses it prints): ``python item_values.py SCRIPT [ARGS...]``
prints the script's output, then ``ITEM_VALUES <json list of [line, float.hex()]>`` on
stderr.

The unrecorded side of tests/test_unchanged.py: the recorded side's values are read from the
trace (each ``.item()`` is an op whose returned value is stored exactly). Wrapping ``item``
only reads the value it returns; nothing the script computes changes.
"""

from __future__ import annotations

import json
import os
import runpy
import sys

import torch

MARK = "ITEM_VALUES"


def main() -> None:
    script = os.path.abspath(sys.argv[1])
    original = torch.Tensor.item
    values: list[tuple[int, str]] = []

    def item(self: torch.Tensor) -> object:
        value = original(self)
        caller = sys._getframe(1)
        if caller.f_code.co_filename == script:
            values.append((caller.f_lineno, float(value).hex()))
        return value

    torch.Tensor.item = item  # type: ignore[method-assign]
    sys.argv = sys.argv[1:]
    sys.path[0] = os.path.dirname(script)
    try:
        runpy.run_path(script, run_name="__main__")
    finally:
        torch.Tensor.item = original  # type: ignore[method-assign]
        print(MARK, json.dumps(values), file=sys.stderr)


if __name__ == "__main__":
    main()
