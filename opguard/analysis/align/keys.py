"""An op's alignment keys: what must match for two runs' ops to pair, at each relaxation level.

Alignment passes, strictest first: op, phase, call site and input signature; then op, phase
and input signature (the code moved or was edited); then op and phase alone (shapes or dtypes
changed). A function-name level was tried and dropped: names like ``forward`` are shared by
most of a model, so matching on them anchored unrelated ops.

The call site in the strictest key is the *source text* of the call line (comments and spacing
dropped) and its function, not the file name and line number: the two runs are usually two
versions of a script (``train.py`` and ``train_v2.py``, or one file edited above the loop), so
file names differ and lines shift, while the text of unchanged lines stays the same. Sites
without readable source fall back to file name and line. The store's
:class:`~opguard.store.light.LightReader` asks :class:`OpKeys` for an op's keys.
"""

from __future__ import annotations

import io
import tokenize
from typing import Any

from ...store import RankTrace
from ...store.records import CallSite


class KeyTable:
    """Interns key tuples to small ints shared by both traces, so comparisons are int
    comparisons in the diff's inner loop."""

    def __init__(self) -> None:
        self._ids: dict[tuple, int] = {}

    def __call__(self, key: tuple) -> int:
        ident = self._ids.get(key)
        if ident is None:
            ident = self._ids[key] = len(self._ids)
        return ident


class OpKeys:
    """A trace's key function: an op's key at each level, interned in a table both traces
    share. The call site is :func:`site_key` (its source text); the input signature is each
    input's dtype and shape."""

    def __init__(self, trace: RankTrace, table: KeyTable) -> None:
        self._table = table
        self._names = trace.op_names
        self._sites = {ident: site_key(site) for ident, site in trace.sites.items()}

    def __call__(self, raw: dict[str, Any]) -> tuple[int, int, int]:
        name = self._names.get(raw["o"], "?")
        phase = raw.get("p", 3)
        site = self._sites.get(raw.get("c", -1), ("?", "?", 0))
        signature = self.signature(raw.get("x", ()))
        table = self._table
        return (
            table((name, phase, site, signature)),
            table((name, phase, signature)),
            table((name, phase)),
        )

    def signature(self, inputs: Any) -> tuple:
        """The inputs' part of the keys: dtype and shape of each (across parallel layouts,
        :class:`~.layouts.LayoutKeys` keys shapes by their rank alone)."""
        return tuple((x.get("d"), tuple(x.get("s", ()))) for x in inputs)


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
