"""Line plots as inline SVG, for a report that has to open anywhere: no script, no library, no
file beside it. One polyline a series, a dot with its value as a tooltip at each point of a
short series, the step the verdict names marked by a vertical line.

Values are placed on a linear scale, or on a log scale for distances that span decades (the
tolerant diff's drift), where 0 (equal outputs) sits on the bottom edge. A value that is None
(unknown) is left out of its line; the table beside the plot says so.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from html import escape

from ..analysis.words.text import number

WIDTH, HEIGHT = 720, 260
LEFT, RIGHT, TOP, BOTTOM = 76, 16, 30, 42  # margins: room for the ticks, legend and labels
DOTS_UP_TO = 120  # points of a series that get a dot (and a tooltip) each
Y_TICKS = 5
X_TICKS = 8


@dataclass(frozen=True, slots=True)
class Series:
    """One line: its name in the legend, its (step, value) points, and how it is drawn."""

    name: str
    points: Sequence[tuple[int, float | None]]
    colour: str
    dashed: bool = False  # drawn over an equal line, a dashed one leaves the other visible


@dataclass(frozen=True, slots=True)
class Scale:
    """Maps data to the plot's pixels: steps along x, values (their log10 on a log scale)
    along y."""

    x_low: float
    x_high: float
    y_low: float
    y_high: float
    log: bool

    def x(self, step: float) -> float:
        span = self.x_high - self.x_low
        return LEFT + (step - self.x_low) / span * (WIDTH - LEFT - RIGHT)

    def y(self, value: float) -> float:
        """The pixel row of ``value`` (on a log scale, 0 and below on the bottom edge)."""
        level = self.level(value)
        at = self.y_low if level is None else level
        return TOP + (self.y_high - at) / (self.y_high - self.y_low) * (HEIGHT - TOP - BOTTOM)

    def level(self, value: float) -> float | None:
        """Where ``value`` lies on the scale: itself, or its log10 (None for 0 or below)."""
        if not self.log:
            return value
        return math.log10(value) if value > 0 else None


def line_plot(
    series: Sequence[Series],
    *,
    title: str,
    y_label: str,
    log: bool = False,
    bounds: tuple[float, float] | None = None,
    marked: int | None = None,
    marked_label: str = "",
) -> str:
    """An ``<svg>`` element drawing ``series`` against the step, between ``bounds`` when given
    (a share: 0 to 1) else the values' own, ``marked`` (a step) by a dashed vertical line
    labelled ``marked_label``."""
    scale = _scale(series, log, bounds, marked)
    parts = [
        f'<svg viewBox="0 0 {WIDTH} {HEIGHT}" '
        f'width="{WIDTH}" height="{HEIGHT}" role="img" class="plot">',
        f"<title>{escape(title)}</title>",
        *_axes(scale, y_label),
    ]
    if marked is not None:
        x = scale.x(marked)
        # the label on the side of the line with room for it
        left = x > (LEFT + WIDTH - RIGHT) / 2
        anchor, at = ("end", x - 4) if left else ("start", x + 4)
        parts.append(
            f'<line class="marked" x1="{x:.1f}" y1="{TOP}" x2="{x:.1f}" y2="{HEIGHT - BOTTOM}" '
            'stroke="#c0392b" stroke-dasharray="4 3"/>'
            f'<text x="{at:.1f}" y="{TOP + 12}" font-size="11" fill="#c0392b" '
            f'text-anchor="{anchor}">{escape(marked_label)}</text>'
        )
    for s in series:
        parts.extend(_line(s, scale))
    parts.extend(_legend(series))
    parts.append("</svg>")
    return "".join(parts)


def _scale(
    series: Sequence[Series], log: bool, bounds: tuple[float, float] | None, marked: int | None
) -> Scale:
    steps = [step for s in series for step, _ in s.points] + (
        [marked] if marked is not None else []
    )
    x_low, x_high = (min(steps), max(steps)) if steps else (0, 1)
    if x_low == x_high:  # one step: centred
        x_low, x_high = x_low - 1, x_high + 1
    if bounds is not None:
        return Scale(x_low, x_high, *bounds, log)
    probe = Scale(0, 1, 0, 1, log)
    levels = [
        level
        for s in series
        for _, value in s.points
        if value is not None and (level := probe.level(value)) is not None
    ]
    y_low, y_high = (min(levels), max(levels)) if levels else (0.0, 1.0)
    pad = (y_high - y_low) * 0.05 or (1.0 if log else abs(y_low) * 0.01 or 1.0)
    return Scale(x_low, x_high, y_low - pad, y_high + pad, log)


def _axes(scale: Scale, y_label: str) -> list[str]:
    """The frame, the ticks with their labels, and the axis names."""
    bottom, right = HEIGHT - BOTTOM, WIDTH - RIGHT
    parts = [
        f'<rect x="{LEFT}" y="{TOP}" width="{right - LEFT}" height="{bottom - TOP}" '
        'fill="none" stroke="#999"/>'
    ]
    for level in _y_ticks(scale):
        y = TOP + (scale.y_high - level) / (scale.y_high - scale.y_low) * (bottom - TOP)
        label = f"{10**level:.0e}" if scale.log else f"{level:.6g}"
        parts.append(
            f'<line x1="{LEFT - 4}" y1="{y:.1f}" x2="{right}" y2="{y:.1f}" stroke="#e3e3e3"/>'
            f'<text x="{LEFT - 6}" y="{y + 4:.1f}" font-size="11" text-anchor="end">'
            f"{escape(label)}</text>"
        )
    for step in _x_ticks(scale):
        x = scale.x(step)
        parts.append(
            f'<line x1="{x:.1f}" y1="{bottom}" x2="{x:.1f}" y2="{bottom + 4}" stroke="#999"/>'
            f'<text x="{x:.1f}" y="{bottom + 16}" font-size="11" text-anchor="middle">'
            f"{step}</text>"
        )
    middle = (TOP + bottom) / 2
    parts.append(
        f'<text x="{(LEFT + right) / 2:.1f}" y="{HEIGHT - 6}" font-size="12" '
        'text-anchor="middle">step</text>'
        f'<text x="14" y="{middle:.1f}" font-size="12" text-anchor="middle" '
        f'transform="rotate(-90 14 {middle:.1f})">{escape(y_label)}</text>'
    )
    return parts


def _y_ticks(scale: Scale) -> list[float]:
    """Levels to label: whole decades on a log scale (its ends when it spans less than two),
    else evenly spaced values."""
    if scale.log:
        decades = list(range(math.ceil(scale.y_low), math.floor(scale.y_high) + 1))
        return [float(d) for d in decades] if len(decades) >= 2 else [scale.y_low, scale.y_high]
    every = _round_step((scale.y_high - scale.y_low) / (Y_TICKS - 1))
    first = math.ceil(scale.y_low / every)
    return [k * every for k in range(first, math.floor(scale.y_high / every) + 1)]


def _x_ticks(scale: Scale) -> list[int]:
    """Whole steps, at most about ``X_TICKS``."""
    every = max(round(_round_step((scale.x_high - scale.x_low) / X_TICKS)), 1)
    return list(range(math.ceil(scale.x_low / every) * every, math.floor(scale.x_high) + 1, every))


def _round_step(raw: float) -> float:
    """The largest of 1, 2 or 5 times a power of ten that is at most ``raw`` (> 0): ticks
    that read as round numbers, up to about twice as many as asked for."""
    power = 10.0 ** math.floor(math.log10(raw))
    return max(m * power for m in (1, 2, 5) if m * power <= raw * (1 + 1e-9))


def _line(s: Series, scale: Scale) -> list[str]:
    """The polyline of a series and, when it is short, a dot a point with its value."""
    known = [(step, value) for step, value in s.points if value is not None]
    dash = ' stroke-dasharray="6 4"' if s.dashed else ""
    points = " ".join(f"{scale.x(step):.1f},{scale.y(value):.1f}" for step, value in known)
    parts = [
        f'<polyline class="series" data-series="{escape(s.name)}" points="{points}" '
        f'fill="none" stroke="{s.colour}" stroke-width="2"{dash}>'
        f"<title>{escape(s.name)}</title></polyline>"
    ]
    if len(known) <= DOTS_UP_TO:
        for step, value in known:
            parts.append(
                f'<circle cx="{scale.x(step):.1f}" cy="{scale.y(value):.1f}" r="3" '
                f'fill="{s.colour}"><title>{escape(s.name)}, step {step}: '
                f"{escape(number(value))}</title></circle>"
            )
    return parts


def _legend(series: Sequence[Series]) -> list[str]:
    parts = []
    for k, s in enumerate(series):
        x = LEFT + 8 + 150 * k
        dash = ' stroke-dasharray="6 4"' if s.dashed else ""
        parts.append(
            f'<line x1="{x}" y1="{TOP - 12}" x2="{x + 24}" y2="{TOP - 12}" stroke="{s.colour}" '
            f'stroke-width="2"{dash}/>'
            f'<text x="{x + 30}" y="{TOP - 8}" font-size="12">{escape(s.name)}</text>'
        )
    return parts
