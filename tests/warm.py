"""Python commands of the tests run in a fork of a process that has imported torch already.

A test that records a script as a user would (``python -m opguard record -- train.py``) starts a
Python that imports torch and, at its optimizer's first step, ``torch._dynamo``: 3–4 s of CPU
before the script's first line, most of the test suite's time. :func:`run` and :class:`Popen`
take the same command lines as :mod:`subprocess` (``[sys.executable, "-m", MODULE, ARGS…]`` or
``[sys.executable, SCRIPT, ARGS…]``) and run each in a process of its own, with its working
directory, environment, ``sys.argv``, ``sys.path``, standard streams and exit status as a fresh
interpreter would have them, but forked from a server (:mod:`multiprocessing`'s forkserver,
one per test worker) that imported torch once.

What a fresh interpreter would do differently, and how it is made the same:

- torch read the environment when it was imported: the command's ``OMP_NUM_THREADS`` is
  applied with ``torch.set_num_threads``; no other import-time variable is (a test that needs
  one runs the command with :mod:`subprocess`, as does one that asks which modules a command
  imports);
- the server's standard streams: replaced by the command's (``PYTHONUNBUFFERED`` honoured);
- ``multiprocessing`` sees a child process, not a daemon: it may start processes of its own
  (nothing else in OpGuard or torch asks);
- interpreter exit: threading's shutdown (its exit callbacks, then non-daemon threads joined)
  and the ``atexit`` handlers run, as at the end of ``python``, before the process exits with
  the command's status (a thread pool a module still holds, as Inductor's, ends as there);
- the frames beneath the command (the forkserver's, this module's): ``opguard record`` takes
  none beneath its launcher for a call site (``opguard.recorder.callsite.code_beneath``), and a
  script's traceback is printed from the script's own frame.

Output goes to files, read when the process has ended (:meth:`Popen.communicate`), or its first
line once it is written (:meth:`Popen.first_line`). ``OPGUARD_TESTS_COLD=1`` starts every
command with :mod:`subprocess` instead (into the same files), for comparison or when something
here is in doubt.
"""

from __future__ import annotations

import atexit
import contextlib
import io
import multiprocessing
import multiprocessing.connection
import os
import runpy
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Sequence
from pathlib import Path

PRELOAD = ("torch", "torch._dynamo")  # what every command would import first, and slowly
COLD = os.environ.get("OPGUARD_TESTS_COLD") == "1"

_context: multiprocessing.context.ForkServerContext | None = None
_starting = threading.Lock()
# multiprocessing's bookkeeping of children is not thread-safe: start() polls every child of the
# process (its _cleanup), and a child polled by two threads at once has its exit status read by
# one and end-of-file by the other, which takes it for 255. Every start and poll holds this.
_children = threading.Lock()
_fresh_path: list[str] = []  # sys.path of `python` with no PYTHONPATH, less its first entry


def _server() -> multiprocessing.context.ForkServerContext:
    global _context
    with _starting:
        if _context is None:
            _fresh_path[:] = _interpreter_path()
            context = multiprocessing.get_context("forkserver")
            context.set_forkserver_preload(list(PRELOAD))
            _context = context
        return _context


def _interpreter_path() -> list[str]:
    """The ``sys.path`` a fresh ``python`` starts with after its first entry (the script's
    directory or the working directory), without any ``PYTHONPATH``."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    code = "import sys; print(repr(sys.path[1:]))"
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True)
    path: list[str] = eval(done.stdout)  # a list of strings, printed by repr
    return path


def _target(args: Sequence[str]) -> tuple[str, str, list[str]] | None:
    """``("module" | "script", NAME, ARGS)`` for a command this module can run, else None."""
    if not args or args[0] != sys.executable or len(args) < 2:
        return None
    if args[1] == "-m" and len(args) > 2:
        return "module", args[2], list(args[3:])
    if not args[1].startswith("-"):
        return "script", args[1], list(args[2:])
    return None


class Popen:
    """A started command whose stdout and stderr go to files, read as text: what a test calls
    on a :class:`subprocess.Popen` (``pid``, ``poll``, ``wait``, ``communicate``,
    ``send_signal``, ``terminate``, ``kill``, ``returncode``), and :meth:`first_line`. Forked
    from the warm server where the command is one it runs, else started by :mod:`subprocess`
    (``OPGUARD_TESTS_COLD=1``: always)."""

    def __init__(
        self,
        args: Sequence[str],
        *,
        cwd: str | os.PathLike[str] | None = None,
        env: dict[str, str] | None = None,
    ) -> None:
        self.args = list(args)
        self.returncode: int | None = None
        self._dir = Path(tempfile.mkdtemp(prefix="warm-"))
        self._streams = (self._dir / "stdout", self._dir / "stderr")
        for stream in self._streams:
            stream.touch()  # read from the start (first_line), before the command writes
        where, environment = str(cwd or os.getcwd()), dict(os.environ if env is None else env)
        target = None if COLD else _target(args)
        self._forked: multiprocessing.process.BaseProcess | None = None
        self._started: subprocess.Popen[bytes] | None = None
        if target is not None:
            self._forked = _server().Process(
                target=_run_command,
                args=(*target, where, environment, _fresh_path, *map(str, self._streams)),
            )
            with _children:
                self._forked.start()
            self.pid: int = self._forked.pid or 0
        else:
            with self._streams[0].open("wb") as out, self._streams[1].open("wb") as err:
                self._started = subprocess.Popen(
                    self.args, cwd=where, env=environment, stdout=out, stderr=err
                )
            self.pid = self._started.pid

    def poll(self) -> int | None:
        if self.returncode is None:
            if self._started is not None:
                self.returncode = self._started.poll()
            elif self._forked is not None:
                with _children:
                    if not self._forked.is_alive():
                        self._forked.join()
                        self.returncode = self._forked.exitcode
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self._started is not None:
            self._started.wait(timeout)
        elif self._forked is not None:  # its end awaited without polling it (see _children)
            multiprocessing.connection.wait([self._forked.sentinel], timeout)
        if self.poll() is None:
            raise subprocess.TimeoutExpired(self.args, timeout or 0)
        assert self.returncode is not None
        return self.returncode

    def first_line(self, timeout: float) -> str:
        """The first line the command writes to stdout, once it has (``''`` if it ends
        without one): what a test waits for before signalling a run under way. Its stdout
        must be unbuffered (``PYTHONUNBUFFERED=1``) for the line to arrive as it is printed."""
        deadline = time.monotonic() + timeout
        while True:
            text = self._streams[0].read_text(errors="replace")
            if "\n" in text:
                return text.split("\n", 1)[0] + "\n"
            if self.poll() is not None:
                return self._streams[0].read_text(errors="replace")
            if time.monotonic() > deadline:
                raise subprocess.TimeoutExpired(self.args, timeout)
            time.sleep(0.005)

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        """The command's whole stdout and stderr once it has ended (``TimeoutExpired`` if it
        runs past ``timeout``; it keeps running, as with :mod:`subprocess`)."""
        self.wait(timeout)
        out, err = (stream.read_text(errors="replace") for stream in self._streams)
        shutil.rmtree(self._dir, ignore_errors=True)
        return out, err

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


def run(
    args: Sequence[str],
    *,
    cwd: str | os.PathLike[str] | None = None,
    env: dict[str, str] | None = None,
    timeout: float | None = None,
) -> subprocess.CompletedProcess[str]:
    """``subprocess.run(args, cwd=…, env=…, timeout=…, capture_output=True, text=True)``,
    forked from the warm server where the command is one it runs (:class:`Popen`)."""
    process = Popen(args, cwd=cwd, env=env)
    try:
        out, err = process.communicate(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait()
        raise
    assert process.returncode is not None
    return subprocess.CompletedProcess(list(args), process.returncode, out, err)


# -- in the forked process ----------------------------------------------------------------------


def _run_command(
    kind: str,
    name: str,
    args: list[str],
    cwd: str,
    env: dict[str, str],
    fresh_path: list[str],
    out: str,
    err: str,
) -> None:
    """The command, in the process forked for it: set up as a fresh ``python`` would be, run
    as ``python -m NAME ARGS`` or ``python NAME ARGS``, ended as ``python`` ends."""
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    unbuffered = bool(env.get("PYTHONUNBUFFERED"))
    sys.stdout = _stream(1, out, unbuffered, line_buffered=False)
    sys.stderr = _stream(2, err, unbuffered, line_buffered=True)
    threads = env.get("OMP_NUM_THREADS", "")
    if threads.isdigit() and int(threads) > 0:
        import torch

        torch.set_num_threads(int(threads))
    first = cwd if kind == "module" else os.path.dirname(os.path.abspath(name))
    extra = [p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    sys.path[:] = [first, *extra, *fresh_path]
    sys.argv = [name, *args]  # runpy puts the module's file in argv[0]
    code = 0
    try:
        if kind == "module":
            runpy.run_module(name, run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(name, run_name="__main__")
    except SystemExit as exit_:
        code = _exit_status(exit_.code)
    except BaseException as error:
        _print_traceback(error)
        code = 1
    code = _end_as_python_ends(code)
    os._exit(code)


def _print_traceback(error: BaseException) -> None:
    """The traceback ``python`` prints for an exception out of its main module: from the
    command's first frame (not this module's or runpy's)."""
    tb = error.__traceback__
    while tb is not None and tb.tb_frame.f_code.co_filename in _LAUNCHING:
        tb = tb.tb_next
    traceback.print_exception(type(error), error, tb)


_LAUNCHING = {__file__, runpy.__file__, "<frozen runpy>"}


def _stream(fd: int, path: str, unbuffered: bool, *, line_buffered: bool) -> io.TextIOWrapper:
    """File descriptor ``fd`` pointed at ``path``, and the text stream Python gives it."""
    target = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(target, fd)
    os.close(target)
    raw = open(fd, "wb", buffering=0 if unbuffered else -1, closefd=False)  # noqa: SIM115
    return io.TextIOWrapper(
        raw,  # type: ignore[arg-type]
        encoding="utf-8",
        errors="backslashreplace" if fd == 2 else "strict",
        line_buffering=line_buffered,
        write_through=unbuffered,
    )


def _exit_status(code: object) -> int:
    """The exit status ``sys.exit(code)`` gives a Python process."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code & 0xFF
    print(code, file=sys.stderr)
    return 1


def _end_as_python_ends(code: int) -> int:
    """What ``python`` does after the main module: threading's shutdown (its exit callbacks,
    which tell ``concurrent.futures`` workers to stop, then a wait for non-daemon threads), the
    ``atexit`` handlers (whose ``SystemExit`` sets the status), the streams flushed."""
    threading._shutdown()  # what Py_FinalizeEx calls first
    try:
        atexit._run_exitfuncs()
    except SystemExit as exit_:
        code = _exit_status(exit_.code)
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError):  # closed by the command
            stream.flush()
    return code
