"""``opguard diff --ray``: two runs whose ranks sit on several nodes' disks, compared on a
local Ray cluster (tests/ray_cluster.py: a head and two worker nodes, each with its own
directory standing for its local disk), must give the answer the process pool gives on the
same traces (under ``--tolerant`` too), and say what it could not compare: a rank whose trace
is damaged or missing on its node, the ranks of a node gone. A worker killed mid-comparison
is run again by Ray, with the same answer.

Runs: 12 ranks of step-level records (tests/traces.py), rank 11 diverging at a late step;
``meta.json`` only on the node holding rank 0, as a job of several nodes leaves it.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from traces import TraceBuilder

from opguard.store import schema

ray = pytest.importorskip("ray", reason="Ray is not installed: pip install 'opguard[ray]'")
pytestmark = pytest.mark.slow  # long in all (a cluster of three nodes): started first (conftest.py)

from ray_cluster import LocalCluster  # noqa: E402 (after the skip: it imports nothing of Ray)

RANKS, STEPS, DIVERGING, AT = 12, 60, 11, 52
PARAMS = ("fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias")


def _entries(builder: TraceBuilder, rank: int, step: int, changed: bool) -> list[Any]:
    """A step's records: the loss, each gradient and parameter, the CPU generator."""

    def fields(kind: str, name: str) -> dict[str, Any]:
        mark = f"{kind} {name} {rank} {step}{'*' if changed and kind != 'rng' else ''}"
        return {"d": "float32", "s": [4], "h": hash(mark) & (1 << 63) - 1, "z": 16, "f": 0}

    named = [("loss", "loss"), *(("grad", p) for p in PARAMS), *(("param", p) for p in PARAMS)]
    named.append(("rng", "cpu"))
    return [(kind, builder.state_name(name), "", fields(kind, name)) for kind, name in named]


def _write(path: Path, side: str, rank: int, *, ops: bool = False) -> None:
    meta = {"world_size": RANKS, "steps_only": not ops}
    with TraceBuilder(path, rank=rank, meta=meta, start={"host": f"node-{rank % 3}"}) as b:
        for step in range(STEPS):
            changed = side == "b" and rank == DIVERGING and step >= AT
            if ops and step >= AT - 1:  # a window of the last steps, op by op
                fp = hash(f"{rank} {step}{'*' if changed else ''}") & (1 << 62) - 1
                b.op(
                    "aten::mm",
                    [],
                    [{"n": "0", "d": "float32", "s": [4], "h": fp, "z": 16}],
                    step=step,
                )
            b.step_record(step, _entries(b, rank, step, changed))


@pytest.fixture(scope="module")
def cluster() -> Iterator[LocalCluster]:
    """The nodes' workers hash as the process pool's do (``_diff``: PYTHONHASHSEED=0); this
    process's environment is given back as it was (tests run side by side in one worker)."""
    with pytest.MonkeyPatch.context() as env:
        env.setenv("PYTHONHASHSEED", "0")
        with LocalCluster(workers=2) as started:
            yield started


def _runs(root: Path, cluster: LocalCluster, *, ops: bool = False) -> tuple[Path, Path]:
    """Both runs whole under ``root`` (what the process pool reads), and on the nodes: rank K
    on node K mod 3, ``meta.json`` with rank 0 only."""
    paths = []
    for side in ("a", "b"):
        path = root / side
        for rank in range(RANKS):
            _write(path, side, rank, ops=ops)
        for node in cluster.nodes:
            shutil.rmtree(node.local(path), ignore_errors=True)
        for rank in range(RANKS):
            local = cluster.nodes[rank % len(cluster.nodes)].local(path)
            shutil.copytree(path / schema.rank_dir_name(rank), local / schema.rank_dir_name(rank))
            if rank == 0:
                shutil.copy(path / schema.META_FILE, local / schema.META_FILE)
        paths.append(path)
    return paths[0], paths[1]


def _diff(*args: str) -> tuple[dict[str, Any], int, str]:
    done = subprocess.run(
        [sys.executable, "-m", "opguard", "diff", *args, "--json"],
        capture_output=True,
        text=True,
        cwd="/",
        env={**os.environ, "PYTHONHASHSEED": "0"},
        timeout=300,
    )
    out = json.loads(done.stdout) if done.stdout.strip() else {}
    return out, done.returncode, done.stderr


def _without_paths(found: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in found.items() if k != "runs"}


@pytest.fixture(scope="module")
def steps_only(
    cluster: LocalCluster, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, Path]:
    return _runs(tmp_path_factory.mktemp("steps"), cluster)


@pytest.fixture(scope="module")
def pools_answer(steps_only: tuple[Path, Path]) -> dict[str, Any]:
    """The one-machine diff of the step-level runs (a process per rank)."""
    here, code, err = _diff(*map(str, steps_only))
    assert code == 1, err
    return here


def test_the_answer_on_ray_is_the_process_pools(
    cluster: LocalCluster, steps_only: tuple[Path, Path], pools_answer: dict[str, Any]
) -> None:
    a, b = steps_only
    here = pools_answer
    there, ray_code, err = _diff(str(a), str(b), f"--ray={cluster.address}")
    assert ray_code == 1, err[-3000:]
    assert there, err[-3000:]
    assert there["first_divergence"]["rank"] == DIVERGING
    assert there["first_divergence"]["step"] == AT
    assert _without_paths(there) == _without_paths(here)
    assert f"compared {RANKS} rank(s) on 3 of 3 Ray node(s)" in err, err


def test_tolerant_on_ray_is_the_process_pools(
    cluster: LocalCluster, steps_only: tuple[Path, Path]
) -> None:
    """--tolerant on the cluster: each rank's step-level records judged against the rounding
    envelope on its node (one pass), reduced to the answer the process pool gives."""
    a, b = steps_only
    here, code, err = _diff(str(a), str(b), "--tolerant")
    there, ray_code, ray_err = _diff(str(a), str(b), "--tolerant", f"--ray={cluster.address}")
    assert here and there, (err[-3000:], ray_err[-3000:])
    assert (code, ray_code) == (1, 1), ray_err[-3000:]  # no sketch: the bitwise answer
    assert (there["first_divergence"]["rank"], there["first_divergence"]["step"]) == (
        DIVERGING,
        AT,
    )
    assert there["tolerance"] is not None
    assert _without_paths(there) == _without_paths(here)


def test_op_records_are_compared_only_where_the_divergence_reached(
    cluster: LocalCluster, tmp_path: Path
) -> None:
    """Runs with step-level records and a window of op records: the step-level records of
    every rank first, then the op records of the rank whose state differs, and of no other;
    the first divergence is the one the process pool names. explain then reads the traces it
    needs from the nodes (the driver's copy is gone)."""
    a, b = _runs(tmp_path, cluster, ops=True)
    here, code, _ = _diff(str(a), str(b))
    there, ray_code, err = _diff(str(a), str(b), f"--ray={cluster.address}")
    assert (code, ray_code) == (1, 1), err[-3000:]
    assert there["first_divergence"] == here["first_divergence"]
    assert there["first_divergence"]["a"]["op"] == "aten::mm"
    assert there["verdict"] == here["verdict"] and there["origin_ranks"] == [DIVERGING]
    levels = {r["rank"]: r["level"] for r in there["ranks"]}
    assert levels.pop(DIVERGING) == "op" and set(levels.values()) == {"step"}
    assert any("compared by their step-level records only" in n for n in there["notes"])
    for side in (a, b):
        shutil.rmtree(side)
    explained = subprocess.run(
        [sys.executable, "-m", "opguard", "explain", str(a), str(b), "--ray", cluster.address],
        capture_output=True,
        text=True,
        cwd="/",
        timeout=300,
    )
    assert explained.returncode == 1, explained.stderr[-3000:]
    assert f"rank {DIVERGING}" in explained.stdout and "aten::mm" in explained.stdout


def test_a_damaged_or_missing_trace_is_named_and_the_rest_compared(
    cluster: LocalCluster, steps_only: tuple[Path, Path]
) -> None:
    a, b = steps_only
    damaged, missing = 4, 5  # on nodes n1 and n2 (rank K on node K mod 3)
    data = cluster.nodes[damaged % 3].local(b) / schema.rank_dir_name(damaged) / "data.mdb"
    kept = data.read_bytes()
    gone = cluster.nodes[missing % 3].local(a) / schema.rank_dir_name(missing)
    try:
        data.write_bytes(kept[: len(kept) // 3])
        shutil.move(gone, gone.with_name("moved"))
        found, code, err = _diff(str(a), str(b), f"--ray={cluster.address}")
    finally:
        data.write_bytes(kept)
        shutil.move(gone.with_name("moved"), gone)
    assert code == 1, err[-3000:]  # the diverging rank still diverged
    assert found["first_divergence"]["rank"] == DIVERGING
    why = {entry["rank"]: entry["why"] for entry in found["ranks_not_compared"]}
    assert sorted(why) == [damaged, missing]
    assert "data.mdb" in why[damaged] or "damaged" in why[damaged], why
    assert f"run A's trace of rank {missing}" in why[missing], why
    assert len(found["ranks"]) == RANKS - 2
    assert f"rank {damaged}: not compared" in " ".join(found["notes"])


def test_a_worker_killed_mid_comparison_is_run_again_with_the_same_answer(
    cluster: LocalCluster,
    steps_only: tuple[Path, Path],
    pools_answer: dict[str, Any],
    tmp_path: Path,
) -> None:
    from ray_faults import MARKER_ENV, RANK_ENV

    from opguard.analysis.contract import to_json
    from opguard.distributed.driver import diff_on_cluster

    a, b = steps_only
    marker = tmp_path / "killed"
    ray.init(
        address=cluster.address,
        logging_level="ERROR",
        log_to_driver=False,
        runtime_env={
            "env_vars": {MARKER_ENV: str(marker), RANK_ENV: str(DIVERGING)},
            "worker_process_setup_hook": "ray_faults.kill_first_comparison",
        },
    )
    try:
        found = diff_on_cluster(ray, str(a), str(b))
    finally:
        ray.shutdown()
    assert marker.exists()  # the diverging rank's comparison was killed once ...
    assert not found.result.not_compared
    assert _without_paths(to_json(found.result)) == _without_paths(pools_answer)  # run again


def test_the_ranks_of_a_node_gone_are_listed_as_not_compared(
    cluster: LocalCluster, steps_only: tuple[Path, Path]
) -> None:
    """Last: the cluster loses a node for good. Its ranks (rank 11 among them) are
    listed as not compared and the verdict is incomplete; with nothing left to compare, the
    diff is an error."""
    a, b = steps_only
    cluster.kill(cluster.nodes[2])
    found, code, err = _diff(str(a), str(b), f"--ray={cluster.address}")
    assert code == 3, err[-3000:]
    assert found["verdict"] == "incomplete" and found["first_divergence"] is None
    lost = sorted(entry["rank"] for entry in found["ranks_not_compared"])
    assert lost == [k for k in range(RANKS) if k % 3 == 2]
    assert "ranks 2, 5, 8" in found["scope"]
    _, code, err = _diff(str(a), str(b), "--rank", str(DIVERGING), f"--ray={cluster.address}")
    assert code == 2 and err.strip().count("\n") == 0, err
    assert f"no rank could be compared: rank {DIVERGING}" in err
