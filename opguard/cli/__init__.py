"""The ``opguard`` command line. Subcommands import what they need when they run, so
``opguard diff`` never imports torch and every command starts fast. Help is written for users
(``DESCRIPTION``, each subcommand's ``description``), never taken from these docstrings."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from ..children import ERROR_PREFIX
from ..store.errors import TraceError
from ..tool_registry import ToolError
from . import commands
from .commands.base import OPTIONAL_VALUES, words_after_optional_values


class UsageError(Exception):
    """Bad command-line input: reported as one line, exit status 2."""


DESCRIPTION = """\
OpGuard records every op of two PyTorch training runs and names the first op where they stop
computing the same thing.

  opguard demo                              try it on the bundled example (CPU, seconds)
  opguard record -o runs/a -- train.py ...  record a run (then run B into runs/b)
  opguard diff runs/a runs/b                name the first op where they differ
  opguard hunt -o DIR --a a.py --b b.py     long runs: the first differing step, then its op
  opguard COMMAND --help                    what a command does and its options"""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{message} (see {self.prog} --help)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="opguard",
        description=DESCRIPTION,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for command in commands.ALL:
        command.register(sub)
    return parser


def parse_command_line(
    parser: argparse.ArgumentParser, argv: list[str]
) -> tuple[argparse.Namespace, list[str]]:
    """``parser.parse_known_args(argv)``, reading ``--tolerant`` and ``--ray`` as the user
    meant them: their value is optional, so argparse takes the word after one as its value
    even where that is a run (``opguard diff --tolerant RUN_A RUN_B`` then misses RUN_B). When
    the line cannot be read so and those words are no values, the options take none; when one
    could be a value, the error says it was taken as one."""
    try:
        return parser.parse_known_args(argv)
    except UsageError as exc:
        found = words_after_optional_values(argv)
        if not found:
            raise
        for _, flag, word in found:
            param, is_value = OPTIONAL_VALUES[flag]
            if is_value(word):
                raise UsageError(
                    f"{exc}; {flag} took {word!r} as its value ({flag}[={param.word}]: write "
                    f"a value as {flag}={word}, or {flag} after the runs)"
                ) from None
        alone = list(argv)
        for at, flag, _ in found:
            alone[at] = f"{flag}={OPTIONAL_VALUES[flag][0].bare}"
        try:
            return parser.parse_known_args(alone)
        except UsageError:
            raise exc from None


def _missing_extension() -> str | None:
    """What to do when ``opguard._C`` cannot be found (a source tree run in place, never
    installed: the first command that records fails on the import), else None."""
    import importlib.util
    import os

    if importlib.util.find_spec("opguard._C") is not None:
        return None
    where = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    return (
        f"OpGuard's compiled part (opguard._C) is not built in {where}: install OpGuard "
        "(pip install .), or pip install -e . to work on this source tree"
    )


def _needs_torch(exc: ImportError, command: str | None) -> str | None:
    """What to do when a command that runs PyTorch (record, demo, replay) finds no torch: an
    analysis install reads traces without it, recording needs the training environment's."""
    missing = exc.name if isinstance(exc, ModuleNotFoundError) else None
    if missing is None or missing.split(".")[0] != "torch":
        return None
    return (
        f"opguard {command} runs PyTorch, which this environment does not have: run it where "
        "the training runs (OpGuard installed beside its torch), or name that interpreter with "
        "opguard record --python PY"
    )


def _version() -> str:
    from .. import __version__

    return __version__


def main(argv: Sequence[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    parser = build_parser()
    command: str | None = None
    try:
        # Unknown options are reported by the top-level parser, which would point to `opguard
        # --help`: the command's own help is where its options are.
        args, unknown = parse_command_line(parser, argv)
        command = args.command
        if unknown:
            where = f"opguard {args.command}" if args.command else "opguard"
            raise UsageError(f"unrecognized arguments: {' '.join(unknown)} (see {where} --help)")
        if args.command is None:  # bare `opguard`: what it does and where to start
            parser.print_help()
            code = 0
        else:
            code = args.run(args)
    except (UsageError, TraceError, ToolError, commands.CommandError) as exc:
        print(f"{ERROR_PREFIX}{exc}", file=sys.stderr)
        code = 2
    except ImportError as exc:
        missing = _needs_torch(exc, command) or _missing_extension()
        if missing is None:
            raise
        print(f"{ERROR_PREFIX}{missing}", file=sys.stderr)
        code = 2
    except BrokenPipeError:
        code = 0
    except KeyboardInterrupt:
        code = 130
    sys.exit(code)
