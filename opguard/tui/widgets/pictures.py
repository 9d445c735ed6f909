"""Pictures of the whole run above the op list: where along the trace the runs differ (share of
differing ops per step, from the diff's per-step counts), under ``--tolerant`` how far apart
they are (the largest relative distance of each step's aligned ops, log scale, the first
difference rounding does not explain named), and the loss of both runs per step.

A bar per step, or per bucket of steps when there are more steps than columns; the cursor's
step is drawn inverted so a person sees where they stand.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping, Sequence

from rich.text import Text
from textual.app import ComposeResult
from textual.containers import Vertical
from textual.widget import Widget

from ...analysis import RankDiff
from ...analysis.browse.rows import Side
from ...analysis.tolerant.judgement import DRIFT_AROUND
from ...analysis.words.text import SPARK_BLOCKS

LABEL_WIDTH = 11
MAX_CELL_WIDTH = 6


def bucket(
    values: Sequence[float | None], width: int, combine: Callable[[list[float]], float]
) -> list[float | None]:
    """``values`` squeezed into at most ``width`` cells, each the ``combine`` of its share."""
    if width <= 0 or len(values) <= width:
        return list(values)
    cells: list[float | None] = []
    for cell in range(width):
        share = [
            v
            for v in values[cell * len(values) // width : (cell + 1) * len(values) // width]
            if v is not None
        ]
        cells.append(combine(share) if share else None)
    return cells


class Bars(Widget):
    """One labelled line of bars, scaled between ``low`` and ``high``."""

    def __init__(self, label: str, colour: str, *, id: str | None = None) -> None:
        super().__init__(id=id)
        self.label = label
        self.colour = colour
        self.values: Sequence[float | None] = ()
        self.low, self.high = 0.0, 1.0
        self.marker: int | None = None  # index into values: the cursor's step
        self.note = ""
        self.combine: Callable[[list[float]], float] = max

    def plot(
        self,
        values: Sequence[float | None],
        low: float,
        high: float,
        note: str,
        combine: Callable[[list[float]], float] = max,
    ) -> None:
        self.values = values
        self.low, self.high = low, high
        self.note = note
        self.combine = combine
        self.refresh()

    def mark(self, marker: int | None) -> None:
        if marker != self.marker:
            self.marker = marker
            self.refresh()

    def render(self) -> Text:
        text = Text(f"{self.label:<{LABEL_WIDTH}}", style="bold")
        room = max(self.size.width - LABEL_WIDTH - len(self.note) - 2, 1)
        cells = bucket(self.values, room, self.combine)
        # Few steps are drawn wide, so a short run still reads as a strip.
        repeat = max(1, min(MAX_CELL_WIDTH, room // max(len(cells), 1)))
        marked = (
            self.marker * len(cells) // max(len(self.values), 1)
            if self.marker is not None
            else None
        )
        span = self.high - self.low
        for at, value in enumerate(cells):
            if value is None:
                glyph = "·"
            else:
                level = (value - self.low) / span if span > 0 else 0.5
                glyph = SPARK_BLOCKS[round(max(0.0, min(1.0, level)) * (len(SPARK_BLOCKS) - 1))]
            style = self.colour if value is not None else "dim"
            text.append(glyph * repeat, style=f"{style} reverse" if at == marked else style)
        text.append(f"  {self.note}", style="dim")
        return text


class Pictures(Vertical):
    """The difference strip, the drift (``--tolerant``) and the loss curves of both runs."""

    def compose(self) -> ComposeResult:
        yield Bars("differing", "red", id="diff-strip")
        drift = Bars("drift", "yellow", id="drift")
        drift.display = False  # shown when the comparison was tolerant
        yield drift
        yield Bars("loss A", "cyan", id="loss-a")
        yield Bars("loss B", "magenta", id="loss-b")

    def show_diff(self, steps: Sequence[int], diff: RankDiff) -> None:
        by_step = {s.step: s for s in diff.steps}
        shares: list[float | None] = []
        for step in steps:
            s = by_step.get(step)
            shares.append(s.changed / s.ops if s and s.ops else None)
        first = diff.first
        note = f"{diff.differing} of {diff.aligned} aligned ops differ" + (
            f", first in step {first.step}" if first else ""
        )
        self.query_one("#diff-strip", Bars).plot(shares, 0.0, 1.0, note)
        if diff.tolerance is not None:
            self._show_drift(steps, diff)

    def _show_drift(self, steps: Sequence[int], diff: RankDiff) -> None:
        """The largest relative distance per step on a log scale, the lowest bar for a step
        whose ops were equal; ``·`` where it was unknown or not measured (the walk measures
        up to DRIFT_AROUND steps past the first difference rounding does not explain)."""
        found = diff.tolerance
        assert found is not None
        last = diff.first.step + DRIFT_AROUND if diff.first is not None else None
        series = dict(found.drift_series(steps, None))
        positive = [v for v in series.values() if v]
        low = math.log10(min(positive)) if positive else 0.0
        logs = [
            None
            if (last is not None and step > last) or series.get(step) is None
            else math.log10(series[step] or 10**low)
            for step in steps
        ]
        if not positive:
            note = "no difference measured"
        elif diff.first is not None:
            note = f"max {max(positive):.2g}; step {diff.first.step}: more than rounding"
        else:
            note = f"max {max(positive):.2g}, within rounding"
        drift = self.query_one("#drift", Bars)
        drift.plot(logs, low, math.log10(max(positive)) if positive else 1.0, note)
        drift.display = True

    def show_loss(self, steps: Sequence[int], series: Mapping[Side, Mapping[int, float]]) -> None:
        values = [v for s in series.values() for v in s.values()]
        if not values:
            for side in Side:
                self.query_one(f"#loss-{side.name.lower()}", Bars).plot(
                    [None] * len(steps), 0, 1, "no .item() recorded"
                )
            return
        low, high = min(values), max(values)
        for side in Side:
            mine = series[side]
            points = [mine.get(step) for step in steps]
            last = next((p for p in reversed(points) if p is not None), None)
            note = f"{low:.6g} … {high:.6g}" + (f", last {last:.9g}" if last is not None else "")
            self.query_one(f"#loss-{side.name.lower()}", Bars).plot(
                points, low, high, note, combine=lambda share: sum(share) / len(share)
            )

    def mark(self, position: int | None) -> None:
        for bars in self.query(Bars):
            bars.mark(position)
