"""What the detail pane shows about a step recorded at step level: its state entries compared,
those that differ first (in the order the step computed them) with both runs' leading values
and stats, and those recorded in one run only. Plain Rich renderables, testable without the
app."""

from __future__ import annotations

from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from ..analysis.state_diff import StatePair, StepComparison, StepDivergence
from ..analysis.words.text import VALUES_SHOWN, number
from ..store import TensorRecord

ROWS_SHOWN = 40  # differing entries listed; the rest are counted
DIFFERS = "bold red"


def render_step(
    step: int,
    comparison: StepComparison | None,
    first: StepDivergence | None,
    only_in: str | None = None,
) -> RenderableType:
    """``comparison`` of step ``step`` (None: recorded only in run ``only_in``); ``first``:
    the rank's first differing step, whose meaning is said on its own step."""
    title = Text(f"step {step}", style="bold")
    if comparison is None:
        return Group(title, Text(f"recorded at step level in run {only_in} only: not compared"))
    parts: list[RenderableType] = [title]
    if first is not None and first.step == step:
        parts.append(Text(f"first differing step: {first.meaning}", style=DIFFERS))
    if comparison.equal:
        parts.append(Text("the state is equal in both runs", style="green"))
    else:
        count = len(comparison.differing)
        parts.append(Text(f"{count} entries differ: {comparison.kinds_text()}"))
        parts.append(_table(comparison.differing))
    if comparison.only_a or comparison.only_b:
        parts.append(Text(f"recorded in one run only: {comparison.only_text()}", style="yellow"))
    return Group(*parts)


def _table(pairs: tuple[StatePair, ...]) -> Table:
    table = Table(box=box.SIMPLE_HEAD, expand=True, pad_edge=False)
    table.add_column("entry", overflow="fold", ratio=2)
    table.add_column("A", overflow="fold", ratio=3)
    table.add_column("B", overflow="fold", ratio=3)
    for pair in pairs[:ROWS_SHOWN]:
        a, b = pair.a.tensor, pair.b.tensor
        table.add_row(pair.label, _tensor(a, b), _tensor(b, a))
    if len(pairs) > ROWS_SHOWN:
        table.add_row(f"… {len(pairs) - ROWS_SHOWN} more", "", "")
    return table


def _tensor(t: TensorRecord, other: TensorRecord) -> Text:
    """Shape, fingerprint, leading values (those that differ from ``other``'s marked) and the
    stats."""
    text = Text(f"{t.describe_shape()} fp {t.fingerprint_text()}")
    if t.head:
        mine = t.values()[:VALUES_SHOWN]
        theirs = other.values()[:VALUES_SHOWN] if other.head else mine
        text.append("\n")
        for k, value in enumerate(mine):
            differs = k >= len(theirs) or theirs[k] != value
            text.append(f"{number(value)} ", DIFFERS if differs else "")
    if t.stats is not None and t.stats[0] is not None:
        mn, mx, mean, absmax = t.stats[:4]
        text.append(f"\nmin {mn:.6g} max {mx:.6g} mean {mean:.6g} |max| {absmax:.6g}", "dim")
    return text
