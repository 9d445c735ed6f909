"""What the detail pane shows about the selected row: both runs' records of the op, side by
side, with what differs marked, its source and stack, the producers of its inputs, and its GPU
kernels. Only the selected op (and the names of its producers) is decoded in full.

Plain Rich renderables, so this is testable and reusable without the Textual app.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from rich import box
from rich.console import Group, RenderableType
from rich.syntax import Syntax
from rich.table import Table
from rich.text import Text

from ..analysis.browse.rows import Row, Side
from ..analysis.divergence.model import differing_arguments, differing_tensors
from ..analysis.elementwise import ElementwiseDiff, compare
from ..analysis.words.text import (
    KERNELS_LISTED,
    ORIGINS_SHOWN,
    kernel_cells,
    leading_bits,
    leading_values,
    stats_text,
)
from ..store import CallSite, OpRecord, RankTrace, TensorRecord, TraceError

HEAT_DIMS = 2  # strips shown per captured tensor
DIFFERS = "bold red"
VIEW_CHAIN = 16  # views of views followed back to the data they view, at most


@dataclass(frozen=True, slots=True)
class Producer:
    """An input of the selected op and the op that produced it: a place to jump to."""

    number: int  # what the person presses to follow it
    slot: str
    side: Side
    index: int
    op: str
    differs: bool  # the input's content differs between the runs


@dataclass(frozen=True, slots=True)
class Base:
    """The data a view views (a view is never read again: its values are these)."""

    tensor: TensorRecord
    where: str  # "A #12 aten::add.Tensor output 0": the op that wrote it, if one did


Bases = dict[tuple[str, str], Base]  # ("inputs" or "outputs", slot) of a view -> its base


@dataclass(frozen=True, slots=True)
class Selection:
    """The selected row, decoded."""

    row: Row
    mark: str  # "first divergence", "cause" or ""
    a: OpRecord | None
    b: OpRecord | None
    stacks: tuple[list[CallSite], list[CallSite]]
    producers: tuple[Producer, ...]
    captured: tuple[ElementwiseDiff, ...] = ()  # outputs captured in both runs, compared
    bases: tuple[Bases, Bases] = ({}, {})  # each run's views' bases

    @classmethod
    def load(cls, row: Row, traces: tuple[RankTrace, RankTrace], mark: str = "") -> Selection:
        a = traces[0].op(row.a.index) if row.a is not None else None
        b = traces[1].op(row.b.index) if row.b is not None else None
        stacks = (
            traces[0].stack(a.stack_id) if a is not None else [],
            traces[1].stack(b.stack_id) if b is not None else [],
        )
        bases = (_bases(a, traces[0], Side.A), _bases(b, traces[1], Side.B))
        producers, captured = _producers(a, b, traces), _captured(a, b, traces)
        return cls(row, mark, a, b, stacks, producers, captured, bases)

    def follow(self, number: int | None = None) -> Producer | None:
        """Producer ``number``; by default the first one whose input differs (the way back
        to a difference's cause), else the first one."""
        if number is not None:
            return next((p for p in self.producers if p.number == number), None)
        return next((p for p in self.producers if p.differs), None) or next(
            iter(self.producers), None
        )


def _producers(
    a: OpRecord | None, b: OpRecord | None, traces: tuple[RankTrace, RankTrace]
) -> tuple[Producer, ...]:
    side, op = (Side.A, a) if a is not None else (Side.B, b)
    if op is None:
        return ()
    differing = {d.slot for d in differing_tensors(a.inputs, b.inputs)} if a and b else set()
    found: list[Producer] = []
    for tensor in op.inputs:
        if tensor.producer is None:
            continue
        index = tensor.producer[0]
        try:
            name = traces[side.value].op(index).op
        except TraceError:
            name = "?"
        found.append(
            Producer(len(found) + 1, tensor.slot, side, index, name, tensor.slot in differing)
        )
    return tuple(found)


def _bases(op: OpRecord | None, trace: RankTrace, side: Side) -> Bases:
    """The bases of the op's tensors that are views: an output's is the op's own input; an
    input's, that of the view op that made it."""
    if op is None:
        return {}
    found: Bases = {}
    for title, tensors in (("inputs", op.inputs), ("outputs", op.outputs)):
        for t in tensors:
            if not t.is_view:
                continue
            try:
                maker = op if title == "outputs" else _maker(t, trace)
                base = _base(maker, trace, side) if maker is not None else None
            except TraceError:  # a damaged record on the way: the view is shown without
                base = None
            if base is not None:
                found[title, t.slot] = base
    return found


def _maker(t: TensorRecord, trace: RankTrace) -> OpRecord | None:
    return trace.op(t.producer[0]) if t.producer is not None else None


def _base(maker: OpRecord, trace: RankTrace, side: Side) -> Base | None:
    """The data the view ``maker`` made views: its first input (a view op's base), followed
    back through the view ops that made it to a tensor whose values were read."""
    op: OpRecord | None = maker
    for _ in range(VIEW_CHAIN):
        source = op.inputs[0] if op is not None and op.inputs else None
        if source is None or not source.is_view:
            break
        op = _maker(source, trace)
    else:
        return None
    if source is None or not (source.head or source.stats):
        return None
    if source.producer is None:
        return Base(source, "a tensor no recorded op wrote")
    index, slot = source.producer
    return Base(source, f"{side.name} #{index} {trace.op(index).op} output {slot}")


def _captured(
    a: OpRecord | None, b: OpRecord | None, traces: tuple[RankTrace, RankTrace]
) -> tuple[ElementwiseDiff, ...]:
    """Element-wise comparisons of the outputs both runs captured (``record --capture``)."""
    if a is None or b is None:
        return ()
    theirs = {t.label: t for t in traces[1].captures(b.index) if t.direction == "y"}
    return tuple(
        compare(t, theirs[t.label])
        for t in traces[0].captures(a.index)
        if t.direction == "y" and t.label in theirs
    )


# -- rendering --------------------------------------------------------------------------------


def display_path(path: str) -> str:
    """Paths under the working directory are shown relative to it."""
    if os.path.isabs(path):
        relative = os.path.relpath(path)
        if not relative.startswith(".."):
            return relative
    return path


@dataclass(frozen=True, slots=True)
class _Shown:
    """A tensor as the pane shows it, with the base whose values it shows when it is a view."""

    tensor: TensorRecord | None
    base: Base | None = None

    @property
    def values(self) -> TensorRecord | None:
        """The record holding its values: a view's base."""
        return self.base.tensor if self.base is not None else self.tensor


def _tensor_text(shown: _Shown, other: _Shown | None) -> Text:
    """A tensor's shape, fingerprint, leading values (as numbers and raw bits) and stats (a
    view's: its base's, named); leading values that differ from ``other``'s are marked."""
    t = shown.tensor
    if t is None:
        return Text("(absent)", style="dim")
    derived = t.is_view and t.hash is not None  # a view's fingerprint: its base's and geometry
    text = Text(f"{t.describe_shape()}  fp {f'{t.hash:016x}' if derived else t.fingerprint_text()}")
    if shown.base is not None:
        text.append(f" (view of {shown.base.where})", style="dim")
    held, theirs_held = shown.values, other.values if other is not None else None
    if held is not None and held.head:
        values, bits = leading_values(held), leading_bits(held)
        theirs = leading_bits(theirs_held) if theirs_held is not None and theirs_held.head else None
        text.append("\n")
        for at, (value, bit) in enumerate(zip(values, bits, strict=False)):
            differs = theirs is not None and (at >= len(theirs) or theirs[at] != bit)
            text.append(f"{value} ", style=DIFFERS if differs else "")
        text.append("\n" + " ".join(bits), style="dim")
    stats = stats_text(held) if held is not None else None
    if stats is not None:
        text.append("\n" + stats, style="dim")
    return text


def _tensors(
    title: str,
    a: Sequence[TensorRecord],
    b: Sequence[TensorRecord],
    runs: str,
    bases: tuple[Bases, Bases],
) -> Table:
    """Tensors by slot; a slot equal in both runs is shown once (``A=B``), a differing one
    from each run. ``runs`` says which runs have the op: "AB", "A" or "B"."""
    differing = {d.slot for d in differing_tensors(tuple(a), tuple(b))} if runs == "AB" else set()
    by_a, by_b = {t.slot: t for t in a}, {t.slot: t for t in b}
    table = Table.grid(padding=(0, 1))
    table.title, table.title_justify, table.title_style = title, "left", "bold"
    table.add_column(no_wrap=True)
    table.add_column(no_wrap=True)
    table.add_column()
    for slot in [*by_a, *(s for s in by_b if s not in by_a)]:
        sa = _Shown(by_a.get(slot), bases[0].get((title, slot)))
        sb = _Shown(by_b.get(slot), bases[1].get((title, slot)))
        if runs != "AB":
            table.add_row(slot, runs, _tensor_text(sa if runs == "A" else sb, None))
        elif slot not in differing:
            table.add_row(slot, "A=B", _tensor_text(sa, None))
        else:
            table.add_row(Text(f"≠ {slot}", style=DIFFERS), "A", _tensor_text(sa, sb))
            table.add_row("", "B", _tensor_text(sb, sa))
    return table


def _table(title: str, both: bool) -> Table:
    table = Table(title=title, title_justify="left", title_style="bold", box=None, expand=False)
    table.add_column("", no_wrap=True)
    table.add_column("A" if both else "")
    if both:
        table.add_column("B")
    return table


def _arguments(a: OpRecord | None, b: OpRecord | None) -> Table | None:
    ops = [op for op in (a, b) if op is not None]
    if not any(op.args for op in ops):
        return None
    differing = {d.name for d in differing_arguments(a, b)} if a and b else set()
    table = _table("arguments", a is not None and b is not None)
    names = dict.fromkeys(name for op in ops for name, _ in op.args)
    for name in names:
        style = DIFFERS if name in differing else ""
        cells = [_argument(dict(op.args), name, style) for op in ops]
        table.add_row(Text(f"≠ {name}" if style else name, style=style), *cells)
    return table


def _argument(args: dict[str, Any], name: str, style: str) -> Text:
    """An argument's value as passed, or "default" when the call left it out."""
    if name not in args:
        return Text("default", style=f"{style} italic")
    return Text(repr(args[name]), style=style)


def _scalars(a: OpRecord | None, b: OpRecord | None) -> Text | None:
    """The RNG state a random op consumed and a returned number (``.item()``), when there."""
    text = Text()
    for label, attr, fmt in (("RNG state", "rng", "{:016x}"), ("returned", "returned", "{}")):
        values = [getattr(op, attr) if op is not None else None for op in (a, b)]
        if all(v is None for v in values):
            continue
        shown = ["-" if v is None else fmt.format(v) for v in values]
        differs = a is not None and b is not None and values[0] != values[1]
        text.append(f"{label}: A {shown[0]}   B {shown[1]}\n", style=DIFFERS if differs else "")
    return text if text else None


def _source(site: CallSite, run: str) -> RenderableType:
    title = Text(f"{run} {display_path(site.file)}:{site.line} in {site.function}", style="bold")
    if not site.source:
        return Group(title, Text("  (no source recorded)", style="dim"))
    code = "\n".join(text for _, text in site.source)
    syntax = Syntax(
        code,
        "python",
        line_numbers=True,
        start_line=site.source[0][0],
        highlight_lines={site.line},
        theme="ansi_dark",
        word_wrap=False,
    )
    return Group(title, syntax)


def _sources(a: OpRecord | None, b: OpRecord | None) -> list[RenderableType]:
    """Where each run's op was called, then, for a kernel Inductor generated, the source lines
    it computes ("from"); shown once when both runs have the same."""
    ops = [(run, op) for run, op in (("A", a), ("B", b)) if op is not None]
    shown: list[RenderableType] = []
    for suffix, groups in (
        ("", [(op.call_site,) for _, op in ops]),
        (" from", [op.origins[:ORIGINS_SHOWN] for _, op in ops]),
    ):
        runs = [run for run, _ in ops]
        if len(groups) == 2 and groups[0] == groups[1]:
            runs, groups = ["A and B"], groups[:1]
        shown += [
            _source(site, run + suffix)
            for run, group in zip(runs, groups, strict=True)
            for site in group
        ]
    return shown


def _stack(frames: Iterable[CallSite], run: str) -> Text:
    text = Text(f"stack {run} (outermost first)\n", style="bold")
    frames = list(frames)
    for depth, site in enumerate(frames):
        marker = "▶ " if depth == len(frames) - 1 else "  "
        text.append(
            f"{marker}{'  ' * min(depth, 8)}{display_path(site.file)}:{site.line} {site.function}\n"
        )
    return text


def _producer_text(producers: Sequence[Producer]) -> Text | None:
    if not producers:
        return None
    text = Text(
        "producers of the inputs (press the number to follow, f: first differing, b: back)\n",
        style="bold",
    )
    for p in producers:
        line = f"  [{p.number}] {p.slot} ← {p.side.name} #{p.index} {p.op}"
        text.append(
            line + (" (differs)\n" if p.differs else "\n"), style=DIFFERS if p.differs else ""
        )
    return text


def _kernels(a: OpRecord | None, b: OpRecord | None) -> Table | None:
    """The GPU work each run's op launched, then (apart) what code OpGuard did not record
    launched after it."""
    groups = [
        group
        for run, op in (("A", a), ("B", b))
        if op is not None
        for group in ((run, op.kernels), (f"{run} after, unrecorded", op.unclaimed_kernels))
        if group[1]
    ]
    if not groups:
        return None
    table = Table(
        title="GPU work", title_justify="left", title_style="bold", box=box.SIMPLE_HEAD, expand=True
    )
    for column in ("run", "kind", "name", "grid / bytes", "stream", "µs"):
        table.add_column(column)
    for run, kernels in groups:
        for k in kernels[:KERNELS_LISTED]:
            table.add_row(run, *kernel_cells(k))
        if len(kernels) > KERNELS_LISTED:
            table.add_row(run, "", f"… {len(kernels) - KERNELS_LISTED} more", "", "", "")
    return table


def _heat(diffs: Sequence[ElementwiseDiff]) -> Text | None:
    """Captured outputs: share of differing elements and a strip per dimension (darker: more
    differing elements along that stretch of the dimension), and the pattern's name."""
    if not diffs:
        return None
    text = Text("captured tensors (opguard tensor for the full report)\n", style="bold")
    for d in diffs:
        head = f"  {d.label} {d.dtype}{list(d.shape)}: "
        if not d.differing:
            text.append(head + f"{d.verdict or 'identical'}\n")
            continue
        text.append(head + f"{d.differing}/{d.elements} differ ({d.fraction:.1%})\n")
        for spread in d.spread[:HEAT_DIMS]:
            text.append(f"    dim {spread.dim} ")
            text.append(spread.strip(), style=DIFFERS)
            text.append("\n")
        text.append(f"    {d.verdict}\n", style="dim")
    return text


def _title(sel: Selection) -> Text:
    """The op and its status; then which op it is in each run, its phase and step."""
    status = sel.mark or sel.row.status.value
    text = Text(sel.row.shown.name, style="bold")
    text.append(f"  [{status}]", style=DIFFERS if sel.mark or status == "differing" else "")
    where = [
        f"{run} #{rec.index}" if rec else f"{run} -" for run, rec in (("A", sel.a), ("B", sel.b))
    ]
    rec = sel.a or sel.b
    if rec is not None:
        where += [rec.phase, f"step {rec.step}"]
    text.append("\n" + " · ".join(where), style="dim")
    return text


def render(sel: Selection) -> RenderableType:
    """The whole detail pane for one selected row."""
    a, b = sel.a, sel.b
    parts: list[RenderableType | None] = [_title(sel), _arguments(a, b), _scalars(a, b)]
    runs = "".join(run for run, op in (("A", a), ("B", b)) if op is not None)
    for title in ("inputs", "outputs"):
        tensors = [getattr(op, title) if op is not None else () for op in (a, b)]
        if any(tensors):
            parts.append(_tensors(title, tensors[0], tensors[1], runs, sel.bases))
    parts.append(_heat(sel.captured))
    parts.append(_producer_text(sel.producers))
    parts.extend(_sources(a, b))
    stacks = [(run, frames) for run, frames in zip(("A", "B"), sel.stacks, strict=True) if frames]
    if len(stacks) == 2 and stacks[0][1] == stacks[1][1]:
        stacks = [("A and B", stacks[0][1])]
    parts.extend(_stack(frames, run) for run, frames in stacks)
    parts.append(_kernels(a, b))
    return Group(*(p for p in parts if p is not None))
