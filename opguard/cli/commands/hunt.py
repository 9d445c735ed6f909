"""``opguard hunt -o DIR --a 'train_a.py ARGS' --b 'train_b.py ARGS' [--python PY]
[--overwrite] [--tolerant[=REL] [--noise CONTROL]] [--ray [ADDRESS]] [--json [--brief]]
[--html FILE]``: the two passes of :mod:`opguard.hunt`, then the report of the last diff
made (the op-level one when there was a second pass), its first line saying how the step was
found. Exit status as ``opguard diff``'s."""

from __future__ import annotations

import argparse
import sys

from rich.markup import escape

from ...hunt import Hunt
from ...tools.recording import run_hunt
from .base import (
    AUTO,
    RAY,
    RAY_AUTO,
    add_html,
    add_ray,
    add_tolerant,
    directory_name,
    print_json,
    write_html,
)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "hunt",
        help="one command from two runs to the op: the first differing step, then its ops",
        description="Records runs A and B at step level (--steps-only) into DIR/a-steps and "
        "DIR/b-steps, finds the first step K whose training state differs, records both again "
        "op by op in step K only (--window K:K+1 --steps K+1) into DIR/a-window and "
        "DIR/b-window, and prints the op-level report, its first line saying how K was found. "
        "With --tolerant, K is the first step whose state goes beyond the rounding envelope "
        "(--noise CONTROL: measured by a control run of run A's script), and the op-level "
        "report is the tolerant diff of that step. With --ray, each pass's diff runs on that "
        "Ray cluster. Each recording's output goes to DIR/NAME.log. Exit status: 0 identical (or within rounding), 1 diverged, 2 error.",
    )
    p.add_argument(
        "-o", "--output", required=True, type=directory_name, metavar="DIR", help="hunt directory"
    )
    for name in ("a", "b"):
        p.add_argument(
            f"--{name}",
            required=True,
            metavar="'SCRIPT ARGS'",
            help=f"run {name.upper()}: a script and its arguments as one string ('train.py --lr "
            "3e-4'), or '-m MODULE ARGS'",
        )
    p.add_argument(
        "--python", metavar="PY", help="run both under this interpreter (OpGuard installed there)"
    )
    p.add_argument(
        "--overwrite", action="store_true", help="replace the run directories of an earlier hunt"
    )
    add_tolerant(p)
    add_ray(p)
    p.add_argument(
        "--json",
        action="store_true",
        help="print one opguard.hunt/1 JSON object (both diffs' opguard.diff/1 objects inside)",
    )
    p.add_argument(
        "--brief",
        action="store_true",
        help="with --json: of each diff, only its verdict, first divergence, step-level verdict "
        "and notes (the hunt tool's answer)",
    )
    add_html(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.json:
        result = run_hunt(vars(args))
        print_json(result.to_json(brief=args.brief))
    else:
        result = run_hunt(
            vars(args), progress=lambda line: print(line, file=sys.stderr, flush=True)
        )
        _print_report(result)
    if args.html is not None:
        write_html(args.html, result.op_level or result.step_level, _command(args), result)
    return result.exit_code


def _command(args: argparse.Namespace) -> list[str]:
    """The ``opguard hunt`` that writes this report again (the report says it)."""
    python = ["--python", args.python] if args.python else []
    ray = [] if args.ray is None else [RAY if args.ray == RAY_AUTO else f"{RAY}={args.ray}"]
    runs = ["--a", args.a, "--b", args.b, *python, *ray]
    if args.tolerant is not None:
        runs.append("--tolerant" if args.tolerant == AUTO else f"--tolerant={args.tolerant}")
    if args.noise is not None:
        runs += ["--noise", args.noise]
    return ["opguard", "hunt", "-o", args.output, *runs, "--overwrite", "--html", args.html]


def _print_report(result: Hunt) -> None:
    from ..diff_report import print_diff
    from ..render import console

    console.print(escape(result.found_by))
    print_diff(result.op_level or result.step_level)
    if result.next_time is not None:
        console.print(f"\n[bold]Next:[/] {escape(result.next_time)}")
