"""Settling alignment ties by data flow.

A sequence diff on op keys finds *a* longest alignment, and often there are several of equal
length: two ``.item()`` calls on one logging line where the other run has one, a helper called
twice where the other run calls it once, a loop that runs one more iteration. Keys cannot tell
which of the equal-keyed ops corresponds, so the diff may pair the loss's ``.item()`` with the
weight norm's, and report two identical runs as diverged.

The data flow can tell. Ops correspond when they read the same thing: equal input contents, or
inputs produced by ops that are themselves aligned. So each *region* where the alignment could
have gone another way (a gap of unaligned ops and the aligned pairs next to it whose keys recur
in the gap) is re-aligned by a small weighted LCS: the most pairs first (never fewer than
before), then the pairs that agree best in data flow, then the original pairs.

Only regions holding an aligned pair whose outputs differ are re-aligned (elsewhere the pairing
already explains everything), and each is bounded in size, so this costs nothing on runs that
agree and stays local on runs that do not.
"""

from __future__ import annotations

from bisect import bisect_right
from collections.abc import Callable
from dataclasses import dataclass
from itertools import accumulate

from ...store import OpRecord
from ...store.light import LEVELS, OpColumns
from .myers import Run, runs_of

MAX_REGION = 256  # ops per side of one re-aligned region; larger ones keep the diff's pairs
MAX_RECORDS = 4096  # records decoded per step to settle ties; further regions keep theirs
# A region's pairs are chosen by weight: their count first, then how strict their keys are
# (as the diff's passes prefer), then their agreement in data flow, then the original pairs.
_MAX_AGREEMENT = 64  # |agreement| of one pair is clipped to this
_AGREEMENT = 1 << 4
_STRICT = (2 * _MAX_AGREEMENT + 2) * _AGREEMENT * MAX_REGION
_PAIR = 2 * LEVELS * _STRICT * MAX_REGION

Fetch = Callable[[int, int], OpRecord]  # (side: 0 for run A, 1 for run B, op index) -> record


@dataclass(frozen=True, slots=True)
class _Region:
    """Positions ``[a0, a1)`` of run A and ``[b0, b1)`` of run B, re-aligned on the keys of
    alignment level ``level``."""

    a0: int
    a1: int
    b0: int
    b1: int
    level: int


def settle(runs: list[Run], ops_a: OpColumns, ops_b: OpColumns, fetch: Fetch) -> list[Run]:
    """``runs`` (the aligned pairs of one step, as runs) with every tied region re-aligned by
    data flow; ``fetch`` decodes an op's record when a region needs it."""
    regions = _tied_regions(runs, ops_a, ops_b) if runs else []
    if not regions:
        return runs
    flow = _Flow(ops_a, ops_b, fetch, {i + k: j + k for i, j, n in runs for k in range(n)})
    budget = MAX_RECORDS
    for region in regions:
        size = (region.a1 - region.a0) + (region.b1 - region.b0)
        if size > budget:
            break
        budget -= size
        flow.realign(region)
    return runs_of(sorted(flow.settled.items()))


def _tied_regions(runs: list[Run], ops_a: OpColumns, ops_b: OpColumns) -> list[_Region]:
    """Each gap of unaligned ops, widened over the neighbouring aligned pairs whose key recurs
    in the gap, when the widened region holds a pair whose outputs differ. Keys are compared
    at the loosest level at which the pairs beside the gap were matched. Gaps lie only
    between runs, so a step without unaligned ops costs nothing here."""
    out_a, out_b = ops_a.outputs, ops_b.outputs
    starts = list(accumulate((n for _, _, n in runs), initial=0))  # pair number of each run
    total = starts[-1]

    def pair(p: int) -> tuple[int, int]:
        """Pair number ``p``; before the first, (-1, -1); after the last, the ends."""
        if p < 0:
            return (-1, -1)
        if p >= total:
            return (len(ops_a), len(ops_b))
        t = bisect_right(starts, p) - 1
        i, j, _ = runs[t]
        return (i + p - starts[t], j + p - starts[t])

    regions: list[_Region] = []
    for t in starts:  # the gap, if any, before pair t
        (pi, pj), (ni, nj) = pair(t - 1), pair(t)
        if ni - pi == 1 and nj - pj == 1:
            continue
        level = max(_level(ops_a, ops_b, *pair(k)) for k in (t - 1, t) if 0 <= k < total)
        key_a, key_b = ops_a.keys[level], ops_b.keys[level]
        gap = {key_a[i] for i in range(pi + 1, ni)} | {key_b[j] for j in range(pj + 1, nj)}
        lo = t - 1  # widened backwards over the pairs whose key recurs in the gap
        while lo >= 0 and key_a[pair(lo)[0]] in gap and t - lo <= MAX_REGION:
            lo -= 1
        hi = t  # and forwards
        while hi < total and key_a[pair(hi)[0]] in gap and hi - t <= MAX_REGION:
            hi += 1
        if all(out_a[i] == out_b[j] for i, j in map(pair, range(lo + 1, hi))):
            continue
        (a0, b0), (a1, b1) = pair(lo), pair(hi)
        region = _Region(a0 + 1, a1, b0 + 1, b1, level)
        if regions and regions[-1].a1 > region.a0:  # overlapping: one region
            last = regions.pop()
            region = _Region(last.a0, region.a1, last.b0, region.b1, max(last.level, level))
        if max(region.a1 - region.a0, region.b1 - region.b0) <= MAX_REGION:
            regions.append(region)
    return regions


def _level(ops_a: OpColumns, ops_b: OpColumns, i: int, j: int) -> int:
    """The strictest alignment level at which ops ``i`` of A and ``j`` of B have equal keys."""
    return next(
        (level for level in range(LEVELS) if ops_a.keys[level][i] == ops_b.keys[level][j]),
        LEVELS - 1,
    )


class _Flow:
    """The step's pairs as they are settled, and the data flow that settles them."""

    def __init__(
        self, ops_a: OpColumns, ops_b: OpColumns, fetch: Fetch, settled: dict[int, int]
    ) -> None:
        self.ops = (ops_a, ops_b)
        self.settled = settled  # position in A -> position in B
        self._fetch = fetch
        self._records: dict[tuple[int, int], OpRecord] = {}
        self._region = _Region(0, 0, 0, 0, 0)  # the region being re-aligned

    def record(self, side: int, position: int) -> OpRecord:
        found = self._records.get((side, position))
        if found is None:
            index = self.ops[side].index[position]
            found = self._records[(side, position)] = self._fetch(side, index)
        return found

    def realign(self, region: _Region) -> None:
        """Replaces the pairs of ``region`` by a weighted LCS on the keys of its level (see
        the module doc)."""
        self._region = region
        original = {i: j for i, j in self.settled.items() if region.a0 <= i < region.a1}
        (ops_a, ops_b) = self.ops
        key_a, key_b = ops_a.keys[region.level], ops_b.keys[region.level]
        rows = range(region.a0, region.a1)
        cols = range(region.b0, region.b1)
        # best[r][c]: the best weight aligning the first r ops of A's part with the first c
        # of B's.
        best = [[0] * (len(cols) + 1) for _ in range(len(rows) + 1)]
        weights: dict[tuple[int, int], int] = {}
        for r, i in enumerate(rows, 1):
            above, here = best[r - 1], best[r]
            for c, j in enumerate(cols, 1):
                value = max(above[c], here[c - 1])
                if key_a[i] == key_b[j]:
                    w = weights[(i, j)] = self._weight(i, j, original.get(i) == j)
                    value = max(value, above[c - 1] + w)
                here[c] = value
        for i in original:
            del self.settled[i]
        r, c = len(rows), len(cols)
        while r and c:
            i, j = rows[r - 1], cols[c - 1]
            pair = weights.get((i, j))
            if pair is not None and best[r][c] == best[r - 1][c - 1] + pair:
                self.settled[i] = j
                r, c = r - 1, c - 1
            elif best[r][c] == best[r - 1][c]:
                r -= 1
            else:
                c -= 1

    def _weight(self, i: int, j: int, original: bool) -> int:
        agree = self.agreement(self.record(0, i), self.record(1, j))
        if self.ops[0].outputs[i] == self.ops[1].outputs[j]:
            agree += 2  # equal outputs: the strongest sign that two ops correspond
        agree = max(-_MAX_AGREEMENT, min(_MAX_AGREEMENT, agree))
        strictness = LEVELS - 1 - _level(*self.ops, i, j)
        return _PAIR + strictness * _STRICT + agree * _AGREEMENT + (1 if original else 0)

    def agreement(self, a: OpRecord, b: OpRecord) -> int:
        """How well ops ``a`` and ``b`` agree in data flow: +1 for each input of equal content
        (or, when an earlier difference changed the content, whose producers are aligned with
        each other), -1 for each that disagrees or exists on one side only; likewise for each
        non-tensor argument."""
        score = 0
        theirs = {t.slot: t for t in b.inputs}
        for t in a.inputs:
            u = theirs.pop(t.slot, None)
            if u is None:
                score -= 1
                continue
            ka, kb = t.content_key(), u.content_key()
            if ka is None or kb is None:
                continue  # not read: says nothing
            if ka == kb:
                score += 1
            else:
                score += self._producers(t.producer, u.producer)
        score -= len(theirs)
        args_b = dict(b.args)
        for name, value in a.args:
            score += 1 if name in args_b and args_b.pop(name) == value else -1
        return score - len(args_b)

    def _producers(self, pa: tuple[int, int] | None, pb: tuple[int, int] | None) -> int:
        """+1 when two inputs of different content come from the same output of ops aligned
        outside the region being settled, 0 when a producer lies inside it (its partner is
        what is being decided) or outside the step, -1 otherwise."""
        if pa is None or pb is None:
            return -1
        (ops_a, ops_b), region = self.ops, self._region
        ia, ib = ops_a.position(pa[0]), ops_b.position(pb[0])
        if ia is None or ib is None:
            return 0
        if region.a0 <= ia < region.a1 or region.b0 <= ib < region.b1:
            return 0
        return 1 if pa[1] == pb[1] and self.settled.get(ia) == ib else -1
