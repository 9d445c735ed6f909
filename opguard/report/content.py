"""What the HTML report shows, gathered once from what the diff found and from the traces.

The verdict, the first divergence and its evidence, the alignment and the drift are the
:class:`~opguard.analysis.RunDiff` itself (the object the terminal report and the
``opguard.diff/1`` JSON are written from), so the report never says anything the analysis did
not. What the diff does not keep is read here from the traces, through the readers every front
end uses: the aligned rows around the first divergence (:mod:`opguard.analysis.browse.rows`, the
TUI's list), the source lines around its call sites (:mod:`opguard.analysis.browse.lookup`), the
loss of both runs (:mod:`opguard.analysis.browse.series`) and the step-level records of the
differing step. A trace that cannot be read there leaves that part out with the reason: the
report of a damaged run still says what the diff found.
"""

from __future__ import annotations

import shlex
from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import Any

from ..analysis import Divergence, RankDiff, RunDiff
from ..analysis.browse.lookup import SourceView, source_around
from ..analysis.browse.rows import RankRows, Row
from ..analysis.browse.series import Losses, losses
from ..analysis.state_diff import StepDivergence
from ..analysis.words.verdict import Side
from ..hunt import Hunt
from ..store import CallSite, OpRecord, Run, TensorRecord, TraceError
from ..store.meta import NUMERICS_ENV

NEIGHBOURS = 12  # aligned rows shown either side of the first divergence
SOURCE_AROUND = 3  # source lines shown either side of a call line


@dataclass(frozen=True, slots=True)
class Neighbour:
    """One aligned row around the first divergence: ``first`` marks the first differing pair,
    ``cause`` an op the verdict names (the op an inserted one feeds, the cause it was traced
    back to)."""

    row: Row
    first: bool
    cause: bool


@dataclass(frozen=True, slots=True)
class StateRow:
    """One entry of the differing step's training state in both runs (None: recorded in one
    run only); ``differs`` as the step-level diff found it."""

    label: str
    a: TensorRecord | None
    b: TensorRecord | None
    differs: bool


@dataclass(frozen=True, slots=True)
class Neighbourhood:
    """The rows around the first divergence in one step of one rank: aligned ops
    (:class:`Neighbour`) for an op-level divergence, state entries (:class:`StateRow`) for one
    found in step-level records; ``before`` and ``after``: the step's rows not shown."""

    rank: int
    step: int
    rows: Sequence[Neighbour] | Sequence[StateRow]
    before: int
    after: int


@dataclass(frozen=True, slots=True)
class OpView:
    """An op the report names, with the source lines around its call site and, for a kernel
    Inductor generated, around each line of the user's code it computes."""

    op: OpRecord
    source: SourceView
    origins: tuple[tuple[CallSite, SourceView], ...]

    @classmethod
    def of(cls, op: OpRecord | None) -> OpView | None:
        if op is None:
            return None
        origins = tuple((site, _source(site)) for site in op.origins)
        return cls(op, _source(op.call_site), origins)


def _source(site: CallSite) -> SourceView:
    return source_around(site, SOURCE_AROUND, SOURCE_AROUND)


@dataclass(frozen=True, slots=True)
class HowRecorded:
    """How a run was recorded, from its ``meta.json``: to record it again. Of its environment,
    the variables that change numerics (``opguard capture`` sets them again too); the job's
    own (``RANK``, ``MASTER_PORT``) are a launcher's to set."""

    label: str
    path: str
    cwd: str | None
    env: dict[str, str]
    command: str | None

    @classmethod
    def of(cls, label: str, path: str, meta: dict[str, Any]) -> HowRecorded:
        command = meta.get("command")
        return cls(
            label,
            path,
            meta.get("cwd"),
            {k: v for k, v in sorted((meta.get("env") or {}).items()) if k in NUMERICS_ENV},
            shlex.join(command) if command else None,
        )

    def lines(self) -> list[str]:
        """The shell lines that record the run again where it was recorded."""
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in self.env.items())
        command = self.command or "(the recording command was not kept)"
        return [
            *([f"cd {shlex.quote(self.cwd)}"] if self.cwd else []),
            f"{env} {command}" if env else command,
        ]


@dataclass(frozen=True)
class Content:
    """Everything the document shows. ``result`` is the diff the report explains (a hunt's
    op-level one when it had a second pass); ``losses`` the loss of run A and run B (of the
    hunt's step-level runs, which cover the whole run); ``unread`` why a part could not be
    read from the traces."""

    result: RunDiff
    command: str
    hunt: Hunt | None
    named: tuple[OpView | None, OpView | None]  # the ops the verdict names in run A and B
    observed: tuple[OpView | None, OpView | None]  # the first aligned pair whose outputs differ
    neighbourhood: Neighbourhood | None
    losses: tuple[Losses, Losses] | None
    loss_rank: int
    recordings: list[HowRecorded]
    unread: list[str]

    @property
    def state_first(self) -> StepDivergence | None:
        """The divergence found in step-level records, where the verdict is one (no op named)."""
        return _state_first(self.result)


def _state_first(result: RunDiff) -> StepDivergence | None:
    """The first step whose state differs where it is the verdict: the runs diverged and no op
    was named (the terminal report's rule)."""
    return result.state_first if result.first is None and result.diverged else None


def gather(result: RunDiff, command: str, hunt: Hunt | None = None) -> Content:
    """The report's content: ``result`` (for a hunt, the diff its report prints), the command
    that made it, and what the traces hold beyond the diff."""
    unread: list[str] = []
    first = result.first
    named = (OpView.of(first.a), OpView.of(first.b)) if first is not None else (None, None)
    observed = (
        (OpView.of(first.observed_a), OpView.of(first.observed_b))
        if first is not None
        else (None, None)
    )
    neighbourhood = None
    try:
        neighbourhood = _neighbourhood(result)
    except TraceError as exc:
        unread.append(f"the rows around the first divergence: {exc}")
    whole = hunt.step_level if hunt is not None else result
    rank = _loss_rank(whole)
    found: tuple[Losses, Losses] | None = None
    try:
        with _opened(whole) as (run_a, run_b):
            found = (losses(run_a.rank(rank[0])), losses(run_b.rank(rank[1])))
    except TraceError as exc:
        unread.append(f"the loss: {exc}")
    return Content(
        result,
        command,
        hunt,
        named,
        observed,
        neighbourhood,
        found,
        rank[0],
        _recordings(result, hunt),
        unread,
    )


@contextmanager
def _opened(result: RunDiff) -> Iterator[tuple[Run, Run]]:
    with ExitStack() as stack:
        yield stack.enter_context(Run(result.path_a)), stack.enter_context(Run(result.path_b))


def _rank_of(result: RunDiff) -> RankDiff | None:
    """The compared rank the verdict is about: the first divergence's, else the first step
    whose state differs, else the first compared rank."""
    first, state = result.first, result.state_first
    for r in result.ranks:
        if (first is not None and r.first is first) or (
            first is None and state is not None and r.state_first is state
        ):
            return r
    return result.ranks[0] if result.ranks else None


def _loss_rank(result: RunDiff) -> tuple[int, int]:
    """The rank of run A and of run B whose loss is drawn: those the verdict is about."""
    found = _rank_of(result)
    return found.trace_ranks if found is not None else (0, 0)


def _neighbourhood(result: RunDiff) -> Neighbourhood | None:
    found = _rank_of(result)
    if found is None:
        return None
    if result.first is not None:
        return _op_rows(result, found, result.first)
    state = _state_first(result)
    return _state_rows(result, found, state) if state is not None else None


def _op_rows(result: RunDiff, found: RankDiff, first: Divergence) -> Neighbourhood | None:
    """The aligned rows of the step of the first differing pair, around it."""
    rank_a, rank_b = found.trace_ranks
    with _opened(result) as (run_a, run_b):
        rows = RankRows(run_a.rank(rank_a), run_b.rank(rank_b), found.layout is not None)
        rows.set_diff(found)
        step = rows.step_of(Side.A, first.observed_a.index)
        if step is None:
            return None
        step_rows = list(rows.rows(step))
        marked = [Neighbour(row, rows.is_first(row), rows.is_cause(row)) for row in step_rows]
    return _around(found.rank, step, marked, next((k for k, n in enumerate(marked) if n.first), 0))


def _state_rows(result: RunDiff, found: RankDiff, first: StepDivergence) -> Neighbourhood:
    """The state entries of the first differing step in run A's order (then those of run B
    only), around the first that differs."""
    rank_a, rank_b = found.trace_ranks
    with _opened(result) as (run_a, run_b):
        state_a = run_a.rank(rank_a).step_state(first.step)
        state_b = run_b.rank(rank_b).step_state(first.step)
    entries_a = state_a.entries if state_a is not None else ()
    by_key = state_b.by_key() if state_b is not None else {}
    differing = {pair.a.key for pair in first.comparison.differing}
    rows = []
    for entry in entries_a:
        other = by_key.get(entry.key)
        tensor_b = other.tensor if other is not None else None
        rows.append(StateRow(entry.label, entry.tensor, tensor_b, entry.key in differing))
    rows += [StateRow(e.label, None, e.tensor, False) for e in first.comparison.only_b]
    at = next((k for k, row in enumerate(rows) if row.label == first.first.label), 0)
    return _around(found.rank, first.step, rows, at)


def _around(
    rank: int, step: int, rows: Sequence[Neighbour] | Sequence[StateRow], at: int
) -> Neighbourhood:
    """The rows within :data:`NEIGHBOURS` of row ``at``."""
    start, stop = max(at - NEIGHBOURS, 0), min(at + NEIGHBOURS + 1, len(rows))
    return Neighbourhood(rank, step, rows[start:stop], start, len(rows) - stop)


def _recordings(result: RunDiff, hunt: Hunt | None) -> list[HowRecorded]:
    """How each compared run was recorded: both runs, or each pass of a hunt."""
    if hunt is None:
        return [
            HowRecorded.of("run A", result.path_a, result.meta_a),
            HowRecorded.of("run B", result.path_b, result.meta_b),
        ]
    passes = [("at step level", hunt.step_level)]
    if hunt.op_level is not None:
        passes.append(("op by op", hunt.op_level))
    return [
        HowRecorded.of(f"run {run}, {how}", path, meta)
        for how, diff in passes
        for run, path, meta in (("A", diff.path_a, diff.meta_a), ("B", diff.path_b, diff.meta_b))
    ]
