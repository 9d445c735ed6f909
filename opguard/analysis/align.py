"""Aligning two op sequences: a real sequence diff, then relaxed keys for what is left.

The first pass matches ops on the strictest key (op, phase, call site, input signature) with
Myers' diff; each gap between matched ops is then re-aligned on the next, looser key, as the
best trace-comparison tools do in passes. Ops left over are "only in A" / "only in B".
"""

from __future__ import annotations

from collections.abc import Sequence

from .keys import LEVELS, LightOp
from .myers import TooManyEdits, matching_blocks

MAX_EDITS = 2000  # per gap and level; beyond this a windowed greedy matching takes over
GREEDY_WINDOW = 64

Pair = tuple[int | None, int | None]  # (position in A, position in B); None: unaligned


def align(a: Sequence[LightOp], b: Sequence[LightOp]) -> list[tuple[int, int]]:
    """Matched (position in a, position in b) pairs, increasing in both."""
    return _align(a, b, 0)


def _align(a: Sequence[LightOp], b: Sequence[LightOp], level: int) -> list[tuple[int, int]]:
    if not a or not b:
        return []
    ka = [op.keys[level] for op in a]
    kb = [op.keys[level] for op in b]
    try:
        matched = matching_blocks(ka, kb, MAX_EDITS)
    except TooManyEdits:
        matched = _greedy(ka, kb)
    if level + 1 >= LEVELS:
        return matched
    pairs: list[tuple[int, int]] = []
    prev_i, prev_j = 0, 0
    for i, j in [*matched, (len(a), len(b))]:
        if i > prev_i and j > prev_j:  # a gap on both sides: try looser keys inside it
            pairs.extend(
                (prev_i + x, prev_j + y) for x, y in _align(a[prev_i:i], b[prev_j:j], level + 1)
            )
        if i < len(a):
            pairs.append((i, j))
        prev_i, prev_j = i + 1, j + 1
    return pairs


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
