"""The work done on a node, as Ray tasks run it: what the node holds, one pair of ranks
compared where its traces are (those the node lacks fetched from a node that holds them),
and a trace sent, a chunk at a time, to where it is needed.

Each returns a few KB (a rank's diff, not its traces). A trace that cannot be read here
(missing, damaged) is an answer that says so, never a failed task: the other ranks are
compared all the same. Ray itself is imported only to fetch a trace from another node.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .. import __version__
from ..analysis.diff import (
    RankOutcome,
    RankPair,
    compare_pair,
    outcome_of,
    states_alone,
    states_first,
)
from ..analysis.state_diff import StateComparison
from ..analysis.tolerant.rule import Tolerance
from ..store import Run, TraceError, schema
from .holdings import DATA_FILE, NodeHolding, on_this_node, run_holding, trace_bytes
from .placement import RUN_SIDES, traces_of

MAX_RETRIES = 3  # a task whose process died (killed, out of memory) runs again, this often
CHUNK = 8 << 20  # bytes of a trace sent at a time


@dataclass(frozen=True)
class PairJob:
    """One pair of ranks to compare on a node: the runs' paths and metadata (A, B, and the
    control run of ``--noise``), the traces to fetch (:class:`~.placement.Placement`), the
    diff's options. ``states``: a second pass, given the first pass's comparison of the
    rank's step-level records; ``two_passes``: a first pass that compares the step-level
    records alone where both runs also hold op records (:func:`~opguard.analysis.diff.
    states_first`)."""

    pair: RankPair
    runs: tuple[tuple[str, dict[str, Any]], ...]
    fetch: tuple[tuple[int, str], ...]
    step: int | None
    tolerance: Tolerance | None
    two_passes: bool = False
    states: StateComparison | None = None


@dataclass
class PairAnswer:
    """What a node answers for one pair: its outcome, or why its traces could not be read
    (``problem``); ``states`` where the op records await a second pass; the bytes of the
    traces read in place and fetched from other nodes."""

    pair: RankPair
    outcome: RankOutcome | None = None
    states: StateComparison | None = None
    problem: str | None = None
    read: int = 0
    fetched: int = 0


def holdings(node: str, paths: list[str]) -> NodeHolding:
    """What this node (Ray node ``node``) holds of each run of ``paths``."""
    return NodeHolding(node, __version__, tuple(run_holding(path) for path in paths))


def compare(job: PairJob) -> PairAnswer:
    """One pair of ranks compared on this node."""
    answer = PairAnswer(job.pair)
    fetch = dict(job.fetch)
    ranks = traces_of(job.pair, len(job.runs))
    with ExitStack() as stack:
        try:
            runs = []
            for side, ((path, meta), rank) in enumerate(zip(job.runs, ranks, strict=True)):
                if side in fetch:
                    where = Path(stack.enter_context(tempfile.TemporaryDirectory()))
                    answer.fetched += receive(path, rank, fetch[side], where, RUN_SIDES[side])
                else:
                    where = on_this_node(path)
                    answer.read += trace_bytes(where, rank)
                runs.append(stack.enter_context(Run(where, meta=meta)))
            _compare(job, runs, answer)
        except TraceError as exc:
            answer.problem = str(exc)
    return answer


def _compare(job: PairJob, runs: list[Run], answer: PairAnswer) -> None:
    run_a, run_b, *control = runs
    if job.two_passes and job.states is None:
        trace_a, trace_b = run_a.rank(job.pair.rank_a), run_b.rank(job.pair.rank_b)
        answer.states = states_first(trace_a, trace_b, job.step)
        if answer.states is not None:  # the op records wait for the second pass
            alone = states_alone(trace_a, trace_b, answer.states)
            answer.outcome = outcome_of(alone, trace_a, trace_b, job.step)
            return
    answer.outcome = compare_pair(
        run_a, run_b, job.pair, job.step, job.tolerance, control[0] if control else None, job.states
    )


def receive(path: str, rank: int, node: str, into: Path, run: str) -> int:
    """Fetches rank ``rank``'s trace of run directory ``path`` from Ray node ``node`` into
    directory ``into`` (as ``rank-K/``); returns its bytes. A node that cannot send it is a
    :class:`TraceError` naming the run."""
    import ray

    target = into / schema.rank_dir_name(rank)
    target.mkdir(parents=True, exist_ok=True)
    total = 0
    try:
        with open(target / DATA_FILE, "wb") as out:
            for ref in sender(node).remote(path, rank):
                chunk = ray.get(ref)
                out.write(chunk)
                total += len(chunk)
    except ray.exceptions.RayError as exc:
        raise TraceError(
            f"run {run}'s trace of rank {rank} could not be fetched from node {node[:8]} "
            f"({type(exc).__name__})"
        ) from None
    return total


def sender(node: str) -> Any:
    """:func:`send_trace` as a task streaming its chunks from Ray node ``node``."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    return ray.remote(send_trace).options(
        num_cpus=0,
        num_returns="streaming",
        max_retries=0,  # a stream half read is not resent: the fetch fails, said
        scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False),
    )


def send_trace(path: str, rank: int) -> Iterator[bytes]:
    """Rank ``rank``'s trace of run directory ``path`` on this node, :data:`CHUNK` bytes at a
    time."""
    data = on_this_node(path) / schema.rank_dir_name(rank) / DATA_FILE
    with open(data, "rb") as source:
        while chunk := source.read(CHUNK):
            yield chunk
