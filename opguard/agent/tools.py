"""Follow-up tools: what the model may ask for beyond the bundle, answered from the traces.

An op's neighbours, the producer of one of its inputs, a wider source range, its kernels. Every
answer is short text (clipped), so it costs a bounded number of tokens in the next call, which
the budget counts like the rest of the prompt. Bad arguments come back as an ``error:`` answer
the model can correct, never as an exception.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from ..analysis.lookup import QueryError, input_tensor, neighbours, source_around
from ..analysis.text import clip, op_line
from ..store import OpRecord, RankTrace, Run, TraceError
from .describe import kernel_lines, op_detail, source_lines

NEIGHBOURS_MAX = 8
SOURCE_MAX = 20  # lines on each side of the call line
RESULT_CHARS = 4_000
KEPT_LINES_ONLY = (
    "(only the lines kept in the trace: the file is not on this machine or has changed since)"
)


class ToolInputError(Exception):
    """Arguments a tool cannot use; reported to the model as an ``error:`` answer."""


def _tool(
    name: str, description: str, extra: dict[str, Any], required: tuple[str, ...] = ()
) -> dict[str, Any]:
    properties = {
        "run": {"type": "string", "enum": ["a", "b"], "description": "run A or run B"},
        "index": {"type": "integer", "description": "op index (#N in the evidence)"},
        **extra,
    }
    return {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": properties,
                "required": ["run", "index", *required],
            },
        },
    }


_AROUND = {
    "before": {"type": "integer", "description": "how many before"},
    "after": {"type": "integer", "description": "how many after"},
}
TOOLS: list[dict[str, Any]] = [
    _tool(
        "neighbours",
        f"Ops just before and after an op in execution order (at most {NEIGHBOURS_MAX} each side).",
        _AROUND,
    ),
    _tool(
        "producer",
        "The op that produced one input of an op: its source, arguments, inputs and outputs.",
        {"slot": {"type": "string", "description": "input slot, e.g. self, input, other"}},
        ("slot",),
    ),
    _tool(
        "source",
        f"Source lines around an op's call site (at most {SOURCE_MAX} each side).",
        _AROUND,
    ),
    _tool(
        "kernels",
        "GPU kernels an op launched: name, grid, stream, duration; then GPU work launched "
        "after it by code OpGuard did not record.",
        {},
    ),
]


@dataclass(frozen=True, slots=True)
class OpFocus:
    """An op a question is about: run ``"a"`` or ``"b"``, its index, its rank (None: the rank
    the tools answer for)."""

    run: str
    index: int
    rank: int | None = None


class TraceTools:
    """Answers tool calls from rank ``rank`` of both runs."""

    def __init__(self, run_a: Run, run_b: Run, rank: int) -> None:
        self._runs = {"a": run_a, "b": run_b}
        self.rank = rank
        self._handlers: dict[str, Callable[[RankTrace, OpRecord, Mapping[str, Any]], list[str]]] = {
            "neighbours": self._neighbours,
            "producer": self._producer,
            "source": self._source,
            "kernels": self._kernels,
        }

    def call(self, name: str, arguments: Mapping[str, Any]) -> str:
        handler = self._handlers.get(name)
        if handler is None:
            return f"error: no tool {name!r}; tools: {', '.join(self._handlers)}"
        try:
            trace, op = self._op(arguments)
            text = "\n".join(handler(trace, op, arguments))
        except (ToolInputError, QueryError, TraceError) as exc:
            text = f"error: {exc}"
        return clip(text, RESULT_CHARS)

    def describe(self, focus: OpFocus) -> str:
        """Everything about one op (the TUI's selected op, attached to a question)."""
        rank = self.rank if focus.rank is None else focus.rank
        _, op = self._op({"run": focus.run, "index": focus.index}, rank)
        return "\n".join([f"run {focus.run.upper()}, rank {rank}:", *op_detail(op)])

    def _op(
        self, arguments: Mapping[str, Any], rank: int | None = None
    ) -> tuple[RankTrace, OpRecord]:
        run = str(arguments.get("run", "")).lower()
        if run not in self._runs:
            raise ToolInputError("run must be 'a' or 'b'")
        trace = self._runs[run].rank(self.rank if rank is None else rank)
        return trace, trace.op(_integer(arguments, "index", None))

    def _neighbours(
        self, trace: RankTrace, op: OpRecord, arguments: Mapping[str, Any]
    ) -> list[str]:
        before = min(_integer(arguments, "before", 3), NEIGHBOURS_MAX)
        after = min(_integer(arguments, "after", 3), NEIGHBOURS_MAX)
        return [
            ("> " if other.index == op.index else "  ") + op_line(other)
            for other in neighbours(trace, op.index, before, after)
        ]

    def _producer(self, trace: RankTrace, op: OpRecord, arguments: Mapping[str, Any]) -> list[str]:
        slot = str(arguments.get("slot", ""))
        tensor = input_tensor(op, slot)
        if tensor.producer is None:
            return [
                f"input {slot} of #{op.index} is a leaf: no recorded op produced it (data, a parameter, or made before recording)"
            ]
        index, output = tensor.producer
        return [f"input {slot} of #{op.index} is output {output} of:", *op_detail(trace.op(index))]

    def _source(self, trace: RankTrace, op: OpRecord, arguments: Mapping[str, Any]) -> list[str]:
        site = op.call_site
        before = min(_integer(arguments, "before", 5), SOURCE_MAX)
        after = min(_integer(arguments, "after", 5), SOURCE_MAX)
        view = source_around(site, before, after)
        note = [] if view.from_file else [KEPT_LINES_ONLY]
        return [
            f"{site.file}:{site.line} in {site.function}",
            *source_lines(view.rows, site.line),
            *note,
        ]

    def _kernels(self, trace: RankTrace, op: OpRecord, arguments: Mapping[str, Any]) -> list[str]:
        return kernel_lines(op) or [
            f"no kernels recorded for #{op.index} (a CPU op, or a run without kernel tracing)"
        ]


def _integer(arguments: Mapping[str, Any], name: str, default: int | None) -> int:
    value = arguments.get(name, default)
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ToolInputError(f"{name} must be an integer")
    try:
        number = int(value)
    except ValueError:
        raise ToolInputError(f"{name} must be an integer, not {value!r}") from None
    if number < 0:
        raise ToolInputError(f"{name} must not be negative")
    return number
