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

The perturbation is a dispatch mode of its own (:class:`PerturbingMode`), on for the whole
recording: beneath the op recorder where ops are recorded (which then records the perturbed
results), alone where they are not (``--steps-only``, the steps outside a ``--window``), so
that a control's rounding is perturbed at every step however it is recorded, and its step-level
records drift as its op records do. Ops of compiled regions (Inductor's kernels) are not
dispatched one by one, and are not perturbed.

The op sequence is the run's own as long as the script's control flow does not read values that
one ulp changes (a loss compared with a threshold, a scaler skipping a step).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from ..analysis.tolerant.families import rounds_by_implementation
from .tensors import HAND_BACK, RUN_AS_IS, dispatch_stack, subclass_call

# The integer dtype of each floating-point element size, to move an element by one ulp: its
# bits read as an integer, plus or minus one.
_BITS = {2: torch.int16, 4: torch.int32, 8: torch.int64}
# What a call of an op overload writes besides what it returns: the names and positions of its
# arguments written in place (``Tensor(a!)``, ``out=``).
Written = tuple[tuple[str, int], ...]


class Perturbation:
    """Moves tensors' elements by one ulp, at random from ``seed``."""

    def __init__(self, seed: int) -> None:
        self.seed = seed
        self._generators: dict[torch.device, torch.Generator] = {}

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


class PerturbingMode(TorchDispatchMode):
    """Runs each op, then moves the results of those that round by implementation (what they
    return and what they write in place) by one ulp (:class:`Perturbation`)."""

    def __init__(self, seed: int) -> None:
        super().__init__()
        self.perturbation = Perturbation(seed)
        self._written: dict[Any, Written | None] = {}  # per overload; None: not perturbed
        self.active = True

    def close(self) -> None:
        """Leaves the dispatch stack where it is on top; else (a mode the script entered
        since sits above it) it stays, passing ops through unperturbed."""
        self.active = False
        stack = dispatch_stack()
        if stack and stack[-1] is self:
            self.__exit__(None, None, None)

    def __torch_dispatch__(
        self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None
    ) -> Any:
        kwargs = kwargs or {}
        if not self.active:
            return func(*args, **kwargs)
        subclass = subclass_call(types)
        if subclass == HAND_BACK:  # the plain ops it runs come back here
            return NotImplemented
        out = func(*args, **kwargs)
        if func not in self._written:
            self._written[func] = _written_arguments(func)
        written = self._written[func]
        if written is not None and subclass != RUN_AS_IS:
            given = [kwargs.get(name, args[i] if i < len(args) else None) for name, i in written]
            self.perturbation.nudge(_tensors([out, *given]))
        return out


def _written_arguments(func: Any) -> Written | None:
    """The arguments ``func`` writes (name, position), for an op that rounds by
    implementation; None for any other (its results are left alone)."""
    schema = func._schema
    if not rounds_by_implementation(f"{schema.name}.{func._overloadname}"):
        return None
    return tuple(
        (a.name, i)
        for i, a in enumerate(schema.arguments)
        if a.is_out or (a.alias_info is not None and a.alias_info.is_write)
    )


def _tensors(value: Any) -> Iterator[torch.Tensor]:
    """The tensors in an op's result or argument (lists of them included)."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, (list, tuple)):
        for item in value:
            yield from _tensors(item)
