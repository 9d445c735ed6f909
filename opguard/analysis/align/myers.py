"""Myers' O((N+M)·D) sequence diff, on integer keys.

Training traces are long and mostly equal, so the number of edits D is small and Myers is fast
where a quadratic LCS or difflib (which also treats frequent keys as junk) is not. A bound on D
keeps pathological inputs from taking quadratic time; the caller then falls back to a cheaper
matching.
"""

from __future__ import annotations

from collections.abc import Sequence


class TooManyEdits(Exception):
    """The sequences differ by more edits than the caller allowed."""


Run = tuple[int, int, int]  # (i, j, n): a[i + k] == b[j + k] matched for k < n

_STRIDE = 64  # elements compared at once (as slices) while looking for the common ends


def matching_blocks(a: Sequence[int], b: Sequence[int], max_edits: int) -> list[tuple[int, int]]:
    """Pairs (i, j) with a[i] == b[j] of a longest common subsequence, in increasing order."""
    return [(i + k, j + k) for i, j, n in matching_runs(a, b, max_edits) for k in range(n)]


def matching_runs(a: Sequence[int], b: Sequence[int], max_edits: int) -> list[Run]:
    """:func:`matching_blocks` as runs of consecutive pairs."""
    limit = min(len(a), len(b))
    prefix = 0
    while (
        prefix + _STRIDE <= limit and a[prefix : prefix + _STRIDE] == b[prefix : prefix + _STRIDE]
    ):
        prefix += _STRIDE
    while prefix < limit and a[prefix] == b[prefix]:
        prefix += 1
    suffix = 0
    end_a, end_b = len(a), len(b)
    while (
        suffix + _STRIDE <= limit - prefix
        and a[end_a - suffix - _STRIDE : end_a - suffix]
        == b[end_b - suffix - _STRIDE : end_b - suffix]
    ):
        suffix += _STRIDE
    while suffix < limit - prefix and a[end_a - 1 - suffix] == b[end_b - 1 - suffix]:
        suffix += 1
    runs: list[Run] = [(0, 0, prefix)] if prefix else []
    mid_a = a[prefix : end_a - suffix]
    mid_b = b[prefix : end_b - suffix]
    if mid_a and mid_b:
        runs.extend(
            (prefix + i, prefix + j, n) for i, j, n in runs_of(_myers(mid_a, mid_b, max_edits))
        )
    if suffix:
        runs.append((end_a - suffix, end_b - suffix, suffix))
    return runs


def runs_of(pairs: Sequence[tuple[int, int]]) -> list[Run]:
    """Increasing pairs grouped into runs of consecutive ones."""
    runs: list[Run] = []
    for i, j in pairs:
        if runs:
            ri, rj, n = runs[-1]
            if ri + n == i and rj + n == j:
                runs[-1] = (ri, rj, n + 1)
                continue
        runs.append((i, j, 1))
    return runs


def _myers(a: Sequence[int], b: Sequence[int], max_edits: int) -> list[tuple[int, int]]:
    n, m = len(a), len(b)
    offset = n + m
    v = [0] * (2 * offset + 2)
    trace: list[list[int]] = []
    for d in range(min(n + m, max_edits) + 1):
        trace.append(v[offset - d : offset + d + 1] if d else [v[offset]])
        for k in range(-d, d + 1, 2):
            if k == -d or (k != d and v[offset + k - 1] < v[offset + k + 1]):
                x = v[offset + k + 1]
            else:
                x = v[offset + k - 1] + 1
            y = x - k
            while x < n and y < m and a[x] == b[y]:
                x += 1
                y += 1
            v[offset + k] = x
            if x >= n and y >= m:
                return _backtrack(trace, a, b, d, k, offset, v)
    raise TooManyEdits(f"more than {max_edits} edits")


def _backtrack(
    trace: list[list[int]],
    a: Sequence[int],
    b: Sequence[int],
    d_end: int,
    k_end: int,
    offset: int,
    v_last: list[int],
) -> list[tuple[int, int]]:
    """Walks the saved frontiers back from the end, collecting the diagonal (matching) runs."""
    pairs: list[tuple[int, int]] = []
    x, y = len(a), len(b)
    k = k_end
    for d in range(d_end, 0, -1):
        prev = trace[d]  # the frontier step d started from, stored for k in [-d, d]

        def at(kk: int, prev: list[int] = prev, d: int = d) -> int:
            return prev[kk + d]

        if k == -d or (k != d and at(k - 1) < at(k + 1)):
            prev_k = k + 1
            start_x = at(prev_k)
            start_y = start_x - prev_k
            mid_x, mid_y = start_x, start_y + 1  # insertion from b
        else:
            prev_k = k - 1
            start_x = at(prev_k)
            start_y = start_x - prev_k
            mid_x, mid_y = start_x + 1, start_y  # deletion from a
        while x > mid_x and y > mid_y:
            x -= 1
            y -= 1
            pairs.append((x, y))
        x, y, k = start_x, start_y, prev_k
    while x > 0 and y > 0:
        x -= 1
        y -= 1
        pairs.append((x, y))
    pairs.reverse()
    return pairs
