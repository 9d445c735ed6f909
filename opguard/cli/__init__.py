"""The ``opguard`` command line. Subcommands import what they need when they run, so
``opguard diff`` never imports torch and every command starts fast."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from ..store.errors import TraceError
from . import commands


class UsageError(Exception):
    """Bad command-line input: reported as one line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise UsageError(f"{message} (see {self.prog} --help)")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="opguard", description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    sub.required = True
    for command in commands.ALL:
        command.register(sub)
    return parser


def _version() -> str:
    from .. import __version__

    return __version__


def main(argv: Sequence[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    try:
        args = build_parser().parse_args(argv)
        code = args.run(args)
    except (UsageError, TraceError, commands.CommandError) as exc:
        print(f"opguard: error: {exc}", file=sys.stderr)
        code = 2
    except BrokenPipeError:
        code = 0
    except KeyboardInterrupt:
        code = 130
    sys.exit(code)
