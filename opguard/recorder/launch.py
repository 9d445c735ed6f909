"""Running a user's script or module as ``__main__`` under a recording session."""

from __future__ import annotations

import os
import runpy
import sys
import traceback
from dataclasses import dataclass
from pathlib import Path

from ..record_options import RecordOptions
from .session import TERMINATED, RecordingSession, StepLimitReached
from .termination import Terminated


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


def main() -> None:
    """``python -m opguard.recorder.launch`` is how ``opguard record --python PY`` starts the
    script under another interpreter: the same CLI, minus ``--python``."""
    from ..cli import main as cli_main

    cli_main(["record", *sys.argv[1:]])


if __name__ == "__main__":
    main()
