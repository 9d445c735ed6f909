"""The loss curve of a run, as well as a trace can tell it.

A trace has no notion of "loss", but a training loop reads its loss with ``.item()``, which is
recorded as ``aten::_local_scalar_dense`` with the returned number. The series is the first such
value of each step outside the optimizer (optimizers call ``.item()`` on their own step counters).
Logging usually reads the loss after ``optimizer.step()``, so a value may land in the step after
the one that computed it; the curve is still the loss, shifted by one.
"""

from __future__ import annotations

from ..store import RankTrace, schema

LOCAL_SCALAR = "aten::_local_scalar_dense"
_OPTIMIZER = schema.PHASES.index("optimizer")


def loss_series(trace: RankTrace) -> dict[int, float]:
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
