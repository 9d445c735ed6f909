"""``opguard record -o RUN_DIR [--steps N] [--steps-only | --window START:STOP] [--keep-last N]
[--first-step N] [--python PY] -- SCRIPT.py [ARGS…] | -m MODULE …``"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path

from ...capture_spec import DEFAULT_LIMIT, CaptureSpec, SpecError, parse_size
from ...record_options import OptionError, RecordOptions, parse_window
from ...store import TraceError
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
    p.add_argument(
        "--steps",
        type=int,
        metavar="N",
        help="end the run when step N is reached: steps are numbered from 0 (or --first-step), "
        "so a fresh run records its first N optimizer steps",
    )
    p.add_argument(
        "--steps-only",
        action="store_true",
        help="record no op, only the training state at each step boundary (loss, gradients, "
        "parameters, optimizer states, buffers, RNG): cheap enough for a whole long run",
    )
    p.add_argument(
        "--window",
        metavar="START:STOP",
        help="record ops only in steps START to STOP-1 (step-level records everywhere)",
    )
    p.add_argument(
        "--keep-last",
        type=int,
        metavar="N",
        help="flight recorder: keep the ops of the last N completed steps only (step-level "
        "records of all), so the trace stays bounded however long the run",
    )
    p.add_argument(
        "--first-step",
        type=int,
        default=0,
        metavar="N",
        help="number the first step N (a script resumed from a checkpoint at step N), so its "
        "steps line up with the original run's; the script may say it with opguard.step(N)",
    )
    p.add_argument("--overwrite", action="store_true", help="replace an earlier run in RUN_DIR")
    p.add_argument(
        "--eager",
        action="store_true",
        help="turn torch.compile off: compiled functions run eagerly, op by op",
    )
    p.add_argument(
        "--verify-inputs",
        action="store_true",
        help="fingerprint every op input again (slower): shows writes no recorded op made",
    )
    p.add_argument(
        "--python",
        metavar="PY",
        help="run under this interpreter (OpGuard must be installed there)",
    )
    p.add_argument(
        "--capture",
        metavar="SPEC",
        help="also store the full input and output tensors of these ops: comma-separated op "
        "indices (812), ranges (800-820), op names (aten::addmm.default) or call sites "
        "(train.py:42)",
    )
    p.add_argument(
        "--capture-limit",
        metavar="SIZE",
        default=str(DEFAULT_LIMIT),
        help=f"most bytes of tensors captured per rank (default: {DEFAULT_LIMIT >> 20}MiB)",
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

    from ...recorder.launch import Target, run_recorded
    from ...recorder.torchrun import parse_job, run_torchrun, torchrun_argv

    # As typed (every option, so that `opguard show` tells how the run was made).
    recorded_as = ["opguard", "record", "-o", args.output, *options.switches()]
    launcher = torchrun_argv(target_args, args.module)
    if launcher is not None:
        try:
            job = parse_job(launcher)
        except TraceError as exc:
            raise CommandError(str(exc)) from None
        command = [*recorded_as, "--", "torchrun", *launcher]
        return run_torchrun(job, Path(args.output), options, command)
    if args.module:
        if not _module_found(args.module):
            raise CommandError(f"{args.module}: no such module")
        target = Target(args.module, target_args, is_module=True)
    else:
        if not target_args:
            raise CommandError("record needs a script: opguard record -o RUN_DIR -- train.py")
        script = target_args[0]
        if not os.path.isfile(script):
            raise CommandError(f"{script}: no such script")
        target = Target(script, target_args[1:])
    # As typed, so that it replays: `-m MODULE ARGS…` or `-- SCRIPT ARGS…`.
    where = target.describe() if target.is_module else ["--", *target.describe()]
    return run_recorded(target, Path(args.output), options, [*recorded_as, *where])


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
        capture = CaptureSpec.parse(args.capture) if args.capture is not None else None
        capture_limit = parse_size(args.capture_limit)
        options = RecordOptions(
            steps=args.steps,
            overwrite=args.overwrite,
            eager=args.eager,
            verify_inputs=args.verify_inputs,
            capture=capture,
            capture_limit=capture_limit,
            steps_only=args.steps_only,
            first_step=args.first_step,
            window=parse_window(args.window) if args.window is not None else None,
            keep_last=args.keep_last,
        )
        options.check()
    except (SpecError, OptionError) as exc:
        raise CommandError(str(exc)) from None
    return options


def _run_elsewhere(args: argparse.Namespace, options: RecordOptions, target_args: list[str]) -> int:
    python = shutil.which(args.python) or args.python
    if not os.path.isfile(python):
        raise CommandError(f"{args.python}: no such interpreter")
    check = subprocess.run([python, "-c", "import opguard._C"], capture_output=True)
    if check.returncode != 0:
        raise CommandError(
            f"{args.python}: OpGuard is not installed for this interpreter "
            f"(run: {args.python} -m pip install opguard)"
        )
    forwarded = ["-o", args.output, *options.switches()]
    if args.module:
        forwarded += ["-m", args.module]
    forwarded += ["--", *target_args]
    return subprocess.run([python, "-m", "opguard.recorder.launch", *forwarded]).returncode


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
