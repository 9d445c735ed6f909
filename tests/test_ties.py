"""Settling alignment ties by data flow (opguard/analysis/align/ties.py), on hand-made steps.

Each op is a name (its key at every level) and the values it reads and makes; a step is the list
of them. The scenario suite (test_scenarios.py) shows the same rules on recorded runs.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import pairwise

from hypothesis import given, settings
from hypothesis import strategies as st

from opguard.analysis.align.keys import KeyTable
from opguard.analysis.align.passes import align_keys, pairs_of
from opguard.analysis.align.ties import settle
from opguard.store import OpRecord, TensorRecord
from opguard.store.light import LEVELS, OpColumns
from opguard.store.records import UNKNOWN_SITE


@dataclass(frozen=True)
class Op:
    name: str
    reads: tuple[int, ...]  # the contents of its inputs
    makes: int  # the content of its output


def _tensor(slot: str, content: int) -> TensorRecord:
    return TensorRecord(slot, "float32", (4,), (1,), "cpu", content, 16, b"", None, None, 0)


def _columns(ops: list[Op], table: KeyTable, base: int) -> tuple[OpColumns, list[OpRecord]]:
    keys = [table(op.name) for op in ops]
    columns = OpColumns(
        0,
        [base + k for k in range(len(ops))],
        tuple(keys for _ in range(LEVELS)),
        [op.makes for op in ops],
    )
    records = [
        OpRecord(
            index=base + k,
            op=op.name,
            step=0,
            phase="forward",
            call_site=UNKNOWN_SITE,
            stack_id=-1,
            forward_index=None,
            args=(),
            inputs=tuple(_tensor(f"x{n}", c) for n, c in enumerate(op.reads)),
            outputs=(_tensor("0", op.makes),),
            rng=None,
        )
        for k, op in enumerate(ops)
    ]
    return columns, records


def settled(a: list[Op], b: list[Op]) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """The pairs of keys alone, and after settling ties (positions in ``a`` and ``b``)."""
    table = KeyTable()
    ops_a, records_a = _columns(a, table, 0)
    ops_b, records_b = _columns(b, table, 1000)
    by_index = {r.index: r for r in (*records_a, *records_b)}
    runs = align_keys(ops_a.keys, ops_b.keys)
    return pairs_of(runs), pairs_of(settle(runs, ops_a, ops_b, lambda _, i: by_index[i]))


def test_the_op_reading_the_same_value_is_the_partner() -> None:
    """Run B logs a second ``.item()`` on the same line: run A's one reads the loss, and so does
    B's first one, not its last."""
    loss, norm = 7, 9
    a = [Op("loss", (1,), loss), Op("item", (loss,), 70)]
    b = [
        Op("loss", (1,), loss),
        Op("norm", (2,), norm),
        Op("item", (loss,), 70),
        Op("item", (norm,), 90),
    ]
    _, pairs = settled(a, b)
    assert pairs == [(0, 0), (1, 2)]


def test_a_repeated_block_is_matched_where_its_inputs_agree() -> None:
    """A helper of three ops called once in A and twice in B (first on other data)."""
    block = [Op("abs", (5,), 6), Op("mean", (6,), 7), Op("item", (7,), 8)]
    other = [Op("abs", (2,), 3), Op("mean", (3,), 4), Op("item", (4,), 5)]
    before, after = settled([Op("w", (0,), 5), *block], [Op("w", (0,), 5), *other, *block])
    assert before == [(0, 0), (1, 1), (2, 2), (3, 3)]  # keys alone pair the first call
    assert after == [(0, 0), (1, 4), (2, 5), (3, 6)]


def test_a_real_difference_keeps_its_pairs() -> None:
    """Nothing agrees better elsewhere: the pairs stay as keys made them, difference and all."""
    a = [Op("x", (1,), 2), Op("f", (2,), 3), Op("g", (3,), 4)]
    b = [Op("x", (1,), 2), Op("f", (2,), 30), Op("h", (30,), 31), Op("g", (30,), 40)]
    before, after = settled(a, b)
    assert after == before


def test_runs_without_differences_are_left_alone() -> None:
    """Equal outputs throughout: no tie is worth settling, whatever the keys allow."""
    a = [Op("item", (1,), 1)]
    b = [Op("item", (1,), 1), Op("item", (1,), 1)]
    before, after = settled(a, b)
    assert after == before


ops = st.builds(
    Op,
    st.sampled_from(["f", "g", "h"]),
    st.tuples(st.integers(0, 3)),
    st.integers(0, 3),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(ops, max_size=12), st.lists(ops, max_size=12))
def test_settling_never_loses_a_pair_nor_breaks_order(a: list[Op], b: list[Op]) -> None:
    before, after = settled(a, b)
    assert len(after) >= len(before)
    assert all(x[0] < y[0] and x[1] < y[1] for x, y in pairwise(after))
    assert all(a[i].name == b[j].name for i, j in after)
