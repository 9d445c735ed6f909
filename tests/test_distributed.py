"""Distributed runs on the CPU: two 2-rank gloo jobs under torchrun, where rank 1 of run B
reads a different data shard. The diff must name rank 1 the origin, at the line that draws
the data, and rank 0 a receiver at the all-reduce that brought rank 1's gradient over.

The recordings (torchrun twice, a rerun, and a job whose processes were started by hand) run
at once in a module fixture: each is mostly interpreter start-up and ``import torch``.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import run_cli
from run_once import BATCH_TIMEOUT

from opguard.store import Run

SCRIPT = Path(__file__).resolve().parent / "scripts" / "dist_shards.py"
P2P = SCRIPT.with_name("dist_p2p.py")
FSDP2 = SCRIPT.with_name("dist_fsdp2.py")
DATA_LINE = next(
    n for n, text in enumerate(SCRIPT.read_text().splitlines(), 1) if text.endswith("# <- data")
)
ENV = {"OMP_NUM_THREADS": "1"}

pytestmark = [
    pytest.mark.skipif(
        not (torch.distributed.is_available() and torch.distributed.is_gloo_available()),
        reason="torch.distributed with the gloo backend is not available in this build",
    ),
    pytest.mark.slow,  # long in all: started first (conftest.py)
]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _opguard(*args: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    return subprocess.Popen(
        [sys.executable, "-m", "opguard", *args],
        cwd=cwd,  # never the repository root, see conftest.run_cli
        env={**os.environ, **ENV, **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A and its rerun A2 (``torchrun``), B with rank 1 on another shard
    (``-m torch.distributed.run``), S: two processes started by hand with RANK set, P/P2:
    a send from rank 0 to rank 1, P2 sending other data, F/FB: FSDP2 with rank 1 of FB on
    another shard, and W1: A's script on one rank."""
    root = tmp_path_factory.mktemp("dist")
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    jobs = []
    for name, launcher, extra in (
        ("A", [torchrun], []),
        ("A2", [torchrun], []),
        ("B", ["-m", "torch.distributed.run", "--"], ["--shift-rank", "1"]),
        ("P", [torchrun], []),
        ("P2", [torchrun], ["--shift"]),
        ("F", [torchrun], []),
        ("FB", [torchrun], ["--shift-rank", "1"]),
        ("W1", [torchrun], []),
    ):
        where = launcher if launcher[0] == "-m" else ["--", *launcher]
        jobs.append(
            _opguard(
                "record",
                "-o",
                str(root / name),
                *where,
                "--standalone",  # torchrun picks a free port itself
                "--nproc-per-node",
                "1" if name == "W1" else "2",
                str({"P": P2P, "F": FSDP2}.get(name[0], SCRIPT)),
                *extra,
                cwd=root,
            )
        )
    port = str(_free_port())
    for rank in ("0", "1"):
        by_hand = {"RANK": rank, "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1"}
        jobs.append(
            _opguard(
                "record",
                "-o",
                str(root / "S"),
                "--",
                str(SCRIPT),
                cwd=root,
                env={**by_hand, "MASTER_PORT": port},
            )
        )
    for job in jobs:
        out, _ = job.communicate(timeout=BATCH_TIMEOUT)
        assert job.returncode == 0, out
    return {name: root / name for name in ("A", "A2", "B", "S", "P", "P2", "F", "FB", "W1")}


def _diff(a: Path, b: Path, *extra: str) -> tuple[int, dict[str, Any]]:
    result = run_cli("diff", str(a), str(b), "--json", *extra, cwd=a.parent)
    assert result.returncode in (0, 1), result.stderr
    return result.returncode, json.loads(result.stdout)


def test_every_rank_is_recorded_with_the_job_in_the_metadata(runs: dict[str, Path]) -> None:
    with Run(runs["A"]) as run:
        assert run.ranks == [0, 1]
        assert run.meta["world_size"] == 2
        assert run.meta["backend"] == "gloo"
        assert run.meta["launcher"] == "torchrun"
        assert [r["rank"] for r in run.meta["ranks"]] == [0, 1]
        assert run.meta["status"] == "finished" and run.meta["exit_code"] == 0
        for k in run.ranks:
            info = run.rank(k).info
            assert info["start"]["rank"] == k and info["start"]["world_size"] == 2
            assert info["distributed"] == {
                "rank": k,
                "world_size": 2,
                "backend": "gloo",
                "device": "cpu",
            }


def test_collectives_are_ops_with_tensors_and_their_group(runs: dict[str, Path]) -> None:
    with Run(runs["A"]) as run:
        reduces = [op for op in run.rank(1).ops() if op.op == "c10d::allreduce_.default"]
    assert len(reduces) == 4  # weight and bias, two steps
    op = reduces[0]
    group = dict(op.args)["process_group"]
    assert {k: group[k] for k in ("size", "ranks", "backend")} == {
        "size": 2,
        "ranks": [0, 1],
        "backend": "gloo",
    }
    assert dict(op.args)["reduce_op"] == {"object": "ReduceOp"}
    assert op.inputs and op.outputs
    # The recorded output is the reduced gradient, not the buffer before the reduction.
    assert op.inputs[0].content_key() != op.outputs[0].content_key()


def test_the_diff_names_the_origin_rank_and_its_receiver(runs: dict[str, Path]) -> None:
    code, result = _diff(runs["A"], runs["B"])
    assert code == 1 and result["verdict"] == "diverged"
    assert result["origin_ranks"] == [1]
    first = result["first_divergence"]
    assert first["rank"] == 1
    assert first["a"]["call_site"]["line"] == DATA_LINE
    rank_0, rank_1 = result["ranks"]
    assert rank_1["role"] == "origin"
    assert rank_1["divergence"]["a"]["call_site"]["line"] == DATA_LINE
    assert rank_0["role"] == "receiver"
    assert rank_0["divergence"]["a"]["op"] == "c10d::allreduce_.default"
    assert rank_0["collective"]["op"] == "c10d::allreduce_.default"
    assert rank_0["group"]["ranks"] == [0, 1]


def test_the_human_report_gives_each_rank_its_role(runs: dict[str, Path]) -> None:
    result = run_cli("diff", str(runs["A"]), str(runs["B"]), cwd=runs["A"].parent)
    assert result.returncode == 1, result.stderr
    assert "origin: 1" in result.stdout
    assert "rank 0: receiver" in result.stdout and "from rank(s) 1" in result.stdout
    assert "rank 1: origin" in result.stdout


def test_one_rank_alone_shows_what_it_saw(runs: dict[str, Path]) -> None:
    code, result = _diff(runs["A"], runs["B"], "--rank", "0")
    assert code == 1
    assert result["origin_ranks"] == []  # the sender was not compared
    assert result["first_divergence"]["rank"] == 0
    assert result["first_divergence"]["a"]["op"] == "c10d::allreduce_.default"


def test_reruns_are_identical(runs: dict[str, Path]) -> None:
    code, result = _diff(runs["A"], runs["A2"])
    assert code == 0 and result["verdict"] == "identical"
    assert result["origin_ranks"] == []
    assert all(r["role"] is None for r in result["ranks"])


def test_processes_started_by_hand_record_one_run(runs: dict[str, Path]) -> None:
    with Run(runs["S"]) as run:
        assert run.ranks == [0, 1]
        assert run.meta["world_size"] == 2
    code, _ = _diff(runs["S"], runs["A"])
    assert code == 0


def test_a_received_message_names_the_sender(runs: dict[str, Path]) -> None:
    """A receive completes after the op returns: its buffer is fingerprinted when first read,
    and the receiving rank is a receiver at ``recv_``."""
    code, result = _diff(runs["P"], runs["P2"])
    assert code == 1
    assert result["origin_ranks"] == [0]
    assert result["first_divergence"]["a"]["op"] == "aten::randn.generator"
    rank_1 = result["ranks"][1]
    assert rank_1["role"] == "receiver"
    assert rank_1["collective"]["op"] == "c10d::recv_.default"


def test_fsdp2_names_the_origin_rank_and_its_receiver(runs: dict[str, Path]) -> None:
    """FSDP2 gathers parameters before each layer and reduce-scatters gradients: rank 0 first
    sees rank 1's other data in the gradients it receives (the parameters it gathered in the
    first forward pass are still equal), and the partly filled all-gather buffer FSDP2 hands
    around is not mistaken for a divergence."""
    fsdp_line = next(
        n for n, text in enumerate(FSDP2.read_text().splitlines(), 1) if text.endswith("# <- data")
    )
    code, result = _diff(runs["F"], runs["FB"])
    assert code == 1 and result["origin_ranks"] == [1]
    assert result["first_divergence"]["a"]["call_site"]["line"] == fsdp_line
    rank_0, rank_1 = result["ranks"]
    assert rank_1["role"] == "origin"
    assert rank_0["role"] == "receiver"
    assert rank_0["collective"]["op"].startswith("c10d::_reduce_scatter_base")


def test_runs_of_different_world_sizes_compare_the_common_ranks(runs: dict[str, Path]) -> None:
    """A (2 ranks) against W1 (the same script on 1 rank): rank 0 is compared, and the diff
    says that rank 1 could not be."""
    code, result = _diff(runs["A"], runs["W1"])
    assert [r["rank"] for r in result["ranks"]] == [0]
    assert result["ranks_only_in"] == {"a": [1], "b": []}
    assert any("rank 1 was recorded only in run A" in note for note in result["notes"])
    # One rank alone averages over a group of one: the all-reduce's group differs.
    first = result["first_divergence"]
    assert code == 1 and first["a"]["op"] == "c10d::allreduce_.default"
    text = run_cli("diff", str(runs["A"]), str(runs["W1"]), cwd=runs["A"].parent).stdout
    assert "rank 1 was recorded only in run A (ranks 2 vs 1): not compared" in text
