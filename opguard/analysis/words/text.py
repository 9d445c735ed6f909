"""How ops, tensors, numbers and GPU work read as text: one vocabulary for every front end.

The CLI report, the TUI's detail pane, the agent's evidence and its follow-up tools all show the
same things (a tensor's leading values and stats, a kernel's grid and duration, an argument's
value); each formatter and each "how many are shown" lives here once, as plain strings (the
front ends add their own styling). Torch-free, and it imports nothing above ``analysis``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

from ...store import KernelEntry, OpRecord, TensorRecord
from ...store.records import STAT_NAMES

VALUES_SHOWN = 4  # leading elements of a tensor shown beside its stats
ORIGINS_SHOWN = 4  # source lines shown of a kernel Inductor generated
TEXT_CHARS = 100  # longest argument or metadata value shown
KERNEL_NAME_CHARS = 100  # a kernel's full name as the agent reads it, clipped (signature kept)
SHORT_KERNEL_NAME_CHARS = 60  # a kernel's name without signature or template, clipped
# GPU work listed per op: the TUI's table has room for more than the report or the evidence.
KERNELS_LISTED = 8  # TUI detail pane
KERNELS_REPORTED = 6  # opguard diff's report
KERNELS_DESCRIBED = 4  # the agent's evidence and tools
COUNT_NAMES = ("nan", "inf")  # the stats that are counts, shown only when there are any


def number(value: Any) -> str:
    """A float to 8 significant digits; anything else as ``str`` gives it."""
    return f"{value:.8g}" if isinstance(value, float) else str(value)


def clip(text: str, limit: int = TEXT_CHARS) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def value_text(value: Any) -> str:
    """An argument or metadata value: strings quoted, numbers to 8 digits, long ones clipped."""
    if isinstance(value, str):
        return clip(repr(value))
    if isinstance(value, (list, tuple)):
        return clip("[" + ", ".join(value_text(v) for v in value) + "]")
    return clip(number(value))


def plain_value(value: Any) -> str:
    """An argument's value as a verdict's summary quotes it: strings quoted, nothing clipped."""
    return repr(value) if isinstance(value, str) else str(value)


def leading_values(t: TensorRecord) -> list[str]:
    """The first ``VALUES_SHOWN`` elements, as numbers."""
    return [number(v) for v in t.values()[:VALUES_SHOWN]]


def leading_bits(t: TensorRecord) -> list[str]:
    """The first ``VALUES_SHOWN`` elements' raw bits, in hex."""
    return t.bits()[:VALUES_SHOWN]


def stats_text(t: TensorRecord) -> str | None:
    """``min … max … mean … absmax …``, then the NaN and Inf counts that are not zero; None
    when no stats were read."""
    if t.stats is None or t.stats[0] is None:
        return None
    stats = zip(STAT_NAMES, t.stats, strict=False)
    return " ".join(f"{n} {number(v)}" for n, v in stats if n not in COUNT_NAMES or v)


def op_label(op: OpRecord) -> str:
    """``aten::add_.Tensor [optimizer, step 0] base.py:44 (main)``; a backward op names the
    forward op whose call site it borrowed."""
    gradient = f" gradient of #{op.forward_index}" if op.forward_index is not None else ""
    return f"{op.op} [{op.phase}{gradient}, step {op.step}] {op.call_site.short()}"


def op_line(op: OpRecord) -> str:
    return f"#{op.index} {op_label(op)}"


def short_kernel_name(name: str) -> str:
    """A kernel's name without its return type, template and parameter lists, clipped:
    ``void at::native::vectorized_elementwise_kernel<4, …>(int, …)`` reads
    ``at::native::vectorized_elementwise_kernel``."""
    short = name.removeprefix("void ").split("(", 1)[0].split("<", 1)[0] or name
    return clip(short, SHORT_KERNEL_NAME_CHARS)


def dims(values: tuple[int, ...] | None) -> str:
    """A grid or block as recorded: ``[64, 1, 1]``."""
    return "" if values is None else "[" + ", ".join(map(str, values)) + "]"


def kernel_line(k: KernelEntry, origin_ns: int | None = None, name_chars: int = 0) -> str:
    """``name grid [..] block [..] 4096 bytes stream 7 3.5 µs``: one launch on one line; from
    ``origin_ns`` on (CUPTI's clock: the start of the step's GPU work), when it ran instead of
    how long, ``stream 7 12.0–15.5 µs``; its name clipped to ``name_chars`` when given."""
    name = clip(k.name, name_chars) if name_chars else k.name
    shape = f" grid {dims(k.grid)} block {dims(k.block)}" if k.grid is not None else ""
    size = f" {k.nbytes} bytes" if k.nbytes is not None else ""
    if origin_ns is not None and k.start_ns is not None and k.end_ns is not None:
        when = f"{(k.start_ns - origin_ns) / 1e3:.1f}–{(k.end_ns - origin_ns) / 1e3:.1f}"
    else:
        when = f"{k.duration_us:.1f}"
    return f"{name}{shape}{size} stream {k.stream} {when} µs"


def kernel_cells(k: KernelEntry) -> tuple[str, str, str, str, str]:
    """Kind, name, grid and block (or bytes), stream and µs: one launch as table cells."""
    size = "" if k.nbytes is None else str(k.nbytes)
    shape = f"{dims(k.grid)} {dims(k.block)}" if k.grid is not None else size
    stream = "" if k.stream is None else str(k.stream)
    return k.kind, k.name, shape, stream, f"{k.duration_us:.1f}"


SPARK_BLOCKS = "▁▂▃▄▅▆▇█"
SPARK_WIDTH = 60  # characters of a sparkline; longer series share a character (their largest)


def sparkline(series: Sequence[tuple[int, float | None]], marked: int | None = None) -> str:
    """A one-line picture of a per-step series (the tolerant diff's drift): one block per step
    (the largest of several steps per block beyond :data:`SPARK_WIDTH`), its height the value
    on a log scale from the smallest positive value to the largest, ``·`` for 0, ``?`` for
    unknown (None), and the block holding step ``marked`` in brackets."""
    if not series:
        return ""
    per = -(-len(series) // SPARK_WIDTH)  # steps per block
    blocks = [series[k : k + per] for k in range(0, len(series), per)]
    values = [
        None if any(v is None for _, v in block) else max(v or 0.0 for _, v in block)
        for block in blocks
    ]
    positive = [v for v in values if v is not None and 0 < v < math.inf]
    low, high = (math.log10(min(positive)), math.log10(max(positive))) if positive else (0, 0)
    chars = []
    for block, value in zip(blocks, values, strict=True):
        if value is None:
            char = "?"
        elif value <= 0:
            char = "·"
        elif high == low or value == math.inf:
            char = SPARK_BLOCKS[-1]
        else:
            level = (math.log10(value) - low) / (high - low) * (len(SPARK_BLOCKS) - 1)
            char = SPARK_BLOCKS[round(level)]
        chars.append(f"[{char}]" if any(step == marked for step, _ in block) else char)
    return "".join(chars)
