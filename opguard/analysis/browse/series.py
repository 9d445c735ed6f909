"""The loss curve of a run, as well as a trace can tell it: the TUI's picture and the HTML
report's plot read it here.

Where the trace holds step-level records, the loss is the tensor the step gave to
``backward()`` (:func:`state_losses`, its first entry a step). Otherwise a trace has no notion
of "loss", but a training loop reads its loss with ``.item()``, which is recorded as
``aten::_local_scalar_dense`` with the returned number: :func:`item_losses` takes the first
such value of each step outside the optimizer (optimizers call ``.item()`` on their own step
counters). Logging usually reads the loss after ``optimizer.step()``, so a value may land in
the step after the one that computed it; the curve is still the loss, shifted by one.
"""

from __future__ import annotations

from dataclasses import dataclass

from ...store import RankTrace, schema
from ...store.states import loss_tensors

LOCAL_SCALAR = "aten::_local_scalar_dense"
_OPTIMIZER = schema.PHASES.index("optimizer")


def item_losses(trace: RankTrace) -> dict[int, float]:
    """Step -> the first number read by ``.item()`` in that step, outside the optimizer. Reads
    the whole trace unless it has no ``.item()`` at all: run it off the UI thread."""
    names = {ident for ident, name in trace.op_names.items() if name.startswith(LOCAL_SCALAR)}
    series: dict[int, float] = {}
    if not names:
        return series
    for raw in trace.raw_ops():
        step = raw.get("s", 0)
        if raw["o"] not in names or raw.get("p", 3) == _OPTIMIZER or step in series:
            continue
        value = raw.get("v")
        if isinstance(value, int | float) and not isinstance(value, bool):
            series[step] = float(value)
    return series


def state_losses(trace: RankTrace) -> dict[int, float]:
    """Step -> the loss its step-level record holds (of its first ``backward()``), for the
    steps whose record kept its value; empty for a trace without step-level records."""
    series: dict[int, float] = {}
    for step, raw in trace.raw_steps():
        losses = loss_tensors(raw)
        values = losses[0].values() if losses else []
        if values and isinstance(values[0], int | float):
            series[step] = float(values[0])
    return series


@dataclass(frozen=True, slots=True)
class Losses:
    """A run's loss per step, and where it was read (said beside the curve)."""

    by_step: dict[int, float]
    source: str


STATE_SOURCE = "the loss given to backward(), from the step-level records"
ITEM_SOURCE = "the first .item() of each step outside the optimizer (logging may shift it a step)"


def losses(trace: RankTrace) -> Losses:
    """The loss curve of a rank: from its step-level records where it holds any, else from its
    ``.item()`` calls."""
    recorded = state_losses(trace)
    if recorded:
        return Losses(recorded, STATE_SOURCE)
    return Losses(item_losses(trace), ITEM_SOURCE)
