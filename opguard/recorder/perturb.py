"""``opguard record --perturb-rounding SEED``: a control run for ``opguard diff --tolerant
--noise CONTROL``. It changes the run's numbers, by design.

Another implementation of an op that rounds (a maths library, a sum taken in another order, a
matmul's blocking, a normalization's reductions) returns results that differ from this one's
in their last bits. This run pretends to be such an implementation: after each op of the
families another implementation rounds otherwise
(:func:`~opguard.analysis.tolerant.families.rounds_by_implementation`), each finite nonzero
element of its floating-point results moves one unit in the last place up, down, or not at all
(at random, a third each, from a generator of its own seeded with SEED: the run's random numbers
are untouched), before the recorder reads them. Correctly rounded operations (a cast, an add, a
division) are left alone: every implementation gives them the same result from the same
operands. The control run's distance from run A at each op is then what rounding does in this
model, the floor ``--noise`` judges run B's differences against.

The op sequence is the run's own as long as the script's control flow does not read values that
one ulp changes (a loss compared with a threshold, a scaler skipping a step).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import replace
from typing import Any

import torch

from ..analysis.tolerant.families import rounds_by_implementation
from .ops import OpInfo

# The integer dtype of each floating-point element size, to move an element by one ulp: its
# bits read as an integer, plus or minus one.
_BITS = {2: torch.int16, 4: torch.int32, 8: torch.int64}


class Perturbation:
    """Moves the results of the ops that round by implementation by one ulp, from ``seed``."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self._generators: dict[torch.device, torch.Generator] = {}

    def wrap(self, info: OpInfo) -> OpInfo:
        """``info`` with a ``run`` that perturbs its results, for an op that rounds by
        implementation; ``info`` itself for any other."""
        if not rounds_by_implementation(info.name) or info.run is None:
            return info
        run: Callable[..., Any] = info.run
        written = [i for i, name in enumerate(info.arg_names) if name in info.written_args]
        names = info.arg_names

        def perturbed(*args: Any, **kwargs: Any) -> Any:
            out = run(*args, **kwargs)
            given = [*args, *(kwargs.get(names[i]) for i in range(len(args), len(names)))]
            results = [out, *(given[i] for i in written if i < len(given))]
            self.nudge(_tensors(results))
            return out

        return replace(info, run=perturbed)

    def nudge(self, tensors: Iterator[torch.Tensor]) -> None:
        """Moves each finite nonzero element of ``tensors`` (each tensor once) by one ulp up,
        down or not at all."""
        seen: set[int] = set()
        for t in tensors:
            bits = _BITS.get(t.element_size())
            if id(t) in seen or bits is None or not t.is_floating_point() or t.numel() == 0:
                continue
            seen.add(id(t))
            step = torch.randint(
                -1, 2, t.shape, generator=self._generator(t.device), device=t.device, dtype=bits
            )
            step *= torch.isfinite(t) & (t != 0)
            t.view(bits).add_(step)

    def _generator(self, device: torch.device) -> torch.Generator:
        found = self._generators.get(device)
        if found is None:
            found = self._generators[device] = torch.Generator(device=device)
            found.manual_seed(self.seed)
        return found


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    """The tensors in an op's result or argument (lists of them included)."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors(item)
