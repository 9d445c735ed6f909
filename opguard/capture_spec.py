"""Which ops ``opguard record --capture SPEC`` stores in full, and how much it may store.

A SPEC is a comma-separated list of items, each choosing ops of every rank:

- ``812``: the op with that index; ``800-820``: a range, both ends included;
- ``aten::addmm.default``: every op of that overload; ``aten::addmm``: of any overload;
- ``train.py:42``: every op called from that line (a file name, or the end of a path; backward
  ops count at the line of the forward op they differentiate).

Torch-free: the ``capture`` command builds specs without loading the recorder.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass

DEFAULT_LIMIT = 256 << 20

_RANGE = re.compile(r"^(\d+)-(\d+)$")
_SITE = re.compile(r"^(.+):(\d+)$")
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:[eE][0-9]+)?)\s*([KMGT]i?B?|B)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12}


class SpecError(ValueError):
    """A SPEC or size that cannot be read (the CLI reports it as one line, exit 2)."""


@dataclass(frozen=True)
class CaptureSpec:
    indices: frozenset[int] = frozenset()
    ranges: tuple[tuple[int, int], ...] = ()
    names: frozenset[str] = frozenset()  # exact overloads, "aten::addmm.default"
    packets: frozenset[str] = frozenset()  # any overload, "aten::addmm"
    sites: tuple[tuple[str, int], ...] = ()  # (file name or path suffix, line)
    text: str = ""

    @classmethod
    def parse(cls, text: str) -> CaptureSpec:
        indices: set[int] = set()
        ranges: list[tuple[int, int]] = []
        names: set[str] = set()
        packets: set[str] = set()
        sites: list[tuple[str, int]] = []
        items = [item.strip() for item in text.split(",") if item.strip()]
        if not items:
            raise SpecError("--capture needs at least one op index, range, op name or call site")
        for item in items:
            if item.isdigit():
                indices.add(int(item))
            elif match := _RANGE.match(item):
                lo, hi = int(match[1]), int(match[2])
                if hi < lo:
                    raise SpecError(f"capture range {item}: the end comes before the start")
                ranges.append((lo, hi))
            elif "::" in item:
                (names if "." in item.partition("::")[2] else packets).add(item)
            elif match := _SITE.match(item):
                sites.append((match[1], int(match[2])))
            else:
                raise SpecError(
                    f"cannot read capture item {item!r}: expected an op index (812), a range "
                    "(800-820), an op name (aten::addmm.default) or a call site (train.py:42)"
                )
        return cls(
            frozenset(indices),
            tuple(ranges),
            frozenset(names),
            frozenset(packets),
            tuple(sites),
            ",".join(items),
        )

    @classmethod
    def of_indices(cls, indices: Iterable[int]) -> CaptureSpec:
        """The shortest SPEC for these op indices (consecutive runs become ranges)."""
        ordered = sorted(set(indices))
        items: list[str] = []
        start = 0
        for k in range(1, len(ordered) + 1):
            if k == len(ordered) or ordered[k] != ordered[k - 1] + 1:
                lo, hi = ordered[start], ordered[k - 1]
                items.append(str(lo) if lo == hi else f"{lo}-{hi}")
                start = k
        return cls.parse(",".join(items))

    @property
    def uses_sites(self) -> bool:
        return bool(self.sites)

    def matches(
        self, index: int, name: str, site: Callable[[], tuple[str, int] | None] | None = None
    ) -> bool:
        """Whether op ``index`` named ``name`` is captured; ``site`` gives its call site (file,
        line), asked only when the SPEC names sites (it costs a look at the stack)."""
        if index in self.indices or any(lo <= index <= hi for lo, hi in self.ranges):
            return True
        if name in self.names or name.rpartition(".")[0] in self.packets:
            return True
        if self.sites and site is not None:
            where = site()
            if where is not None:
                return any(_same_site(where, wanted) for wanted in self.sites)
        return False


def _same_site(where: tuple[str, int], wanted: tuple[str, int]) -> bool:
    path, line = where
    name, wanted_line = wanted
    return line == wanted_line and (path == name or path.endswith("/" + name.lstrip("/")))


def parse_size(text: str) -> int:
    """``256MiB``, ``1GiB``, ``500MB``, ``1e9``: a byte count (binary units with ``i``)."""
    match = _SIZE.match(text)
    if match is None:
        raise SpecError(f"cannot read size {text!r} (examples: 256MiB, 1GiB, 500MB)")
    number, unit = float(match[1]), (match[2] or "").lower()
    binary = "i" in unit
    unit = unit.replace("i", "").replace("b", "") if unit != "b" else ""
    scale = 1024 ** ("kmgt".index(unit) + 1) if binary and unit else _UNITS[unit]
    return int(number * scale)


def format_size(nbytes: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if nbytes >= scale:
            return f"{nbytes / scale:.1f} {unit}"
    return f"{nbytes} B"
