"""Helpers shared by the subcommands."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ...tools.catalog import NOISE as NOISE_PARAM
from ...tools.catalog import RAY as RAY_PARAM
from ...tools.catalog import TOLERANT as TOLERANT_PARAM

if TYPE_CHECKING:
    from ...analysis import RunDiff
    from ...analysis.tolerant.rule import Tolerance
    from ...hunt import Hunt
    from ...tool_registry import Param


class CommandError(Exception):
    """A command cannot run with the input it was given (one line, exit status 2)."""


def call_tool(name: str, arguments: dict[str, Any]) -> dict[str, Any]:
    """The answer of tool ``name`` (:mod:`opguard.tools`): what the command prints with
    ``--json``. Its :class:`~opguard.tools.ToolError` is a one-line error like the command's."""
    from ...tools import BY_NAME

    return BY_NAME[name].call(arguments)


# --tolerant[=REL] as the diff tool declares it: its flag, and the value it stands for alone.
TOLERANT, AUTO = str(TOLERANT_PARAM.flag), str(TOLERANT_PARAM.bare)
RAY, RAY_AUTO = str(RAY_PARAM.flag), str(RAY_PARAM.bare)


def add_tolerant(parser: argparse.ArgumentParser) -> None:
    """``--tolerant[=REL]`` (``opguard diff``, ``hunt``, ``explain``, ``tui``), with what
    only the command line needs said: a run after it is not its value (parse_command_line);
    and its ``--noise CONTROL``, as the diff tool declares both."""
    action = TOLERANT_PARAM.add_to(parser, "tolerant")
    action.help = f"{action.help}; a run named after it is a run"
    NOISE_PARAM.add_to(parser, "noise")


def add_ray(parser: argparse.ArgumentParser) -> None:
    """``--ray [ADDRESS]`` (``opguard diff``, ``hunt``, ``explain``, ``tui``), as the diff
    tool declares it; a run after it is not its address (parse_command_line)."""
    action = RAY_PARAM.add_to(parser, "ray")
    action.help = f"{action.help}; a run named after it is a run"


def is_ray_address(word: str) -> bool:
    """Whether the word after ``--ray`` can be its address: ``auto``, ``ray://…``, or
    ``HOST:PORT`` that is no directory here; anything else is the next argument, a run."""
    if word == RAY_AUTO or "://" in word:
        return True
    host, colon, port = word.rpartition(":")
    return bool(colon and host and port.isdigit() and not os.path.isdir(word))


def is_tolerant_value(word: str) -> bool:
    """Whether the word after ``--tolerant`` can be its value: ``auto`` or a number (a bad
    one is then refused by name); anything else is the next argument, a run."""
    if word == AUTO:
        return True
    try:
        float(word)
    except ValueError:
        return False
    return True


# The options whose value is optional (their parameter: the value each stands for alone, and
# its name), and whether a word after one can be its value (argparse takes any word that is
# no option).
OPTIONAL_VALUES: dict[str, tuple[Param, Callable[[str], bool]]] = {
    TOLERANT: (TOLERANT_PARAM, is_tolerant_value),
    RAY: (RAY_PARAM, is_ray_address),
}


def words_after_optional_values(argv: list[str]) -> list[tuple[int, str, str]]:
    """Each option of :data:`OPTIONAL_VALUES` followed by a word that is no option, before
    ``--`` (what follows is a script's own): its place, the option and that word."""
    found = []
    for at, word in enumerate(argv[:-1]):
        if word == "--":
            break
        if word in OPTIONAL_VALUES and not argv[at + 1].startswith("-"):
            found.append((at, word, argv[at + 1]))
    return found


def tolerance_of(args: argparse.Namespace) -> Tolerance | None:
    """The tolerance ``--tolerant`` (and ``--noise``) asked for (None without it); a bad
    value is a :class:`CommandError`."""
    from ...tool_registry import ToolError
    from ...tools.answers import tolerance_of as checked

    try:
        return checked(args.tolerant, args.noise)
    except ToolError as exc:
        raise CommandError(str(exc)) from None


def directory_name(text: str) -> str:
    """An argparse type for a directory to write: an empty name is refused, not read as the
    working directory (which is what a path made of it would mean)."""
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty name is not a directory")
    return text


def add_html(parser: argparse.ArgumentParser) -> None:
    """``--html FILE`` (``opguard diff``, ``opguard hunt``): the report as one HTML file too."""
    parser.add_argument(
        "--html",
        type=writable_file,
        metavar="FILE",
        help="also write the report as one self-contained HTML file (to attach to an issue "
        "or a pull request); what is printed and the exit status stay the same",
    )


def writable_file(text: str) -> str:
    """An argparse type for a file to write, refused before anything runs (a hunt records for
    minutes): an empty name, a directory, a folder that does not exist or cannot be written."""
    path = Path(text)
    if not text.strip():
        raise argparse.ArgumentTypeError("an empty name is not a file")
    if path.is_dir():
        raise argparse.ArgumentTypeError(f"{text} is a directory, not a file")
    if not path.parent.is_dir():
        raise argparse.ArgumentTypeError(f"{text}: no directory {path.parent}")
    if not os.access(path if path.exists() else path.parent, os.W_OK):
        raise argparse.ArgumentTypeError(f"{text}: not writable")
    return text


def write_html(path: str, result: RunDiff, command: list[str], hunt: Hunt | None = None) -> None:
    """The HTML report of ``result`` into ``path`` (:mod:`opguard.report`); ``command``: the
    words of the command that made it. A file that cannot be written is a one-line error."""
    from ...report import write_report

    try:
        write_report(path, result, shlex.join(command), hunt)
    except OSError as exc:
        raise CommandError(f"cannot write {path}: {exc.strerror or exc}") from None


def print_json(obj: Any) -> None:
    json.dump(obj, sys.stdout, separators=(",", ":"), default=str)
    sys.stdout.write("\n")


def parse_range(text: str) -> tuple[int, int | None]:
    """``START:END`` (END exclusive, either side optional) or a single index, as ``--ops``
    takes it: indices from 0, END past START."""
    try:
        if ":" in text:
            start_text, _, end_text = text.partition(":")
            start, end = int(start_text or 0), int(end_text) if end_text else None
        else:
            start = int(text)
            end = start + 1
    except ValueError:
        raise CommandError(f"--ops takes START:END or an index, not {text!r}") from None
    if start < 0 or (end is not None and end < 0):
        raise CommandError(f"--ops takes op indices from 0, not {text!r}")
    if end is not None and end <= start:
        raise CommandError(f"--ops {text}: END must be past START (END is exclusive)")
    return start, end
