"""``opguard record -o RUN_DIR [--steps N] [--steps-only | --window START:STOP] [--keep-last N]
[--first-step N] [--python PY] -- SCRIPT.py [ARGS…] | -m MODULE …``"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess

from ...record_options import OptionError, RecordOptions, add_switches
from .base import CommandError, call_tool, directory_name, print_json


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "record",
        help="run a training script and record every op into RUN_DIR",
        description="Runs SCRIPT (or -m MODULE) as __main__ with its own arguments, records "
        "every op and the training state at each step boundary into RUN_DIR (for long runs: "
        "--steps-only, --window, --keep-last), and exits with the script's exit status.",
    )
    p.add_argument(
        "-o",
        "--output",
        required=True,
        type=directory_name,
        metavar="RUN_DIR",
        help="run directory",
    )
    add_switches(p)
    p.add_argument(
        "--python",
        metavar="PY",
        help="run under this interpreter (OpGuard must be installed there)",
    )
    p.add_argument("-m", dest="module", metavar="MODULE", help="run a module, like python -m")
    p.add_argument(
        "--json",
        action="store_true",
        help="record in a child process, its output captured, and print one JSON object: "
        "exit status, ops and steps per rank, the output's last lines",
    )
    p.add_argument("target", nargs=argparse.REMAINDER, metavar="-- SCRIPT.py [ARGS…]")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    target_args = list(args.target)
    if target_args and target_args[0] == "--":
        target_args = target_args[1:]
    if args.json:
        from ...tools import BY_NAME

        given = {p.name: getattr(args, p.name) for p in BY_NAME["record"].params if not p.rest}
        given["script"] = target_args[0] if target_args and not args.module else None
        given["args"] = target_args if args.module else target_args[1:]
        answer_ = call_tool("record", given)
        print_json(answer_)
        return int(answer_["exit_code"])
    options = _options(args)
    if args.python:
        return _run_elsewhere(args, options, target_args)

    from ...recorder.launch import TargetError, record_target

    try:
        return record_target(args.output, options, target_args, args.module)
    except TargetError as exc:
        raise CommandError(str(exc)) from None


class _RecordedParser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # type: ignore[override]
        raise CommandError(message)


def parse_recorded(command: list[str]) -> tuple[RecordOptions, list[str]]:
    """The options and the target (``-- SCRIPT ARGS…`` or ``-m MODULE ARGS…``) of a command
    a run recorded (``opguard record …``, as :func:`run` writes it into ``meta.json``), read by
    the parser that read it then."""
    parser = _RecordedParser(prog="opguard")
    register(parser.add_subparsers(dest="command", parser_class=_RecordedParser))
    args = parser.parse_args(command[1:])
    rest = list(args.target)
    if args.module:
        return _options(args), ["-m", args.module, *rest]
    return _options(args), ["--", *(rest[1:] if rest[:1] == ["--"] else rest)]


def _options(args: argparse.Namespace) -> RecordOptions:
    try:
        return RecordOptions.from_switches(args)
    except OptionError as exc:
        raise CommandError(str(exc)) from None


def _run_elsewhere(args: argparse.Namespace, options: RecordOptions, target_args: list[str]) -> int:
    python = shutil.which(args.python) or args.python
    if not os.path.isfile(python):
        raise CommandError(f"{args.python}: no such interpreter")
    check = subprocess.run([python, "-c", "import opguard._C"], capture_output=True)
    if check.returncode != 0:
        raise CommandError(
            f"{args.python}: OpGuard is not installed for this interpreter "
            f"(install it there from the OpGuard checkout: {args.python} -m pip install ., "
            "or its wheel; docs/INSTALL.md)"
        )
    forwarded = ["-o", args.output, *options.switches()]
    if args.module:
        forwarded += ["-m", args.module]
    forwarded += ["--", *target_args]
    return subprocess.run([python, "-m", "opguard.recorder.launch", *forwarded]).returncode
