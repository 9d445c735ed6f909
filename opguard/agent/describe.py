"""Compact, deterministic text for ops, tensors, source lines and kernels.

The shared vocabulary of the evidence bundle and the follow-up tools, written for a model's
context window: short file names, a few leading values with their raw bits, stats, and nothing a
reader cannot use (fingerprints only say "differs", which the headings already say).
"""

from __future__ import annotations

import textwrap

from ..analysis.align.steps import StepIndex
from ..analysis.browse.lookup import kept_rows
from ..analysis.words.text import (
    KERNEL_NAME_CHARS,
    KERNELS_DESCRIBED,
    ORIGINS_SHOWN,
    kernel_line,
    leading_bits,
    leading_values,
    number,
    op_line,
    value_text,
)
from ..store import CallSite, KernelEntry, OpRecord, RankTrace, TensorRecord

SOURCE_CONTEXT = 2  # lines on each side of a call line


def source_rows(
    site: CallSite, before: int = SOURCE_CONTEXT, after: int = SOURCE_CONTEXT
) -> list[tuple[int, str]]:
    """The recorded source lines around the call line."""
    return kept_rows(site, before, after)


def origin_lines(op: OpRecord) -> list[str]:
    """For a kernel Inductor generated: the user's source lines it computes, one line each
    (its call site is where the compiled code was called)."""
    lines = [
        f"  from {site.short()}: {site.source_line() or ''}".rstrip()
        for site in op.origins[:ORIGINS_SHOWN]
    ]
    if len(op.origins) > ORIGINS_SHOWN:
        lines.append(f"  … {len(op.origins) - ORIGINS_SHOWN} more source lines")
    return lines


def source_lines(rows: list[tuple[int, str]], marked: int) -> list[str]:
    """Numbered, dedented source; the call line marked with ``>``."""
    if not rows:
        return []
    body = textwrap.dedent("\n".join(text for _, text in rows)).split("\n")
    return [
        f"{'>' if n == marked else ' '}{n:>5}| {text}".rstrip()
        for (n, _), text in zip(rows, body, strict=True)
    ]


def tensor_text(t: TensorRecord | None) -> str:
    """Shape, leading values and bits, stats: one line."""
    if t is None:
        return "(absent)"
    parts = [t.describe_shape()]
    if t.is_uninitialized:
        parts.append("uninitialized memory")
    elif t.is_view:
        parts.append("view (content is its base's)")
    elif t.hash is None:
        parts.append("content not read")
    if t.head:
        parts.append("values [" + ", ".join(leading_values(t)) + "]")
        parts.append("bits [" + " ".join(leading_bits(t)) + "]")
    if t.stats is not None and t.stats[0] is not None:
        mn, mx, mean, absmax, nan, inf = t.stats
        parts.append(
            f"min {number(mn)} max {number(mx)} mean {number(mean)} absmax {number(absmax)}"
        )
        if nan or inf:
            parts.append(f"nan {nan} inf {inf}")
    return " ".join(parts)


def kernel_lines(op: OpRecord, trace: RankTrace) -> list[str]:
    """The GPU work the op launched, as the report words it (name, grid, block, bytes,
    stream), each with when it ran from the start of the step's GPU work (so that the kernels
    of the step's ops compare, across streams); then, apart, the GPU work code OpGuard did not
    record launched after the op (before the next one). Under a line that says from when;
    none when the op launched nothing."""
    if not (op.kernels or op.unclaimed_kernels):
        return []
    span = StepIndex(trace).get(op.step)
    origin = trace.first_gpu_start(span.start, op.index + 1) if span is not None else None
    lines = _entry_lines(op.kernels, "kernels", origin)
    unrecorded = _entry_lines(op.unclaimed_kernels, "launches", origin)
    lines += [f"after this op, unrecorded: {line}" for line in unrecorded]
    since = f"µs from the start of step {op.step}'s GPU work" if origin is not None else "µs"
    return [f"kernels, {since}:", *(f"  {line}" for line in lines)]


def _entry_lines(kernels: tuple[KernelEntry, ...], noun: str, origin: int | None) -> list[str]:
    lines = [kernel_line(k, origin, KERNEL_NAME_CHARS) for k in kernels[:KERNELS_DESCRIBED]]
    if len(kernels) > KERNELS_DESCRIBED:
        lines.append(f"… {len(kernels) - KERNELS_DESCRIBED} more {noun}")
    return lines


def op_detail(op: OpRecord, trace: RankTrace) -> list[str]:
    """Everything a follow-up question may need about one op, compactly."""
    lines = [op_line(op)]
    lines += source_lines(source_rows(op.call_site), op.call_site.line)
    lines += origin_lines(op)
    lines += [f"  arg {name} = {value_text(value)}" for name, value in op.args]
    if op.rng is not None:
        lines.append(f"  consumed RNG state {op.rng:016x}")
    for t in op.inputs:
        producer = f" from #{t.producer[0]} out {t.producer[1]}" if t.producer else " (leaf)"
        lines.append(f"  in {t.slot}{producer}: {tensor_text(t)}")
    lines += [f"  out {t.slot}: {tensor_text(t)}" for t in op.outputs]
    lines += [f"  {line}" for line in kernel_lines(op, trace)]
    return lines
