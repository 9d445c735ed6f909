"""Light views of ops for alignment: their keys at each relaxation level and output content.

Built straight from the stored msgpack maps (no full decode), because the diff reads every op
of both traces.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..store import RankTrace, schema

# Alignment passes, strictest first: op, phase, call site (file, function, line) and input
# signature; then op, phase and input signature (the code moved or was edited); then op and
# phase alone (shapes or dtypes changed). A function-name level was tried and dropped: names
# like ``forward`` are shared by most of a model, so matching on them anchored unrelated ops.
LEVELS = 3


@dataclass(frozen=True, slots=True)
class LightOp:
    index: int
    step: int
    keys: tuple[int, ...]  # one interned key per level
    outputs: tuple[Any, ...]  # content keys of the outputs, then the returned scalar


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


def _content(entry: dict[str, Any]) -> tuple:
    flags = entry.get("f", 0)
    shape = tuple(entry.get("s", ()))
    dtype = entry.get("d")
    if flags & schema.FLAG_UNINITIALIZED:
        return ("uninitialized", dtype, shape)
    if flags & schema.FLAG_VIEW:
        return ("view", dtype, shape)  # a view's data is its base's, compared where it is read
    return (dtype, shape, entry.get("h"))


class LightReader:
    """Turns one trace's raw ops into :class:`LightOp` with keys from a shared table."""

    def __init__(self, trace: RankTrace, table: KeyTable) -> None:
        self.trace = trace
        self._table = table
        self._names = trace.op_names
        self._sites = {
            ident: (site.file.rsplit("/", 1)[-1], site.function, site.line)
            for ident, site in trace.sites.items()
        }

    def light(self, raw: dict[str, Any]) -> LightOp:
        name = self._names.get(raw["o"], "?")
        phase = raw.get("p", 3)
        site = self._sites.get(raw.get("c", -1), ("?", "?", 0))
        signature = tuple((x.get("d"), tuple(x.get("s", ()))) for x in raw.get("x", ()))
        table = self._table
        keys = (
            table((name, phase, site, signature)),
            table((name, phase, signature)),
            table((name, phase)),
        )
        outputs = tuple(_content(y) for y in raw.get("y", ()))
        if "v" in raw:
            outputs += (("value", _hashable(raw["v"])),)
        return LightOp(raw["i"], raw.get("s", 0), keys, outputs)


def _hashable(value: Any) -> Any:
    if isinstance(value, list):
        return tuple(_hashable(v) for v in value)
    if isinstance(value, dict):
        return tuple(sorted((k, _hashable(v)) for k, v in value.items()))
    return value
