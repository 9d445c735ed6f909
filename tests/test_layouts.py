"""Runs in two parallel layouts: the same MLP with tensor parallelism over two gloo ranks
(DTensor, fc1 column-wise, fc2 row-wise) against one process (tests/data/tolerant/tp_mlp.py).
Each TP rank must align op for op with the single process by call site, DTensor's collectives
and bookkeeping must be told apart from real structure, partial sums must be compared where
their all-reduce makes them whole, and shards must be reported as not comparable."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from opguard.analysis.align.layouts import (
    LAYOUT_ONLY,
    OnlyKind,
    PairKind,
    Relation,
    layout_degree,
    layout_step,
    rank_pairs,
    relate,
)
from opguard.store import Run

pytestmark = [
    pytest.mark.skipif(
        not (torch.distributed.is_available() and torch.distributed.is_gloo_available()),
        reason="torch.distributed with the gloo backend is not available in this build",
    ),
    pytest.mark.slow,  # long in all: started first (conftest.py)
]

STEPS = (0, 1, 2)


@pytest.mark.parametrize(
    ("a", "b", "degree", "expected"),
    [
        ((32, 256), (32, 256), 2, (Relation.SAME, None)),
        ((32, 256), (32, 128), 2, (Relation.SHARD, 1)),
        ((128, 64), (256, 64), 2, (Relation.SHARD, 0)),  # either run may be the sharded one
        ((10,), (3,), 4, (Relation.SHARD, 0)),  # torch.chunk: 3, 3, 3, 1
        ((10,), (1,), 4, (Relation.SHARD, 0)),
        ((10,), (2,), 4, (Relation.OTHER, None)),
        ((32, 256), (16, 128), 2, (Relation.OTHER, None)),  # two dimensions differ
        ((32, 256), (32, 128), 1, (Relation.OTHER, None)),  # same layouts: no shards
        ((32, 256), (32, 2, 128), 2, (Relation.OTHER, None)),
    ],
)
def test_shapes_relate_as_one_tensor_in_two_layouts(
    a: tuple[int, ...], b: tuple[int, ...], degree: int, expected: tuple[Relation, int | None]
) -> None:
    assert relate(a, b, degree) == expected


def test_ranks_pair_against_the_single_rank_run_and_say_when_they_cannot() -> None:
    assert rank_pairs([0], [0, 1]) == [(0, 0), (0, 1)]
    assert rank_pairs([0, 1], [0]) == [(0, 0), (1, 0)]
    assert rank_pairs([0, 1], [0, 1]) == [(0, 0), (1, 1)]
    assert rank_pairs([0, 1], [0, 1, 2, 3]) is None  # which ranks form a TP group: the mesh
    assert layout_degree([0], [0, 1]) == 2
    assert layout_degree([0, 1, 2], [0, 1]) is None


@pytest.mark.parametrize("rank", [0, 1])
def test_every_tp_rank_aligns_op_for_op_with_the_single_process_by_call_site(
    tp_runs: dict[str, Path], rank: int
) -> None:
    with Run(tp_runs["tp1"]) as one, Run(tp_runs["tp2"]) as two:
        single, sharded = one.rank(0), two.rank(rank)
        for step in STEPS:
            layout = layout_step(single, sharded, step, 2)
            assert not [o for o in layout.only if o.side.name == "A"]
            for pair in layout.pairs:
                a, b = single.op(pair.a), sharded.op(pair.b)
                assert (a.op, a.call_site.line) == (b.op, b.call_site.line)
                assert pair.kind is not PairKind.UNRELATED


@pytest.mark.parametrize("rank", [0, 1])
def test_ops_only_the_tp_run_has_are_its_layout_once_training_runs(
    tp_runs: dict[str, Path], rank: int
) -> None:
    """From step 1 on, every op only TP=2 has is a collective, a reshaping view or DTensor's
    meta op, or the replicated bias divided by two before the row-wise matmul; at step 0 the
    device mesh's set-up is read by nothing the model computes, and the slices that cut each
    rank's shard out of the full weights are selections, whose offsets are not checked."""
    with Run(tp_runs["tp1"]) as one, Run(tp_runs["tp2"]) as two:
        single, sharded = one.rank(0), two.rank(rank)
        for step in STEPS:
            only = layout_step(single, sharded, step, 2).only
            allowed = LAYOUT_ONLY | ({OnlyKind.UNREAD, OnlyKind.SELECTION} if step == 0 else set())
            assert {o.kind for o in only} <= allowed
            inputs = [sharded.op(o.index).op for o in only if o.kind is OnlyKind.LAYOUT_INPUT]
            assert "aten::div.Tensor" in inputs
            collectives = [sharded.op(o.index) for o in only if o.kind is OnlyKind.COLLECTIVE]
            assert collectives and all(op.is_collective for op in collectives)


@pytest.mark.parametrize("rank", [0, 1])
def test_partial_sums_compare_after_their_all_reduce_and_shards_say_why_not(
    tp_runs: dict[str, Path], rank: int
) -> None:
    with Run(tp_runs["tp1"]) as one, Run(tp_runs["tp2"]) as two:
        single, sharded = one.rank(0), two.rank(rank)
        layout = layout_step(single, sharded, 1, 2)
        by_name: dict[str, list] = {}
        for pair in layout.pairs:
            op = single.op(pair.a)
            by_name.setdefault(f"{op.op} {op.phase}", []).append(pair)
        fc1, fc2 = by_name["aten::addmm.default forward"]
        assert fc1.kind is PairKind.SHARDED and not fc1.compared
        assert "shard along dim 1" in fc1.reason and "offset is not recorded" in fc1.reason
        assert fc2.kind is PairKind.REDUCED
        (logical,) = fc2.compared
        assert sharded.op(logical.b[0]).op == "_c10d_functional::all_reduce.default"
        assert single.op(logical.a[0]).op == "aten::addmm.default"
        # the input gradient of the column-wise fc1 is partial too: reduced before the norm
        norm_grad_input = [
            p for p in by_name["aten::mm.default backward"] if p.kind is PairKind.REDUCED
        ]
        assert len(norm_grad_input) == 1
        # replicated tensors compare as they are: the norm's output, bit for bit at step 0
        (norm,) = by_name["aten::native_layer_norm.default forward"]
        assert norm.kind is PairKind.COMPARABLE and len(norm.compared) == 3
        (norm0,) = [
            p
            for p in layout_step(single, sharded, 0, 2).pairs
            if single.op(p.a).op == "aten::native_layer_norm.default"
        ]
        assert all(t.equal for t in norm0.compared)


def test_a_shard_loaded_from_the_wrong_offset_is_not_compared_as_if_it_were_known(
    tp_runs: dict[str, Path],
) -> None:
    """The bug's slice of the checkpoint (offset 0 instead of 128 on rank 1) is a selection
    only TP=2 has, and the copy into fc2.weight's local shard a shard: neither is called
    layout-only or equal; the first all-reduced value after it (fc2's output) is the first
    compared tensor to differ on both ranks."""
    with Run(tp_runs["tp1"]) as one, Run(tp_runs["tp2_bug"]) as two:
        single = one.rank(0)
        for rank in (0, 1):
            sharded = two.rank(rank)
            layout = layout_step(single, sharded, 0, 2)
            loads = [p for p in layout.pairs if single.op(p.a).op == "aten::copy_.default"]
            assert [p.kind for p in loads] == [
                PairKind.COMPARABLE,  # norm.weight
                PairKind.COMPARABLE,  # norm.bias
                PairKind.SHARDED,  # fc1.weight
                PairKind.SHARDED,  # fc1.bias
                PairKind.SHARDED,  # fc2.weight: rank 1's shard is rank 0's
                PairKind.COMPARABLE,  # fc2.bias (replicated)
            ]
            slices = [o for o in layout.only if sharded.op(o.index).op == "aten::slice.Tensor"]
            assert len(slices) == 3 and all(o.kind is OnlyKind.SELECTION for o in slices)
            first = next(
                p
                for p in layout.pairs
                if single.op(p.a).phase == "forward" and any(t.equal is False for t in p.compared)
            )
            assert first.kind is PairKind.REDUCED
            assert single.op(first.a).op == "aten::addmm.default"
