"""How ``opguard diff --ray`` scales with the ranks of a job: wall time, and bytes of traces
read on each node, for two runs of RANKS ranks of step-level records spread over the nodes of
a local Ray cluster (tests/ray_cluster.py: a head and worker nodes as processes, each with its
own directory standing for its local disk), one rank diverging late; and the process pool's
wall time on the same traces, whose answer the cluster's must equal.

    python bench/ray_ranks.py [--ranks 64 256 1024] [--steps 2000] [--nodes 4]
        [--entries 40] [--dir DIR] [--json FILE]

Each rank's step record holds ``--entries`` state entries (the loss, gradients and
parameters of a small model, the CPU generator), written through tests/traces.py's builder.
Rank K sits on node K mod NODES; ``meta.json`` on the node of rank 0, as a job of several
nodes leaves it. The diff on the cluster runs in this process (the driver), after one
warm-up; the process pool runs as ``python -m opguard diff A B --json`` (bench/diff_scale.py).
Everything on one machine shares its cores, so the cluster's wall time is its cost here, not
what nodes of their own would take: docs/PERFORMANCE.md projects that from the bytes read.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import sys
import tempfile
import time
from multiprocessing import get_context
from pathlib import Path
from typing import Any

from diff_scale import run_diff  # puts tests/ on sys.path
from ray_cluster import LocalCluster
from traces import TraceBuilder

from opguard.analysis.contract import to_json
from opguard.store import schema


def _rank(args: tuple[Path, str, int, int, int, int]) -> int:
    """Writes one rank of one run; returns its trace's bytes."""
    path, side, rank, ranks, steps, entries = args
    diverging, at = ranks - 3, steps - 5
    meta = {"world_size": ranks, "steps_only": True, "command": ["bench"]}
    with TraceBuilder(path, rank=rank, meta=meta, start={"host": "bench"}) as b:
        names = [b.state_name(f"layer{k}.weight") for k in range(entries - 2)]
        loss, rng = b.state_name("loss"), b.state_name("cpu")
        for step in range(steps):
            changed = side == "b" and rank == diverging and step >= at

            def fields(k: int, changed: bool = changed, step: int = step) -> dict[str, Any]:
                mark = (rank << 40 | step << 16 | k) ^ (0xABCDEF if changed else 0)
                return {"d": "float32", "s": [64, 64], "h": mark, "z": 16384, "f": 0}

            stored = [("loss", loss, "", fields(0))]
            stored += [("param", n, "", fields(i + 1)) for i, n in enumerate(names)]
            stored.append(("rng", rng, "", {**fields(entries, False), "d": "uint8", "s": [5056]}))
            b.step_record(step, stored)
    return (path / schema.rank_dir_name(rank) / "data.mdb").stat().st_size


def build(root: Path, ranks: int, steps: int, entries: int) -> int:
    """Both runs whole under ``root``; returns run A's bytes."""
    jobs = [(root / side, side, k, ranks, steps, entries) for side in "ab" for k in range(ranks)]
    with get_context("spawn").Pool(os.cpu_count() or 1) as pool:
        sizes = pool.map(_rank, jobs, chunksize=8)
    return sum(sizes[:ranks])


def spread(root: Path, cluster: LocalCluster, ranks: int) -> None:
    """Each node's disk: its ranks (K mod NODES), rank 0's node the metadata too (moved, not
    copied: the driver then reads nothing of the traces)."""
    for side in "ab":
        path = root / side
        for k in range(ranks):
            node = cluster.nodes[k % len(cluster.nodes)]
            target = node.local(path) / schema.rank_dir_name(k)
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copytree(path / schema.rank_dir_name(k), target)
        shutil.copy(path / schema.META_FILE, cluster.nodes[0].local(path) / schema.META_FILE)


def case(ranks: int, steps: int, entries: int, nodes: int, where: Path) -> dict[str, Any]:
    import ray

    from opguard.distributed.driver import diff_on_cluster

    root = where / f"r{ranks}"
    started = time.perf_counter()
    size = build(root, ranks, steps, entries)
    build_s = time.perf_counter() - started
    here, pool_s, _, code = run_diff(root / "a", root / "b")
    assert code == 1, f"the process pool's diff exited {code}"
    with LocalCluster(workers=nodes - 1) as cluster:
        spread(root, cluster, ranks)
        ray.init(address=cluster.address, logging_level="ERROR", log_to_driver=False)
        try:
            diff_on_cluster(ray, str(root / "a"), str(root / "b"))  # workers started, warm
            started = time.perf_counter()
            found = diff_on_cluster(ray, str(root / "a"), str(root / "b"))
            ray_s = time.perf_counter() - started
        finally:
            ray.shutdown()
    shutil.rmtree(root, ignore_errors=True)
    same = {k: v for k, v in to_json(found.result).items() if k != "runs"} == {
        k: v for k, v in here.items() if k != "runs"
    }
    busy = [n for n in found.nodes if n.ranks]
    return {
        "ranks": ranks,
        "steps": steps,
        "entries_per_step": entries,
        "nodes": nodes,
        "trace_mib_per_side": round(size / 2**20, 1),
        "kib_per_step": round(size / ranks / steps / 1024, 2),
        "build_s": round(build_s, 1),
        "pool_s": round(pool_s, 2),
        "ray_s": round(ray_s, 2),
        "per_node": [
            {"ranks": len(n.ranks), "mib_read": round(n.read / 2**20, 1), "fetched": n.fetched}
            for n in busy
        ],
        "first": [found.result.state_first.step, found.result.state_first.rank]
        if found.result.state_first
        else None,
        "same_answer": same,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[64, 256, 1024])
    parser.add_argument("--steps", type=int, nargs="+", default=[2000], help="per case, or one")
    parser.add_argument("--entries", type=int, default=40, help="state entries per step")
    parser.add_argument("--nodes", type=int, default=4, help="nodes of the local cluster")
    parser.add_argument("--dir", type=Path, help="where to build (default: a temp dir)")
    parser.add_argument("--json", type=Path, help="also write the rows here")
    args = parser.parse_args()
    steps = args.steps * len(args.ranks) if len(args.steps) == 1 else args.steps
    where = Path(tempfile.mkdtemp(prefix="opguard-ray-bench-", dir=args.dir))
    rows = []
    try:
        for ranks, count in zip(args.ranks, steps, strict=True):
            print(f"{ranks} ranks x {count} steps ...", file=sys.stderr, flush=True)
            row = case(ranks, count, args.entries, args.nodes, where)
            row.update(date=time.strftime("%Y-%m-%d"), cpus=os.cpu_count())
            row.update(load=round(os.getloadavg()[0], 2), python=platform.python_version())
            print(json.dumps(row), flush=True)
            rows.append(row)
    finally:
        shutil.rmtree(where, ignore_errors=True)
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))
    return 0 if all(r["same_answer"] for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
