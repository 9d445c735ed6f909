"""The header: the verdict, the two runs and how their recording ended, rank and step."""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text
from textual.widgets import Static

from ...analysis import RankDiff
from ...analysis.steps import StepCount
from ..session import RunState


class RunHeader(Static):
    """Three lines: verdict, rank and step; the runs; the divergence summary and its likely
    causes, or a notice."""

    _shown: Text | None = None

    def show(
        self,
        diff: RankDiff | None,
        failed: str,
        runs: Sequence[RunState],
        rank: int,
        ranks: Sequence[int],
        step: int | None,
        steps: Sequence[int],
        taken: int,
    ) -> None:
        """``steps``: the step numbers the list holds; ``taken``: how many of them are steps
        (the others hold the ops after the last step)."""
        text = Text()
        if failed:
            text.append(" DIFF FAILED ", style="bold white on red")
        elif diff is None:
            text.append(" COMPARING… ", style="bold black on yellow")
        elif diff.first is None:
            text.append(" IDENTICAL ", style="bold black on green")
        else:
            text.append(" DIVERGED ", style="bold white on red")
            first = diff.first
            kind = first.kind if first.kind == first.cause else f"{first.kind} ({first.cause})"
            text.append(f"  {kind}, first seen in step {first.step}")
        where = f"  rank {rank} ({len(ranks)} compared)"
        if step is not None and step < taken:
            where += f" · step {step} ({steps.index(step) + 1} of {taken})"
        elif step is not None:
            ended = f"after the last step ({StepCount(taken).describe()})"
            where += f" · {ended if taken else 'before any step ended'}"
        text.append(where, style="bold")
        text.append("\n")
        for name, run in zip("AB", runs, strict=True):
            style = "" if run.finished else "bold yellow"
            text.append(f" {name} ", style="bold reverse")
            text.append(f" {run.label} ")
            text.append(f"({run.describe()})  ", style=style or "dim")
        text.append("\n")
        if failed:
            text.append(f" {failed}", style="red")
        elif diff is not None and diff.first is not None:
            text.append(f" {diff.first.summary}")
            # The summary names an origin's most likely cause; the others follow it.
            others = [
                c.cause for c in diff.first.likely_causes if c.cause not in diff.first.summary
            ]
            if others:
                text.append("  likely: " + " · ".join(others), style="italic")
        elif diff is not None:
            text.append(f" {diff.aligned} aligned ops, all equal", style="green")
        else:
            text.append(" aligning both runs in the background; the list is live", style="dim")
        if text != self._shown:  # most keys leave it as it is: no redraw then
            self._shown = text
            self.update(text, layout=False)
