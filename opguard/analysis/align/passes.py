"""Aligning two op sequences: a real sequence diff, then relaxed keys for what is left.

The first pass matches ops on the strictest key (op, phase, call site, input signature) with
Myers' diff; each gap between matched ops is then re-aligned on the next, looser key, as the
best trace-comparison tools do in passes. Ops left over are "only in A" / "only in B".

What the keys hold is :mod:`.keys`'s.
"""

from __future__ import annotations

from collections.abc import Sequence

from ...store import RankTrace
from ...store.light import LEVELS, LightOp, OpColumns
from .myers import Run, TooManyEdits, matching_runs, runs_of
from .ties import Fetch, settle

MAX_EDITS = 2000  # per gap and level; beyond this a windowed greedy matching takes over
GREEDY_WINDOW = 64

Pair = tuple[int | None, int | None]  # (position in A, position in B); None: unaligned
Levels = Sequence[Sequence[int]]  # alignment keys of a sequence of ops, one sequence per level


def records_of(trace_a: RankTrace, trace_b: RankTrace) -> Fetch:
    """A :data:`~.ties.Fetch` over two traces: run A is side 0, run B side 1."""
    traces = (trace_a, trace_b)
    return lambda side, index: traces[side].op(index)


def columns_of(ops: Sequence[LightOp]) -> OpColumns:
    """Light ops of one step as the columns :func:`align_step` reads."""
    return OpColumns(
        ops[0].step if ops else 0,
        [op.index for op in ops],
        tuple([op.keys[level] for op in ops] for level in range(LEVELS)),
        [op.outputs for op in ops],
    )


def align_step(ops_a: OpColumns, ops_b: OpColumns, fetch: Fetch) -> list[Run]:
    """The aligned pairs of one step of two runs, as runs: keys first (:func:`align_keys`),
    then ties between equally long alignments settled by data flow (:mod:`.ties`, which
    decodes records through ``fetch`` only where a tie hides a difference). Every view of
    the alignment (the diff's walk, the TUI's rows, an op's partner) comes from here."""
    return settle(align_keys(ops_a.keys, ops_b.keys), ops_a, ops_b, fetch)


def align_keys(a: Levels, b: Levels) -> list[Run]:
    """:func:`_align` on keys given per level (as :class:`~opguard.store.light.OpColumns`
    holds them), as runs of consecutive matched pairs: (i, j, n) matches a[i + k] with
    b[j + k] for k < n."""
    return _align(a, b, 0)


def pairs_of(runs: Sequence[Run]) -> list[tuple[int, int]]:
    return [(i + k, j + k) for i, j, n in runs for k in range(n)]


def _align(a: Levels, b: Levels, level: int) -> list[Run]:
    ka, kb = a[level], b[level]
    if not ka or not kb:
        return []
    try:
        matched = matching_runs(ka, kb, MAX_EDITS)
    except TooManyEdits:
        matched = runs_of(_greedy(ka, kb))
    if level + 1 >= LEVELS:
        return matched
    runs: list[Run] = []
    prev_i, prev_j = 0, 0
    for i, j, n in [*matched, (len(ka), len(kb), 0)]:
        if i > prev_i and j > prev_j:  # a gap on both sides: try looser keys inside it
            gap_a = [keys[prev_i:i] for keys in a]
            gap_b = [keys[prev_j:j] for keys in b]
            runs.extend((prev_i + x, prev_j + y, m) for x, y, m in _align(gap_a, gap_b, level + 1))
        if n:
            runs.append((i, j, n))
        prev_i, prev_j = i + n, j + n
    return runs


def _greedy(ka: Sequence[int], kb: Sequence[int]) -> list[tuple[int, int]]:
    """In-order matching that looks a bounded distance ahead in B: linear time, not minimal."""
    pairs: list[tuple[int, int]] = []
    j = 0
    for i, key in enumerate(ka):
        for look in range(j, min(len(kb), j + GREEDY_WINDOW)):
            if kb[look] == key:
                pairs.append((i, look))
                j = look + 1
                break
    return pairs


def merge(n_a: int, n_b: int, pairs: Sequence[tuple[int, int]]) -> list[Pair]:
    """Both sequences interleaved in execution order: unaligned ops of A, then of B, before
    each matched pair."""
    merged: list[Pair] = []
    i = j = 0
    for pi, pj in [*pairs, (n_a, n_b)]:
        merged.extend((x, None) for x in range(i, pi))
        merged.extend((None, y) for y in range(j, pj))
        if pi < n_a and pj < n_b:
            merged.append((pi, pj))
        i, j = pi + 1, pj + 1
    return merged
