"""``opguard diff --tolerant`` across parallel layouts: the MLP of tests/data/tolerant/tp_mlp.py
with tensor parallelism over two gloo ranks (DTensor) against one process. Every TP rank is
compared with the single process, and the pair is within rounding in either order; the
sharding bug (fc2.weight loaded from the wrong offset) is named at fc2, where its difference
first shows on a tensor both layouts hold whole; the report says how many shards it did not
compare by value."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import cli_in_process

from opguard.agent import OpFocus, TraceTools
from opguard.agent.config import AgentSettings
from opguard.agent.panel import AgentChat
from opguard.analysis import diff_runs
from opguard.analysis.browse.rows import Side
from opguard.analysis.contract import to_json
from opguard.analysis.tolerant.rule import Tolerance
from opguard.store import Run
from opguard.tui.session import Session

pytestmark = pytest.mark.skipif(
    not (torch.distributed.is_available() and torch.distributed.is_gloo_available()),
    reason="torch.distributed with the gloo backend is not available in this build",
)

ORDERS = [("tp2", "tp1"), ("tp1", "tp2")]
LAYOUT_KEYS = {
    "degree",
    "rank_a",
    "rank_b",
    "steps",
    "comparable",
    "reduced",
    "sharded",
    "unrelated",
    "layout_only",
    "selections",
}


def tolerant(a: Path, b: Path) -> dict[str, Any]:
    with Run(a) as run_a, Run(b) as run_b:
        return to_json(diff_runs(run_a, run_b, tolerance=Tolerance()))


@pytest.mark.parametrize(("a", "b"), ORDERS)
def test_tp2_against_tp1_is_within_rounding_on_every_rank_pair(
    tp_runs: dict[str, Path], a: str, b: str
) -> None:
    out = tolerant(tp_runs[a], tp_runs[b])
    assert out["verdict"] == "within-rounding"
    assert out["ranks_only_in"] == {"a": [], "b": []}  # no rank left uncompared
    tp_side = "a" if a == "tp2" else "b"
    assert [r["rank"] for r in out["ranks"]] == [0, 1]
    for r in out["ranks"]:
        layout = r["layout"]
        assert set(layout) == LAYOUT_KEYS
        assert layout["degree"] == 2
        assert layout[f"rank_{tp_side}"] == r["rank"]
        # the logical values were compared: the replicated ones, and fc2's output and the
        # norm's input gradient after the all-reduce only TP=2 has
        assert layout["comparable"] > 0 and layout["reduced"] > 0
        assert layout["sharded"] > 0  # fc1, gelu, the sharded weights' updates: not compared
        assert r["rounding"]["explained"] > 0


@pytest.mark.parametrize(("a", "b"), [("tp2_bug", "tp1"), ("tp1", "tp2_bug")])
def test_a_sharding_bug_is_named_at_fc2_where_it_first_shows(
    tp_runs: dict[str, Path], a: str, b: str
) -> None:
    """The wrong shard of fc2.weight is a shard (not comparable by value); fc2's output,
    all-reduced in the TP run, is the first comparable tensor it changes: there, at step 0, it
    is beyond rounding of the comparable tensors the sharded ops read (the norm's output), on
    both ranks (rank 0's correct partial sum is added to rank 1's wrong one). fc2's addmm is
    named where the difference first shows, saying its inputs were not compared."""
    out = tolerant(tp_runs[a], tp_runs[b])
    assert out["verdict"] == "diverged"
    first = out["first_divergence"]
    assert (first["kind"], first["step"]) == ("origin", 0)
    assert first["distance"]["reason"] == "amplified"
    assert first["distance"]["output"] > 0.1  # a wrong shard, not rounding
    single = "a" if a == "tp1" else "b"
    named = first[single]
    assert (named["op"], named["phase"]) == ("aten::addmm.default", "forward")
    with Run(tp_runs["tp1"]) as run:
        addmm = [op.index for op in run.rank(0).ops() if op.op == "aten::addmm.default"]
    assert named["index"] == addmm[1]  # fc2, not fc1
    assert "from shards that are not compared by value" in first["summary"]
    assert all(r["divergence"]["step"] == 0 for r in out["ranks"])


def test_a_slice_with_another_offset_is_named_at_the_slice(tp_runs: dict[str, Path]) -> None:
    """TP=2 against TP=2 with the wrong shard of fc2.weight loaded: rank 1's ``narrow`` takes
    rows 0-128 where it should take 128-256. The slice is a view whose values are its base's
    (the same checkpoint in both runs): under ``--tolerant`` its other arguments are the real
    change, named at the slice (as bit for bit), not at the ``copy_`` that reads it."""
    out = tolerant(tp_runs["tp2"], tp_runs["tp2_bug"])
    first = out["first_divergence"]
    assert (out["verdict"], first["rank"], first["kind"], first["step"]) == (
        "diverged",
        1,
        "argument",
        0,
    )
    assert first["a"]["op"] == "aten::slice.Tensor"
    assert "full.narrow(" in first["a"]["source"]
    assert {d["name"]: (d["a"], d["b"]) for d in first["arguments_differ"]}["start"] == (128, 0)


def test_the_report_says_shards_were_not_compared(tp_runs: dict[str, Path]) -> None:
    code, out, _ = cli_in_process("diff", str(tp_runs["tp2"]), str(tp_runs["tp1"]), "--tolerant")
    assert code == 0 and out.startswith("WITHIN-ROUNDING")
    assert "shard(s) NOT compared by value" in out
    assert "run A rank 1 against run B rank 0" in out
    code, out, _ = cli_in_process(
        "explain", str(tp_runs["tp1"]), str(tp_runs["tp2_bug"]), "--tolerant"
    )
    assert code == 1 and "aten::addmm.default" in out


def test_the_debugger_steps_through_each_tp_rank_against_the_single_one(
    tp_runs: dict[str, Path],
) -> None:
    """``opguard tui RUN_TP2 RUN_TP1 --tolerant`` pairs the ranks as the diff does, every TP
    rank against the single process (rank 1 was "only in run A" before), and its rows align as
    the diff's walk does: the pair the diff names on rank 1 is one row of the debugger."""
    with Run(tp_runs["tp2_bug"]) as run_a, Run(tp_runs["tp1"]) as run_b:
        diff = diff_runs(run_a, run_b, rank=1, tolerance=Tolerance()).ranks[0]
    assert diff.first is not None
    session = Session.open(tp_runs["tp2_bug"], tp_runs["tp1"], Tolerance())
    try:
        assert session.ranks == [0, 1] and session.notices(1) == []
        for rank in session.ranks:
            assert session.trace(Side.A, rank).rank == rank
            assert session.trace(Side.B, rank).rank == 0
        rows = session.rows(1)
        rows.set_diff(diff)
        assert rows.first is not None
        row = rows.row_of(Side.A, rows.first[0])
        assert row is not None and row.b is not None and row.b.index == rows.first[1]
        assert row.a is not None and row.a.name == "aten::addmm.default"
    finally:
        session.close()


def test_the_agent_of_a_tolerant_debugger_reads_the_paired_ranks(tp_runs: dict[str, Path]) -> None:
    """The debugger's agent under ``--tolerant`` is given the tolerant diff (not the first
    bitwise difference), and its tools read each rank's comparison from the ranks it paired:
    run B's op on rank 1 is the single process's (B has no rank 1)."""
    with Run(tp_runs["tp2_bug"]) as run_a, Run(tp_runs["tp1"]) as run_b:
        chat = AgentChat.for_runs(run_a, run_b, tolerance=Tolerance(), settings=AgentSettings())
        session = chat.opener()
        assert session.result.tolerance is not None and session.result.diverged
        by_rank = {r.rank: r for r in session.result.ranks}
        tools = TraceTools(run_a, run_b, 1, {k: r.trace_ranks for k, r in by_rank.items()})
        named = by_rank[1].first
        assert named is not None and named.b is not None
        trace, op = tools.op("b", named.b.index)
        assert trace.rank == 0 and op.op == "aten::addmm.default"
        assert tools.describe(OpFocus("b", named.b.index, 1)).startswith("run B, rank 1:")
