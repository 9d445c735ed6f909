"""Which node compares which ranks: from what every node holds (:mod:`.holdings`), each run's
layout over the nodes, then each pair of ranks placed on a node holding both its traces (the
least loaded of them: on shared storage every node does), or where none holds both, on a node
holding run A's trace, the other fetched from a node that holds it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from ..analysis.diff import RankPair
from ..store import TraceError, schema
from .holdings import NodeHolding

RUN_SIDES = ("A", "B", "control")  # the runs a comparison reads, in the order they are asked


@dataclass(frozen=True)
class RunLayout:
    """One run over the nodes: its path, its metadata, and for each rank the nodes holding
    its trace and the trace's size."""

    path: str
    meta: dict[str, Any]
    holders: dict[int, tuple[str, ...]]
    sizes: dict[int, int]

    @property
    def ranks(self) -> list[int]:
        """The ranks some node holds."""
        return sorted(self.holders)

    @property
    def expected(self) -> list[int]:
        """The ranks of the job (its world size, as ``meta.json`` says it), those held
        included: a rank no node holds is one whose node is gone."""
        world = self.meta.get("world_size")
        named = range(world) if isinstance(world, int) and not isinstance(world, bool) else ()
        return sorted({*named, *self.holders})

    @property
    def missing(self) -> list[int]:
        return sorted(set(self.expected) - set(self.holders))


def layout_of(path: str, index: int, holdings: Sequence[NodeHolding]) -> RunLayout:
    """Run ``path`` (the ``index``-th asked about) over the nodes; its metadata is the one
    held beside its lowest rank (the node that prepared the run). :class:`TraceError` when
    no node holds the run, or none its ``meta.json``."""
    holders: dict[int, list[str]] = {}
    sizes: dict[int, int] = {}
    metas: list[tuple[float, dict[str, Any]]] = []
    problems: list[str] = []
    for node in holdings:
        held = node.runs[index]
        for rank, size in held.ranks.items():
            holders.setdefault(rank, []).append(node.node)
            sizes[rank] = max(sizes.get(rank, 0), size)
        if held.meta is not None:
            metas.append((min(held.ranks, default=float("inf")), held.meta))
        if held.problem is not None:
            problems.append(held.problem)
    if not metas:
        if problems:
            raise TraceError(problems[0])
        what = f"holds no {schema.META_FILE}" if holders else "holds it"
        raise TraceError(
            f"{path}: no node of the Ray cluster {what} ({len(holdings)} node(s) asked): not an "
            "OpGuard run there"
        )
    meta = min(metas, key=lambda found: found[0])[1]
    return RunLayout(path, meta, {k: tuple(v) for k, v in holders.items()}, sizes)


@dataclass(frozen=True)
class Placement:
    """Where one pair of ranks is compared, and the traces that node fetches: (the run's
    place in :data:`RUN_SIDES`, the node holding it) for each it does not hold itself."""

    pair: RankPair
    node: str
    fetch: tuple[tuple[int, str], ...] = ()


def traces_of(pair: RankPair, runs: int) -> list[int]:
    """The rank of each of ``runs`` runs (A, B, then the control run) a pair's comparison
    reads: the control run is compared with run A's rank."""
    return [pair.rank_a, pair.rank_b, pair.rank_a][:runs]


def place(pairs: Sequence[RankPair], layouts: Sequence[RunLayout]) -> list[Placement]:
    """Each pair on a node: the least loaded (bytes to read) of those holding every trace it
    reads, else of those holding run A's, the others fetched from their least loaded holder.
    The largest pairs are placed first, so the load evens out. Every rank of ``pairs`` is
    held by some node (the driver leaves out the others)."""
    load: dict[str, int] = {}
    placed: dict[RankPair, Placement] = {}

    def size(pair: RankPair) -> int:
        ranks = traces_of(pair, len(layouts))
        return sum(run.sizes.get(k, 0) for run, k in zip(layouts, ranks, strict=True))

    def lightest(nodes: set[str] | tuple[str, ...]) -> str:
        return min(nodes, key=lambda n: (load.get(n, 0), n))

    for pair in sorted(pairs, key=size, reverse=True):
        ranks = traces_of(pair, len(layouts))
        holders = [run.holders[k] for run, k in zip(layouts, ranks, strict=True)]
        common = set(holders[0]).intersection(*holders[1:])
        node = lightest(common or holders[0])
        fetch = tuple(
            (side, lightest(held)) for side, held in enumerate(holders) if node not in held
        )
        load[node] = load.get(node, 0) + size(pair)
        placed[pair] = Placement(pair, node, fetch)
    return [placed[pair] for pair in pairs]
