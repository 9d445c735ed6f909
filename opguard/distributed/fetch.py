"""The few traces ``explain`` and ``tui`` read after a comparison on a cluster (the first
divergence's rank and the origins'): read in place where this machine sees them (shared
storage, or this machine is the node holding them), else fetched from a node holding them
into a temporary directory, for as long as they are read.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

from ..analysis import RunDiff, diff_runs
from ..analysis.tolerant.rule import Tolerance
from ..store import Run, schema
from ..store.meta import write_meta
from .driver import RayDiff, connected, diff_on_cluster
from .holdings import on_this_node
from .placement import RUN_SIDES
from .tasks import receive

RANKS_AT_HAND = 8  # the most ranks fetched for explain and tui


def ranks_at_hand(result: RunDiff) -> list[int]:
    """The ranks (as reported) whose traces are read after a comparison: the first
    divergence's and the origins' (else the lowest compared), at most :data:`RANKS_AT_HAND`."""
    first = result.first or result.state_first
    wanted = ([first.rank] if first is not None else []) + result.origin_ranks
    if not wanted and result.ranks:
        wanted = [result.ranks[0].rank]
    return list(dict.fromkeys(wanted))[:RANKS_AT_HAND]


@contextmanager
def runs_at_hand(found: RayDiff, ranks: list[int]) -> Iterator[tuple[Run, Run]]:
    """Both runs holding (at least) the traces of ``ranks``, open for the block: in place
    where this machine holds them all, else fetched (Ray connected)."""
    compared = [r for r in found.result.ranks if r.rank in ranks]
    with ExitStack() as stack:
        runs: list[Run] = []
        for side, layout in enumerate(found.layouts):
            need = sorted({r.trace_ranks[side] for r in compared})
            local = on_this_node(layout.path)
            if all((local / schema.rank_dir_name(k)).is_dir() for k in need):
                runs.append(stack.enter_context(Run(local, meta=layout.meta)))
                continue
            into = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="opguard-ray-")))
            write_meta(into, layout.meta)
            for k in need:
                receive(layout.path, k, layout.holders[k][0], into, RUN_SIDES[side])
            runs.append(stack.enter_context(Run(into)))
        yield runs[0], runs[1]


@contextmanager
def compared_at_hand(
    path_a: str,
    path_b: str,
    *,
    ray: str | None,
    rank: int | None = None,
    step: int | None = None,
    tolerance: Tolerance | None = None,
) -> Iterator[tuple[RunDiff, Run, Run]]:
    """Two runs compared (here, or with ``ray`` on that cluster) and open for the block with
    the traces their reader needs: the whole runs here, the ranks of :func:`ranks_at_hand`
    after a comparison on a cluster, fetched before the block (which runs disconnected, its
    output its own)."""
    if ray is None:
        with Run(path_a) as run_a, Run(path_b) as run_b:
            yield diff_runs(run_a, run_b, rank=rank, step=step, tolerance=tolerance), run_a, run_b
        return
    cluster: Any
    with ExitStack() as opened:
        with connected(ray) as cluster:
            found = diff_on_cluster(
                cluster, path_a, path_b, rank=rank, step=step, tolerance=tolerance
            )
            run_a, run_b = opened.enter_context(runs_at_hand(found, ranks_at_hand(found.result)))
        yield found.result, run_a, run_b
