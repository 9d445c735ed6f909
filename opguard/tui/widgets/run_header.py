"""The header: the verdict, the two runs and how their recording ended, rank and step."""

from __future__ import annotations

from collections.abc import Sequence

from rich.text import Text
from textual.widgets import Static

from ...analysis import RankDiff
from ...analysis.align.steps import StepCount
from ...analysis.tolerant.judgement import RankTolerance
from ...analysis.words.verdict import label
from ..session import RunState


class RunHeader(Static):
    """Three lines: verdict, rank and step; the runs; the divergence summary and its likely
    causes, or a notice. A divergence is the first op-level one, else the first step whose
    state differs (step-level records)."""

    _shown: Text | None = None

    def show(
        self,
        diff: RankDiff | None,
        failed: str,
        runs: Sequence[RunState],
        rank: int,
        ranks: Sequence[int],
        position: str,
    ) -> None:
        """``position``: where in the run the cursor is (:func:`op_position`)."""
        text = Text()
        if failed:
            text.append(" DIFF FAILED ", style="bold white on red")
        elif diff is None:
            text.append(" COMPARING… ", style="bold black on yellow")
        elif not diff.diverged:  # identical, (--tolerant) within rounding, or incomplete
            colour = "yellow" if diff.verdict == "incomplete" else "green"
            text.append(f" {diff.verdict.upper()} ", style=f"bold black on {colour}")
            for name, why in diff.unread:
                text.append(f"  run {name} could not be read further ({why})", style="yellow")
            if diff.judged_by_nothing:
                text.append(
                    f"  {diff.judged_by_nothing} differing tensor(s) of unknown distance "
                    "judged by nothing",
                    style="yellow",
                )
        else:
            text.append(f" {diff.verdict.upper()} ", style="bold white on red")
            first = diff.first or diff.state_first
            assert first is not None
            kind = label(first.kind, first.cause)
            seen = "first seen in step" if diff.first is not None else "first differing step"
            text.append(f"  {kind}, {seen} {first.step}")
        where = f"  rank {rank} ({len(ranks)} compared)"
        text.append(where + (f" · {position}" if position else ""), style="bold")
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
        elif diff is not None and diff.verdict == "within-rounding":
            # The step-level records differ too, by the rounding the ops were judged by.
            assert diff.tolerance is not None
            text.append(f" {within_rounding(diff.tolerance)}", style="green")
        elif diff is not None and diff.state_first is not None:
            text.append(f" {diff.state_first.summary}")
        elif diff is not None and not diff.ops_compared and diff.states is not None:
            text.append(f" {diff.states.compared} steps' state, all equal", style="green")
        elif diff is not None:
            text.append(f" {diff.aligned} aligned ops, all equal", style="green")
        else:
            text.append(" aligning both runs in the background; the list is live", style="dim")
        if text != self._shown:  # most keys leave it as it is: no redraw then
            self._shown = text
            self.update(text, layout=False)


def within_rounding(found: RankTolerance) -> str:
    """What the header says of a rank whose differences rounding explains, all of them."""
    flips = f", {found.flips} of them integer/bool flips" if found.flips else ""
    unjudged = (
        f"; {found.unjudged_count} tensor(s) of unknown distance judged by what they feed"
        if found.unjudged_count
        else ""
    )
    return f"{found.explained} differing aligned op(s) explained by rounding{flips}{unjudged}"


def op_position(step: int | None, steps: Sequence[int], taken: int) -> str:
    """Where the op list's cursor is: ``step 1 (2 of 4)``, or after the last step.
    ``steps``: the step numbers the list holds; ``taken``: how many of them are steps (the
    others hold the ops after the last step)."""
    if step is None:
        return ""
    if step < taken:
        return f"step {step} ({steps.index(step) + 1} of {taken})"
    ended = f"after the last step ({StepCount(taken).describe()})"
    return ended if taken else "before any step ended"
