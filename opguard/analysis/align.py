"""Aligning two op sequences: a real sequence diff, then relaxed keys for what is left.

The first pass matches ops on the strictest key (op, phase, call site, input signature) with
Myers' diff; each gap between matched ops is then re-aligned on the next, looser key, as the
best trace-comparison tools do in passes. Ops left over are "only in A" / "only in B".

The call site in the strictest key is the *source text* of the call line (comments and spacing
dropped) and its function, not the file name and line number: the two runs are usually two
versions of a script (``train.py`` and ``train_v2.py``, or one file edited above the loop), so
file names differ and lines shift, while the text of unchanged lines stays the same. Sites
without readable source fall back to file name and line.
"""

from __future__ import annotations

import io
import tokenize
from collections.abc import Sequence

from ..store import CallSite, RankTrace
from .keys import LEVELS, KeyTable, LightOp, LightReader
from .myers import TooManyEdits, matching_blocks

MAX_EDITS = 2000  # per gap and level; beyond this a windowed greedy matching takes over
GREEDY_WINDOW = 64

Pair = tuple[int | None, int | None]  # (position in A, position in B); None: unaligned


def normalized_source(line: str) -> str:
    """A source line as its tokens: comments, indentation and spacing do not count."""
    tokens: list[str] = []
    skip = (
        tokenize.COMMENT,
        tokenize.NL,
        tokenize.NEWLINE,
        tokenize.INDENT,
        tokenize.DEDENT,
        tokenize.ENDMARKER,
    )
    try:
        for tok in tokenize.generate_tokens(io.StringIO(line.strip() + "\n").readline):
            if tok.type not in skip:
                tokens.append(tok.string)
    except (tokenize.TokenError, SyntaxError):
        pass  # a line of a longer statement: the tokens read so far
    return " ".join(tokens) if tokens else line.strip()


def site_key(site: CallSite) -> tuple[str, str, int]:
    """What identifies a call site across two versions of a script (see the module doc)."""
    text = site.source_line()
    if text:
        return (site.function, normalized_source(text), 0)
    return (f"{site.file.rsplit('/', 1)[-1]}:{site.function}", "", site.line)


class AlignReader(LightReader):
    """:class:`LightReader` whose call-site key is :func:`site_key`."""

    def __init__(self, trace: RankTrace, table: KeyTable) -> None:
        super().__init__(trace, table)
        self._sites = {ident: site_key(site) for ident, site in trace.sites.items()}


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
