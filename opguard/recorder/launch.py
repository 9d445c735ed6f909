"""Running a user's script, module or torchrun job under a recording session: what
``opguard record`` does once its command line is read, and ``python -m opguard.recorder.launch``,
the same command minus ``--python`` (how another interpreter and torchrun's workers record)."""

from __future__ import annotations

import argparse
import importlib.util
import os
import runpy
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path

from ..children import ERROR_PREFIX
from ..record_options import OptionError, RecordOptions, add_switches
from ..store import TraceError
from .callsite import code_beneath
from .session import TERMINATED, RecordingSession, StepLimitReached
from .termination import Terminated


class TargetError(Exception):
    """What to record cannot be run (no such script or module): one line."""


@dataclass(frozen=True)
class Target:
    """What to run: a script path or a module name, and its own argv."""

    path: str
    args: list[str]
    is_module: bool = False

    def describe(self) -> list[str]:
        return ["-m", self.path, *self.args] if self.is_module else [self.path, *self.args]


def exit_code_of(exc: SystemExit) -> int:
    """The process exit status Python would give for ``sys.exit(code)``."""
    if exc.code is None:
        return 0
    if isinstance(exc.code, int):
        return exc.code
    print(exc.code, file=sys.stderr)
    return 1


_PACKAGE = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep
_EXAMPLES = os.path.join(_PACKAGE, "demo") + os.sep  # the bundled scripts are the user's code


def _users(frame: traceback.FrameSummary) -> bool:
    """Whether a traceback frame is the user's: not this launcher's, runpy's or the
    recorder's (the dispatch mode an op runs inside while recording)."""
    path = os.path.abspath(frame.filename) if os.path.isabs(frame.filename) else frame.filename
    if path.startswith(_PACKAGE) and not path.startswith(_EXAMPLES):
        return False
    return not (path == "<frozen runpy>" or path == getattr(runpy, "__file__", None))


def print_user_traceback(exc: BaseException) -> None:
    """The script's exception on stderr as ``python script.py`` shows it: the user's frames
    only, without the launcher and runpy above them or OpGuard's recorder between them (and
    likewise in the exceptions it was raised from)."""
    shown = traceback.TracebackException.from_exception(exc)
    seen: set[int] = set()
    pending = [shown]
    while pending:  # the chain of causes and contexts, each once
        part = pending.pop()
        if id(part) in seen:
            continue
        seen.add(id(part))
        part.stack = traceback.StackSummary.from_list([f for f in part.stack if _users(f)])
        pending += [p for p in (part.__cause__, part.__context__) if p is not None]
    sys.stderr.write("".join(shown.format()))


def run_recorded(target: Target, run_dir: Path, options: RecordOptions, command: list[str]) -> int:
    """Runs ``target`` to its end (or to step ``options.steps``) while recording; returns the
    exit status the script itself would have had. ``command``: as typed, recorded in the run."""
    session = RecordingSession(
        run_dir, exit_after_steps=True, command=command, **options.session_arguments()
    )
    saved_argv, saved_path = sys.argv[:], sys.path[:]
    sys.argv = [target.path, *target.args]
    # What `python script.py` and `python -m module` put first on sys.path: the script's
    # directory, or the current directory (the `opguard` entry point starts with its bin/).
    sys.path.insert(
        0, os.getcwd() if target.is_module else os.path.dirname(os.path.abspath(target.path))
    )
    session.launcher = code_beneath(sys._getframe())
    session.start()
    status, code, error = "finished", 0, None
    try:
        if target.is_module:
            runpy.run_module(target.path, run_name="__main__", alter_sys=True)
        else:
            runpy.run_path(os.path.abspath(target.path), run_name="__main__")
    except StepLimitReached:
        status = "stopped"
    except Terminated as exc:  # the session closes the trace, then the process dies of it
        status, code, error = TERMINATED, exit_code_of(exc), "terminated by SIGTERM"
    except SystemExit as exc:
        code = exit_code_of(exc)
        status = "finished" if code == 0 else "failed"
    except KeyboardInterrupt as exc:
        print_user_traceback(exc)
        status, code, error = "failed", 130, "KeyboardInterrupt"
    except BaseException as exc:
        print_user_traceback(exc)
        status, code, error = "failed", 1, f"{type(exc).__name__}: {exc}"
    finally:
        session.close(status, code, error)
        sys.argv, sys.path[:] = saved_argv, saved_path
    return code


def record_target(output: str, options: RecordOptions, words: list[str], module: str | None) -> int:
    """Records ``words`` (``[--] SCRIPT ARGS…``, a module's arguments after ``-m MODULE``, or
    ``torchrun …``) into ``output``; the exit status the script itself would have had.
    :class:`TargetError` when there is nothing to run."""
    from .torchrun import parse_job, run_torchrun, torchrun_argv

    target_args = words[1:] if words[:1] == ["--"] else words
    # As typed (every option, so that `opguard show` tells how the run was made).
    recorded_as = ["opguard", "record", "-o", output, *options.switches()]
    launcher = torchrun_argv(target_args, module)
    if launcher is not None:
        try:
            job = parse_job(launcher)
        except TraceError as exc:
            raise TargetError(str(exc)) from None
        command = [*recorded_as, "--", "torchrun", *launcher]
        return run_torchrun(job, Path(output), options, command)
    if module:
        if not _module_found(module):
            raise TargetError(f"{module}: no such module")
        target = Target(module, target_args, is_module=True)
    else:
        if not target_args:
            raise TargetError("record needs a script: opguard record -o RUN_DIR -- train.py")
        script = target_args[0]
        if not os.path.isfile(script):
            raise TargetError(f"{script}: no such script")
        target = Target(script, target_args[1:])
    # As typed, so that it replays: `-m MODULE ARGS…` or `-- SCRIPT ARGS…`.
    where = target.describe() if target.is_module else ["--", *target.describe()]
    return run_recorded(target, Path(output), options, [*recorded_as, *where])


def _module_found(name: str) -> bool:
    """Whether ``-m NAME``'s top-level package exists where ``python -m`` looks (the current
    directory first). Only the top level is looked up: finding ``pkg.train`` would import
    ``pkg`` before the recording starts, and its ops would go unrecorded."""
    top = name.partition(".")[0]
    sys.path.insert(0, os.getcwd())
    try:
        return bool(top) and importlib.util.find_spec(top) is not None
    except (ImportError, ValueError):
        return False
    finally:
        sys.path.pop(0)


def main() -> None:
    """``python -m opguard.recorder.launch -o RUN_DIR [SWITCHES] [-m MODULE] -- SCRIPT ARGS…``:
    how ``opguard record --python PY`` records under another interpreter, and torchrun starts
    each worker. Bad input: one line, exit status 2, as ``opguard record`` says it."""
    parser = argparse.ArgumentParser(prog="python -m opguard.recorder.launch")
    parser.add_argument("-o", "--output", required=True)
    add_switches(parser)
    parser.add_argument("-m", dest="module")
    parser.add_argument("target", nargs=argparse.REMAINDER)
    args = parser.parse_args()
    try:
        options = RecordOptions.from_switches(args)
        code = record_target(args.output, options, args.target, args.module)
    except (OptionError, TargetError, TraceError) as exc:
        print(f"{ERROR_PREFIX}{exc}", file=sys.stderr)
        code = 2
    sys.exit(code)


if __name__ == "__main__":
    main()
