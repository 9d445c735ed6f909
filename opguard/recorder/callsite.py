"""Finding the user's call site of an op: the innermost frame outside torch, the standard
library and OpGuard, plus the interned user stack above it."""

from __future__ import annotations

import linecache
import os
import sys
import sysconfig
from types import FrameType

import torch

from ..store.writer import TraceWriter

SOURCE_CONTEXT = 3  # lines kept on each side of a call line, so traces explain themselves


_OPGUARD_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _library_roots() -> tuple[str, ...]:
    """Code that is never the user's: torch, the standard library, OpGuard itself and the
    interpreter's console-script wrappers (``bin/opguard``)."""
    paths = sysconfig.get_paths()
    roots = {
        os.path.dirname(torch.__file__),
        _OPGUARD_ROOT,
        paths["stdlib"],
        paths["platstdlib"],
        paths["scripts"],
    }
    return tuple(os.path.realpath(r) + os.sep for r in roots)


# OpGuard's bundled example scripts are user code, although they live in the package.
_USER_ROOTS = (os.path.realpath(os.path.join(_OPGUARD_ROOT, "demo")) + os.sep,)


class CallSites:
    """Interns call sites and stacks into a trace; caches which files count as user code."""

    def __init__(self, writer: TraceWriter) -> None:
        self._writer = writer
        self._roots = _library_roots()
        self._is_user: dict[str, bool] = {}

    def _user_file(self, filename: str) -> bool:
        user = self._is_user.get(filename)
        if user is None:
            if filename.startswith("<frozen") or filename.startswith("<__array_function__"):
                user = False
            else:
                real = os.path.realpath(filename) if os.path.isabs(filename) else filename
                user = real.startswith(_USER_ROOTS) or not real.startswith(self._roots)
            self._is_user[filename] = user
        return user

    def _site_id(self, filename: str, line: int, function: str) -> int:
        return self._writer.intern_site(
            (filename, line, function), lambda: _site_payload(filename, line, function)
        )

    def capture(self, frame: FrameType | None = None) -> tuple[int, int] | None:
        """(call-site id, stack id) of the current Python stack, or None if no user frame."""
        f: FrameType | None = frame if frame is not None else sys._getframe(1)
        sites: list[int] = []
        while f is not None:
            code = f.f_code
            if self._user_file(code.co_filename):
                sites.append(self._site_id(code.co_filename, f.f_lineno or 0, code.co_name))
            f = f.f_back
        if not sites:
            return None
        sites.reverse()  # outermost first
        stack = tuple(sites)
        return sites[-1], self._writer.intern_stack(stack, lambda: list(stack))


def _site_payload(filename: str, line: int, function: str) -> list[object]:
    lines = linecache.getlines(filename)
    lo = max(1, line - SOURCE_CONTEXT)
    hi = min(len(lines), line + SOURCE_CONTEXT)
    source = [[n, lines[n - 1].rstrip("\n")] for n in range(lo, hi + 1)]
    return [filename, line, function, source]
