"""Follow-up tools: what the model may ask for beyond the bundle, answered from the traces.

An op's neighbours, the producer of one of its inputs, a wider source range, its kernels. Every
answer is short text (clipped), so it costs a bounded number of tokens in the next call, which
the budget counts like the rest of the prompt. The tools are declared as the coding agents'
are (:mod:`opguard.tool_registry`), so their schemas and argument checks are the registry's;
bad arguments come back as an ``error:`` answer the model can correct, never as an exception.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from ..analysis.browse.lookup import input_tensor, neighbours, source_around
from ..analysis.words.text import clip, op_line
from ..store import OpRecord, RankTrace, Run
from ..tool_registry import Param, Tool, ToolError
from .describe import kernel_lines, op_detail, source_lines

NEIGHBOURS_MAX = 8
SOURCE_MAX = 20  # lines on each side of the call line
RESULT_CHARS = 4_000
KEPT_LINES_ONLY = (
    "(only the lines kept in the trace: the file is not on this machine or has changed since)"
)


RUN = Param("run", "string", "run A or run B", choices=("a", "b"), required=True)
INDEX = Param("index", "integer", "op index (#N in the evidence)", required=True, minimum=0)


def _around(most: int, default: int) -> tuple[Param, Param]:
    before = Param("before", "integer", "how many before", default=default, minimum=0, maximum=most)
    return before, replace(before, name="after", help="how many after")


HERE = "opguard.agent.tools"
# The follow-up tools, declared like the coding agents' (opguard.tools.catalog): the registry
# derives the schemas the model is offered and checks the arguments it sends.
FOLLOW_UPS: tuple[Tool, ...] = (
    Tool(
        "neighbours",
        f"Ops just before and after an op in execution order (at most {NEIGHBOURS_MAX} each side).",
        (RUN, INDEX, *_around(NEIGHBOURS_MAX, 3)),
        f"{HERE}:neighbours_text",
    ),
    Tool(
        "producer",
        "The op that produced one input of an op: its source, arguments, inputs and outputs.",
        (
            RUN,
            INDEX,
            Param("slot", "string", "input slot, e.g. self, input, other", required=True),
        ),
        f"{HERE}:producer_text",
    ),
    Tool(
        "source",
        f"Source lines around an op's call site (at most {SOURCE_MAX} each side).",
        (RUN, INDEX, *_around(SOURCE_MAX, 5)),
        f"{HERE}:source_text",
    ),
    Tool(
        "kernels",
        "GPU kernels an op launched: name, grid, block, stream, start and end in µs from the "
        "start of its step's GPU work; then GPU work launched after it by code OpGuard did "
        "not record.",
        (RUN, INDEX),
        f"{HERE}:kernels_text",
    ),
)
BY_NAME = {tool.name: tool for tool in FOLLOW_UPS}
TOOLS: list[dict[str, Any]] = [tool.function_schema() for tool in FOLLOW_UPS]


@dataclass(frozen=True, slots=True)
class OpFocus:
    """An op a question is about: run ``"a"`` or ``"b"``, its index, its rank (None: the rank
    the tools answer for)."""

    run: str
    index: int
    rank: int | None = None


class TraceTools:
    """Answers tool calls from rank ``rank`` of both runs. ``paired``: the ranks of run A and
    of run B that each rank's comparison read where they differ (across parallel layouts,
    :attr:`~opguard.analysis.diff.RankDiff.trace_ranks`); elsewhere a rank is both runs'."""

    def __init__(
        self,
        run_a: Run,
        run_b: Run,
        rank: int,
        paired: Mapping[int, tuple[int, int]] | None = None,
    ) -> None:
        self._runs = {"a": run_a, "b": run_b}
        self.rank = rank
        self._paired = dict(paired or {})

    def call(self, name: str, arguments: Mapping[str, Any]) -> str:
        tool = BY_NAME.get(name)
        if tool is None:
            return f"error: no tool {name!r}; tools: {', '.join(BY_NAME)}"
        try:
            text = "\n".join(tool.answer(arguments, self))
        except ToolError as exc:
            text = f"error: {exc}"
        return clip(text, RESULT_CHARS)

    def describe(self, focus: OpFocus) -> str:
        """Everything about one op (the TUI's selected op, attached to a question)."""
        rank = self.rank if focus.rank is None else focus.rank
        trace, op = self.op(focus.run, focus.index, rank)
        return "\n".join([f"run {focus.run.upper()}, rank {rank}:", *op_detail(op, trace)])

    def op(self, run: str, index: int, rank: int | None = None) -> tuple[RankTrace, OpRecord]:
        """Op ``index`` of run ``run`` (``"a"`` or ``"b"``) and its rank's trace."""
        rank = self.rank if rank is None else rank
        trace = self._runs[run].rank(self._paired.get(rank, (rank, rank))["ab".index(run)])
        return trace, trace.op(index)


# -- the answers: each takes the checked arguments and the runs ---------------------------------


def neighbours_text(arguments: dict[str, Any], tools: TraceTools) -> list[str]:
    trace, op = tools.op(arguments["run"], arguments["index"])
    return [
        ("> " if other.index == op.index else "  ") + op_line(other)
        for other in neighbours(trace, op.index, arguments["before"], arguments["after"])
    ]


def producer_text(arguments: dict[str, Any], tools: TraceTools) -> list[str]:
    trace, op = tools.op(arguments["run"], arguments["index"])
    slot = arguments["slot"]
    tensor = input_tensor(op, slot)
    if tensor.producer is None:
        return [
            f"input {slot} of #{op.index} is a leaf: no recorded op produced it (data, a parameter, or made before recording)"
        ]
    index, output = tensor.producer
    producer = trace.op(index)
    return [f"input {slot} of #{op.index} is output {output} of:", *op_detail(producer, trace)]


def source_text(arguments: dict[str, Any], tools: TraceTools) -> list[str]:
    _, op = tools.op(arguments["run"], arguments["index"])
    site = op.call_site
    view = source_around(site, arguments["before"], arguments["after"])
    note = [] if view.from_file else [KEPT_LINES_ONLY]
    return [
        f"{site.file}:{site.line} in {site.function}",
        *source_lines(view.rows, site.line),
        *note,
    ]


def kernels_text(arguments: dict[str, Any], tools: TraceTools) -> list[str]:
    trace, op = tools.op(arguments["run"], arguments["index"])
    return kernel_lines(op, trace) or [
        f"no kernels recorded for #{op.index} (a CPU op, or a run without kernel tracing)"
    ]
