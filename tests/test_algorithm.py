"""The comparison's algorithm, piece by piece, beside the end-to-end scenarios: Myers' diff
(a longest common subsequence within an edit bound), the multi-pass alignment (strict keys
first, looser keys only inside the gaps) and the divergence classifier on hand-built pairs."""

from __future__ import annotations

from itertools import pairwise
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from traces import TraceBuilder, chain_run, tensor

from opguard.analysis import diff_runs
from opguard.analysis.align.myers import TooManyEdits, matching_blocks, matching_runs, runs_of
from opguard.analysis.align.passes import align_keys, pairs_of
from opguard.store import Run
from opguard.store.light import LEVELS

keys = st.lists(st.integers(0, 4), max_size=40)


def lcs_length(a: list[int], b: list[int]) -> int:
    """The reference: the quadratic dynamic programme."""
    row = [0] * (len(b) + 1)
    for x in a:
        diagonal, row[0] = 0, 0
        for j, y in enumerate(b, 1):
            diagonal, row[j] = row[j], diagonal + 1 if x == y else max(row[j], row[j - 1])
    return row[-1]


def assert_common_subsequence(pairs: list[tuple[int, int]], a: list[int], b: list[int]) -> None:
    assert all(a[i] == b[j] for i, j in pairs)
    assert all(i < i2 and j < j2 for (i, j), (i2, j2) in pairwise(pairs))


# -- Myers ------------------------------------------------------------------------------------------


@given(keys, keys)
@settings(max_examples=300, deadline=None)
def test_myers_finds_a_longest_common_subsequence(a: list[int], b: list[int]) -> None:
    pairs = matching_blocks(a, b, max_edits=len(a) + len(b))
    assert_common_subsequence(pairs, a, b)
    assert len(pairs) == lcs_length(a, b)


@given(st.lists(st.integers(0, 2), min_size=70, max_size=200), st.data())
@settings(max_examples=100, deadline=None)
def test_long_equal_ends_are_skipped_whole_and_the_middle_diffed(
    a: list[int], data: st.DataObject
) -> None:
    """Traces are long and mostly equal: the common ends are compared 64 at a time."""
    at = data.draw(st.integers(0, len(a) - 1))
    b = [*a[:at], 9, *a[at + 1 :]]  # one op replaced
    pairs = matching_blocks(a, b, max_edits=4)
    assert len(pairs) == len(a) - 1 == lcs_length(a, b)
    assert (at, at) not in pairs


@given(keys, keys, st.integers(0, 40))
@settings(max_examples=300, deadline=None)
def test_the_edit_bound(a: list[int], b: list[int], bound: int) -> None:
    """Within the bound, a longest common subsequence; TooManyEdits only beyond it (the caller
    then matches greedily)."""
    edits = len(a) + len(b) - 2 * lcs_length(a, b)
    try:
        pairs = matching_blocks(a, b, max_edits=bound)
    except TooManyEdits:
        assert edits > bound
        return
    assert_common_subsequence(pairs, a, b)
    assert len(pairs) == lcs_length(a, b)


def test_the_edit_bound_by_hand() -> None:
    a, b = [1, 2, 3, 4], [5, 2, 3, 6]  # two replaced: four edits
    assert matching_blocks(a, b, max_edits=4) == [(1, 1), (2, 2)]
    with pytest.raises(TooManyEdits):
        matching_runs(a, b, max_edits=3)


def test_runs_group_consecutive_pairs() -> None:
    assert runs_of([(0, 0), (1, 1), (2, 4), (3, 5), (5, 6)]) == [(0, 0, 2), (2, 4, 2), (5, 6, 1)]
    assert matching_runs([1, 2, 3, 7, 4, 5], [1, 2, 3, 4, 5], 10) == [(0, 0, 3), (4, 3, 2)]


# -- the multi-pass alignment --------------------------------------------------------------------

# An op as (name, phase, call site): the strict key is all three, the looser ones drop the call
# site, then the phase, as the diff's keys do (opguard.analysis.align.keys).
ops = st.lists(st.tuples(st.integers(0, 3), st.integers(0, 1), st.integers(0, 2)), max_size=30)


def levels(sequence: list[tuple[int, int, int]]) -> list[list[int]]:
    coarser = [lambda o: o[0] * 100 + o[1] * 10 + o[2], lambda o: o[0] * 10 + o[1], lambda o: o[0]]
    assert len(coarser) == LEVELS
    return [[key(op) for op in sequence] for key in coarser]


@given(ops, ops)
@settings(max_examples=300, deadline=None)
def test_strict_matches_are_kept_and_looser_keys_only_fill_the_gaps(
    a: list[tuple[int, int, int]], b: list[tuple[int, int, int]]
) -> None:
    ka, kb = levels(a), levels(b)
    pairs = pairs_of(align_keys(ka, kb))
    strict = matching_blocks(ka[0], kb[0], max_edits=len(a) + len(b))
    assert set(strict) <= set(pairs)
    # Every pair agrees at least on the loosest key, and the pairs increase on both sides: a
    # looser pair lies between the same two strict pairs in A and in B, inside their gap.
    assert_common_subsequence(pairs, ka[-1], kb[-1])
    # Inside each gap the looser passes match as much as their keys allow.
    assert len(pairs) >= lcs_length(ka[0], kb[0])


def test_a_moved_call_site_aligns_on_a_looser_key_inside_its_gap() -> None:
    """Run B calls ``add`` from another line: mm and relu match strictly, add inside the gap
    by op and phase; an equal op outside the gap is never borrowed."""
    a = [(0, 0, 0), (1, 0, 0), (2, 0, 1), (1, 0, 2)]  # mm, add@0, relu, add@2
    b = [(0, 0, 0), (1, 0, 5), (2, 0, 1)]  # mm, add@5, relu
    pairs = pairs_of(align_keys(levels(a), levels(b)))
    assert pairs == [(0, 0), (1, 1), (2, 2)]


# -- the divergence classifier ---------------------------------------------------------------------


Ops = list[tuple[str, int | None, int]]


def first_divergence(
    tmp_path: Path, a: Ops, b: Ops, args: dict[str, dict[int, list[list[Any]]]] | None = None
) -> tuple[str, str, str]:
    """(kind, cause, the op named) of run A's and run B's first divergence."""
    run_a = chain_run(tmp_path / "a", a, args=(args or {}).get("a"))
    run_b = chain_run(tmp_path / "b", b, args=(args or {}).get("b"))
    return _classified(run_a, run_b)


def _classified(run_a: Path, run_b: Path) -> tuple[str, str, str]:
    with Run(run_a) as ra, Run(run_b) as rb:
        first = diff_runs(ra, rb).first
    assert first is not None
    named = first.a if first.a is not None else first.b
    assert named is not None
    return first.kind, first.cause, named.op


BASE: Ops = [
    ("aten::randn.default", None, 10),
    ("aten::mm.default", 0, 20),
    ("aten::gelu.default", 1, 30),
]


def test_equal_inputs_different_outputs_is_an_origin(tmp_path: Path) -> None:
    b = [*BASE[:2], ("aten::gelu.default", 1, 31)]
    assert first_divergence(tmp_path, BASE, b) == ("origin", "origin", "aten::gelu.default")


def test_an_argument_that_differs_is_named(tmp_path: Path) -> None:
    b = [*BASE[:2], ("aten::gelu.default", 1, 31)]
    args = {"a": {2: [["approximate", "none"]]}, "b": {2: [["approximate", "tanh"]]}}
    assert first_divergence(tmp_path, BASE, b, args=args) == (
        "argument",
        "argument",
        "aten::gelu.default",
    )


def test_a_difference_that_came_in_with_the_data_is_propagated_from_a_leaf(tmp_path: Path) -> None:
    """The first op's input was never written by a recorded op (data loaded outside)."""
    for run, data in (("a", 5), ("b", 6)):
        with TraceBuilder(tmp_path / run) as trace:
            mm = trace.op("aten::mm.default", [tensor("self", data)], [tensor("0", 20 + data)])
            trace.op(
                "aten::gelu.default", [tensor("self", 20 + data, mm)], [tensor("0", 30 + data)]
            )
    kind, cause, _ = _classified(tmp_path / "a", tmp_path / "b")
    assert (kind, cause) == ("propagated", "leaf")


def test_an_op_only_one_run_has_that_feeds_the_difference_is_structure(tmp_path: Path) -> None:
    """Run B divides the product before gelu (an inserted ``/ accum_steps``)."""
    b = [*BASE[:2], ("aten::div.Tensor", 1, 21), ("aten::gelu.default", 2, 31)]
    assert first_divergence(tmp_path, BASE, b) == ("structure", "inserted", "aten::div.Tensor")
