"""A comparison of two runs on a Ray cluster, as a whole: every live node asked what it holds,
each pair of ranks compared as a task on a node holding its traces (:mod:`.placement`), and the
answers (a few KB a rank) reduced to the same :class:`~opguard.analysis.RunDiff` one machine
makes of the same traces.

Two passes where both runs hold op records and step-level records (a flight recorder, a
window): first the step-level records of every rank, then the op records of the ranks whose
state differs, the origin of the divergence and its receivers, and of no other (their op
records are not read; every rank's, where no state differs). Everywhere else, one pass.

A rank that cannot be compared is listed with why, the rest compared: a trace missing or
damaged on its node (the node's answer says so), a node lost during the comparison (its tasks
fail once Ray finds it gone). A task whose process dies is run again by Ray
(:data:`~.tasks.MAX_RETRIES`), with the same answer.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, redirect_stdout
from dataclasses import dataclass, field
from functools import cache
from typing import Any

from .. import __version__
from ..analysis import RunDiff, diff_runs
from ..analysis.diff import RankOutcome, RankPair, check_control, compared_ranks, run_diff_of
from ..analysis.tolerant.rule import Tolerance
from ..store import Run, TraceError
from . import tasks
from .holdings import NodeHolding
from .placement import RUN_SIDES, Placement, RunLayout, layout_of, place, traces_of

INSTALL = "pip install 'opguard[ray]'"
AUTO = "auto"  # --ray alone: the cluster RAY_ADDRESS names, else the one started on this machine


class RayUnavailable(TraceError):
    """Ray is not installed here, no cluster answers at the address, or its nodes run another
    OpGuard: one line, exit status 2."""


@contextmanager
def connected(address: str) -> Iterator[Any]:
    """The ``ray`` module, connected to the cluster at ``address`` for the block (a session
    already open in this process is used as it is). Standard output is standard error in the
    block: Ray's driver prints what the cluster reports (a node marked dead) to standard output,
    which holds ``--json``'s object alone."""
    with redirect_stdout(sys.stderr):
        yield from _connected(address)


def _connected(address: str) -> Iterator[Any]:
    try:
        import ray
    except ImportError:
        raise RayUnavailable(f"--ray needs Ray, which is not installed here: {INSTALL}") from None
    owned = not ray.is_initialized()
    if owned:
        try:
            ray.init(address=address, logging_level=logging.ERROR, log_to_driver=False)
        except (ConnectionError, RuntimeError, ValueError, TimeoutError) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise RayUnavailable(
                f"--ray {address}: no Ray cluster to connect to ({first})"
            ) from None
    try:
        yield ray
    finally:
        if owned:
            ray.shutdown()


@dataclass
class NodeWork:
    """What one node did: the ranks it compared and the bytes of traces it read in place and
    fetched from other nodes."""

    node: str
    name: str
    ranks: list[int] = field(default_factory=list)
    read: int = 0
    fetched: int = 0

    def to_json(self) -> dict[str, Any]:
        return {
            "node": self.node,
            "name": self.name,
            "ranks": len(self.ranks),
            "bytes_read": self.read,
            "bytes_fetched": self.fetched,
        }


@dataclass
class RayDiff:
    """A comparison made on a cluster: the result, each run's layout over the nodes, and
    what each node did."""

    result: RunDiff
    layouts: tuple[RunLayout, RunLayout]
    nodes: list[NodeWork]

    def summary(self) -> str:
        """One line: where the ranks were compared, and what was read."""
        busy = [n for n in self.nodes if n.ranks]
        ranks = sum(len(n.ranks) for n in busy)
        read, fetched = sum(n.read for n in busy), sum(n.fetched for n in busy)
        return (
            f"opguard: compared {ranks} rank(s) on {len(busy)} of {len(self.nodes)} Ray node(s): "
            f"{_size(read)} of traces read where they are, {_size(fetched)} fetched"
        )


def compare_runs(
    path_a: str,
    path_b: str,
    *,
    ray: str | None = None,
    rank: int | None = None,
    step: int | None = None,
    tolerance: Tolerance | None = None,
    report: Callable[[str], None] | None = None,
) -> RunDiff:
    """The diff of two runs: here (:func:`~opguard.analysis.diff_runs`), or with ``ray`` (an
    address, or ``auto``) on that cluster, ``report`` told where in one line."""
    if ray is None:
        with Run(path_a) as run_a, Run(path_b) as run_b:
            return diff_runs(run_a, run_b, rank=rank, step=step, tolerance=tolerance)
    with connected(ray) as cluster:
        found = diff_on_cluster(cluster, path_a, path_b, rank=rank, step=step, tolerance=tolerance)
    if report is not None:
        report(found.summary())
    return found.result


def diff_on_cluster(
    ray: Any,
    path_a: str,
    path_b: str,
    *,
    rank: int | None = None,
    step: int | None = None,
    tolerance: Tolerance | None = None,
) -> RayDiff:
    """Both runs compared on the connected cluster ``ray``, rank by rank where the traces
    are (see the module's doc)."""
    names = alive_nodes(ray)
    paths = [os.path.abspath(p) for p in (path_a, path_b)]
    if tolerance is not None and tolerance.noise is not None:
        paths.append(os.path.abspath(tolerance.noise))
    holdings = _holdings(ray, names, paths)
    layouts = [layout_of(path, i, holdings) for i, path in enumerate(paths)]
    pairs = compared_ranks(layouts[0].expected, layouts[1].expected, rank, tolerance)
    if len(layouts) > 2:
        check_control(paths[2], layouts[2].ranks, pairs)
    reachable, not_compared = _reachable(pairs, layouts)
    work = {node: NodeWork(node, name) for node, name in names.items()}
    runs = tuple((layout.path, layout.meta) for layout in layouts)
    two_passes = tolerance is None  # --tolerant judges ops and states together: one pass
    placements = place(reachable, layouts)
    first = _run(
        ray,
        [
            (p, tasks.PairJob(p.pair, runs, p.fetch, step, tolerance, two_passes))
            for p in placements
        ],
        work,
        not_compared,
    )
    waiting = {pair: a for pair, a in first.items() if a.states is not None}
    again = _reached(first, waiting)
    second = _run(
        ray,
        [
            (p, tasks.PairJob(p.pair, runs, p.fetch, step, tolerance, True, waiting[p.pair].states))
            for p in placements
            if p.pair in again
        ],
        work,
        not_compared,
    )
    outcomes: list[RankOutcome] = []
    for pair in reachable:  # in rank order, as one machine lists them
        answer = second.get(pair) or first.get(pair)
        if answer is not None and answer.outcome is not None:
            outcomes.append(answer.outcome)
    result = run_diff_of(
        (path_a, path_b),
        (layouts[0].meta, layouts[1].meta),
        (layouts[0].expected, layouts[1].expected),
        pairs,
        outcomes,
        rank=rank,
        step=step,
        tolerance=tolerance,
        not_compared=not_compared,
    )
    result.by_states_only = sorted(p.reported for p in waiting if p not in again)
    return RayDiff(result, (layouts[0], layouts[1]), list(work.values()))


def alive_nodes(ray: Any) -> dict[str, str]:
    """The cluster's live nodes: id, and a name to say it by (host and address)."""
    return {
        node[
            "NodeID"
        ]: f"{node.get('NodeManagerHostname', '?')} ({node.get('NodeManagerAddress', '?')}, "
        f"{node['NodeID'][:8]})"
        for node in ray.nodes()
        if node.get("Alive")
    }


@cache
def _remote(function: Callable[..., Any]) -> Any:
    """``function`` as a Ray remote function (made once: each is exported to the cluster)."""
    import ray

    return ray.remote(function)


def pinned(ray: Any, function: Callable[..., Any], node: str, **options: Any) -> Any:
    """``function``'s task, to run on node ``node`` and no other."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    strategy = NodeAffinitySchedulingStrategy(node, soft=False)
    return _remote(function).options(scheduling_strategy=strategy, **options)


def _holdings(ray: Any, names: dict[str, str], paths: list[str]) -> list[NodeHolding]:
    """What every live node holds of the runs; a node lost meanwhile holds nothing. A node
    that runs another version of OpGuard is refused: its answers could differ."""
    refs = [pinned(ray, tasks.holdings, node, num_cpus=0).remote(node, paths) for node in names]
    found = []
    for ref in refs:
        try:
            held = ray.get(ref)
        except ray.exceptions.RayTaskError:
            raise
        except ray.exceptions.RayError:
            continue
        if held.version != __version__:
            raise RayUnavailable(
                f"node {names[held.node]} runs OpGuard {held.version}, this machine "
                f"{__version__}: install the same version on every node"
            )
        found.append(held)
    return found


def _reachable(
    pairs: Sequence[RankPair], layouts: Sequence[RunLayout]
) -> tuple[list[RankPair], list[tuple[int, str]]]:
    """The pairs whose every trace some live node holds, and the others with why. A rank the
    run never had is refused as one machine refuses it."""
    reachable, lost = [], []
    for pair in pairs:
        ranks = traces_of(pair, len(layouts))
        gone = []
        for side, (layout, k) in enumerate(zip(layouts, ranks, strict=True)):
            if k in layout.holders:
                continue
            if k not in layout.expected:
                raise TraceError(f"{layout.path}: no rank {k} (ranks: {layout.ranks or 'none'})")
            gone.append(f"run {RUN_SIDES[side]}'s trace of rank {k}")
        if gone:
            lost.append((pair.reported, f"{' and '.join(gone)} on no live node of the cluster"))
        else:
            reachable.append(pair)
    return reachable, lost


def _reached(
    first: dict[RankPair, tasks.PairAnswer], waiting: dict[RankPair, Any]
) -> set[RankPair]:
    """The ranks waiting for their op records (compared at step level so far) that the second
    pass compares: those whose state differs (the divergence reached them), or all of them
    where nothing differed anywhere (then no origin narrows them down)."""
    differs = {pair for pair, answer in waiting.items() if answer.states.first is not None}
    elsewhere = any(
        a.outcome is not None and a.outcome.result.diverged
        for pair, a in first.items()
        if pair not in waiting
    )
    return differs if differs or elsewhere else set(waiting)


def _run(
    ray: Any,
    jobs: list[tuple[Placement, tasks.PairJob]],
    work: dict[str, NodeWork],
    not_compared: list[tuple[int, str]],
) -> dict[RankPair, tasks.PairAnswer]:
    """Runs the jobs, each on its node; the answers by pair. A pair whose traces could not be
    read, or whose node was lost, joins ``not_compared`` with why."""
    refs = [
        (
            pinned(
                ray,
                tasks.compare,
                placement.node,
                num_cpus=1,
                max_retries=tasks.MAX_RETRIES,
                name=f"opguard-rank-{placement.pair.reported}",
            ).remote(job),
            placement,
        )
        for placement, job in jobs
    ]
    answers = {}
    for ref, placement in refs:
        node = work[placement.node]
        try:
            answer = ray.get(ref)
        except ray.exceptions.RayTaskError:
            raise  # OpGuard's own failure, not the cluster's: as on one machine
        except ray.exceptions.RayError as exc:
            not_compared.append((placement.pair.reported, _lost(ray, node, exc)))
            continue
        node.ranks.append(placement.pair.reported)
        node.read += answer.read
        node.fetched += answer.fetched
        if answer.problem is not None:
            not_compared.append((placement.pair.reported, answer.problem))
        else:
            answers[placement.pair] = answer
    return answers


def _lost(ray: Any, node: NodeWork, exc: Exception) -> str:
    """Why a task of ``node`` never answered: the node is gone, or its process kept dying."""
    if node.node not in alive_nodes(ray):
        return f"node {node.name}, which holds its traces, was lost ({type(exc).__name__})"
    return (
        f"the process comparing it on node {node.name} died {tasks.MAX_RETRIES + 1} times "
        f"({type(exc).__name__})"
    )


def _size(n: int) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024  # type: ignore[assignment]
    return f"{n} B"
