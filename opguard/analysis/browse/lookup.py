"""Lookups in one trace that both kinds of follow-up tools answer from: the embedded LLM agent's
(as text, :mod:`opguard.agent.tools`) and the coding-agent tools' (as JSON, :mod:`opguard.tools`).
One implementation, so the two never disagree about an op's neighbours, inputs or source.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from ...store import CallSite, OpRecord, RankTrace, TensorRecord


class QueryError(ValueError):
    """A question the trace cannot answer as asked (an input slot the op does not have): one
    line the asker can act on."""


def neighbours(trace: RankTrace, index: int, before: int, after: int) -> list[OpRecord]:
    """Ops ``index - before`` to ``index + after`` in execution order (fewer at either end)."""
    return list(trace.ops(max(index - before, 0), index + after + 1))


def input_tensor(op: OpRecord, slot: str) -> TensorRecord:
    """Input ``slot`` of ``op``; the error lists the slots it has."""
    tensor = next((t for t in op.inputs if t.slot == slot), None)
    if tensor is None:
        slots = ", ".join(t.slot for t in op.inputs) or "none"
        raise QueryError(f"op #{op.index} has no input {slot!r}; inputs: {slots}")
    return tensor


@dataclass(frozen=True, slots=True)
class SourceView:
    """Numbered source lines around a call; ``from_file`` is False when only the lines the
    trace kept could be shown (the file is elsewhere or changed since recording)."""

    rows: list[tuple[int, str]]
    from_file: bool


def source_around(site: CallSite, before: int, after: int) -> SourceView:
    rows = _file_rows(site, before, after)
    if rows is not None:
        return SourceView(rows, True)
    return SourceView(kept_rows(site, before, after), False)


def kept_rows(site: CallSite, before: int, after: int) -> list[tuple[int, str]]:
    """The source lines the trace kept around the call line."""
    return [(n, text) for n, text in site.source if site.line - before <= n <= site.line + after]


def _file_rows(site: CallSite, before: int, after: int) -> list[tuple[int, str]] | None:
    """Lines around the call from the source file itself, if the file here still has the lines
    the trace kept (so a file edited since, or another machine's path, is never quoted)."""
    try:
        lines = Path(site.file).read_text(errors="replace").splitlines()
    except OSError:
        return None
    if not site.source or any(
        n > len(lines) or lines[n - 1].rstrip() != text.rstrip() for n, text in site.source
    ):
        return None
    lo, hi = max(site.line - before, 1), min(site.line + after, len(lines))
    return [(n, lines[n - 1]) for n in range(lo, hi + 1)]
