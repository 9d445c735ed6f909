"""Finding the user's call site of an op: the innermost frame outside torch, the standard
library and OpGuard, plus the interned user stack above it."""

from __future__ import annotations

import linecache
import os
import site
import sysconfig
from collections.abc import Callable
from types import CodeType, FrameType

import torch

from .. import _C
from ..store.writer import TraceWriter

SOURCE_CONTEXT = 3  # lines kept on each side of a call line, so traces explain themselves


_OPGUARD_ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _roots(*paths: str) -> tuple[str, ...]:
    return tuple(os.path.realpath(p) + os.sep for p in paths if p)


def _classifier() -> list[tuple[tuple[str, ...], bool]]:
    """Ordered (path prefixes, is user code) rules; the first match decides, else user code.

    OpGuard's bundled examples are user code; torch and OpGuard never are; installed libraries
    (site-packages: transformers, timm…) are, because their code is what users call and change
    through configs; the standard library and the interpreter's console scripts
    (``bin/opguard``) are not. Site-packages is checked before the standard library because it
    usually lies inside it (``<venv>/lib/pythonX.Y/site-packages``)."""
    paths = sysconfig.get_paths()
    return [
        (_roots(os.path.join(_OPGUARD_ROOT, "demo")), True),
        (_roots(os.path.dirname(torch.__file__), _OPGUARD_ROOT), False),
        (site_packages(), True),
        (_roots(paths["stdlib"], paths["platstdlib"], paths["scripts"]), False),
    ]


def site_packages() -> tuple[str, ...]:
    """The directories installed packages live in (each ending in a separator)."""
    paths = sysconfig.get_paths()
    packages = {paths["purelib"], paths["platlib"], *site.getsitepackages()}
    if site.ENABLE_USER_SITE:
        packages.add(site.getusersitepackages())
    return _roots(*packages)


class CallSites:
    """Interns call sites and stacks into a trace. Runs for every forward op over the whole
    Python stack, which the native ``StackWalker`` walks, asking this class only the first time
    it meets a code object (user code or not?) or an instruction in user code (its site id),
    and the writer only the first time it meets a stack (its id)."""

    def __init__(self, writer: TraceWriter, launcher: frozenset[CodeType] = frozenset()) -> None:
        """``launcher``: the code beneath the recorded program (:func:`code_beneath`), never
        a call site whatever its file."""
        self._writer = writer
        self._launcher = launcher
        self._rules = _classifier()
        self._locations: dict[int, tuple[str, int]] = {}  # site id -> (file, line)
        self.walker = _C.StackWalker(self._is_user_code, self._site_id, writer.intern_stack)
        # capture(start=None) -> (call-site id, stack id) of the Python stack from frame
        # ``start`` outwards (the caller's when None), or None if no frame on it is user code.
        # Passing the frame that ran the op saves the walk a frame object per recorder frame
        # above it. The native method itself: one Python call less per op.
        self.capture: Callable[[FrameType | None], tuple[int, int] | None] = self.walker.capture

    def _is_user_code(self, code: CodeType) -> bool:
        return code not in self._launcher and self.is_user_file(code.co_filename)

    def is_user_file(self, filename: str) -> bool:
        """Whether code in ``filename`` is the user's (its frames can be call sites)."""
        if filename.startswith("<frozen") or filename.startswith("<__array_function__"):
            return False
        real = os.path.realpath(filename) if os.path.isabs(filename) else filename
        if generated_by_inductor(real):
            return False
        return next((u for prefixes, u in self._rules if real.startswith(prefixes)), True)

    def _site_id(self, frame: FrameType) -> int:
        code, line = frame.f_code, frame.f_lineno or 0
        ident = self.site_id(code.co_filename, line, code.co_name)
        self._locations[ident] = (code.co_filename, line)
        return ident

    def site_id(self, filename: str, line: int, function: str) -> int:
        """The id of a call site in the trace, interned with the source around it."""
        return self._writer.intern_site(
            (filename, line, function), lambda: _site_payload(filename, line, function)
        )

    def location(self, ident: int) -> tuple[str, int] | None:
        """(file, line) of an interned call site."""
        return self._locations.get(ident)

    def files(self) -> set[str]:
        """The files of every call site interned so far."""
        return {file for file, _ in self._locations.values()}


def code_beneath(frame: FrameType | None) -> frozenset[CodeType]:
    """The code of ``frame`` and of every frame beneath it: where ``opguard record`` runs the
    program from, beneath every op it records. OpGuard's own and the interpreter's are never
    call sites anyway; a harness that runs OpGuard's command line in its own Python code is
    not the recorded program either (else its file would be the outermost user code of every
    stack, the script each op is said to be reached from)."""
    codes = set()
    while frame is not None:
        codes.add(frame.f_code)
        frame = frame.f_back
    return frozenset(codes)


def generated_by_inductor(path: str) -> bool:
    """Inductor's generated wrapper modules (compiled regions) live in its cache directory,
    outside torch, and are torch's code. Inductor sets ``TORCHINDUCTOR_CACHE_DIR`` the first
    time it uses its cache, before any generated code can run."""
    cache = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    return cache is not None and path.startswith(os.path.realpath(cache) + os.sep)


def _site_payload(filename: str, line: int, function: str) -> list[object]:
    lines = linecache.getlines(filename)
    lo = max(1, line - SOURCE_CONTEXT)
    hi = min(len(lines), line + SOURCE_CONTEXT)
    source = [[n, lines[n - 1].rstrip("\n")] for n in range(lo, hi + 1)]
    return [filename, line, function, source]
