"""``opguard diff RUN_A RUN_B [--rank K] [--step S] [--tolerant[=REL] [--noise CONTROL]]
[--ray[=ADDRESS]] [--json [--brief] [--offset N] [--limit N]] [--html FILE]``: exit 0
identical (or within rounding), 1 diverged."""

from __future__ import annotations

import argparse
import sys

from ...analysis import RunDiff
from ...analysis.contract import to_json
from ...analysis.result import EXIT_STATUS
from ...analysis.tolerant.rule import Tolerance
from ...distributed.driver import compare_runs
from .base import (
    AUTO,
    RAY,
    RAY_AUTO,
    CommandError,
    add_html,
    add_ray,
    add_tolerant,
    call_tool,
    print_json,
    tolerance_of,
    write_html,
)


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "diff",
        help="name the first op where two runs stop computing the same",
        description="Aligns two recorded runs and names the first observed difference. "
        "Exit status: 0 identical (or within rounding, with --tolerant), 1 diverged, 2 error, "
        "3 incomplete (no divergence in what could be read; part of a run could not be read).",
    )
    p.add_argument("run_a", metavar="RUN_A")
    p.add_argument("run_b", metavar="RUN_B")
    p.add_argument("--rank", type=int, help="compare only this rank")
    p.add_argument("--step", type=int, help="compare only this step")
    add_tolerant(p)
    add_ray(p)
    p.add_argument("--json", action="store_true", help="print the opguard.diff/1 JSON object")
    p.add_argument(
        "--brief",
        action="store_true",
        help="with --json: leave out ops given twice (the diff tool's answer)",
    )
    p.add_argument("--offset", type=int, metavar="N", help="with --json: steps from the Nth on")
    p.add_argument("--limit", type=int, metavar="N", help="with --json: at most N steps a rank")
    add_html(p)
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    paged = args.offset is not None or args.limit is not None
    if paged and not args.json:  # the report has no per-step list to page
        raise CommandError("--offset and --limit page the per-step lists of --json: add --json")
    if args.brief and not args.json:
        raise CommandError("--brief shortens the JSON object: add --json")
    tolerance = tolerance_of(args)
    if paged or args.brief:
        # Bounded in size, a page of the per-step lists: the diff tool's answer.
        keys = (
            "run_a",
            "run_b",
            "rank",
            "step",
            "tolerant",
            "noise",
            "ray",
            "brief",
            "offset",
            "limit",
        )
        answer = call_tool("diff", {k: getattr(args, k) for k in keys})
        print_json(answer)
        if args.html is not None:  # the tool answers JSON: the report is drawn from the result
            write_html(args.html, _compare(args, tolerance), _command(args))
        return EXIT_STATUS[answer["verdict"]]
    result = _compare(args, tolerance)
    if args.json:
        print_json(to_json(result))
    else:
        from ..diff_report import print_diff

        print_diff(result)
    if args.html is not None:
        write_html(args.html, result, _command(args))
    return result.exit_status


def _compare(args: argparse.Namespace, tolerance: Tolerance | None) -> RunDiff:
    return compare_runs(
        args.run_a,
        args.run_b,
        ray=args.ray,
        rank=args.rank,
        step=args.step,
        tolerance=tolerance,
        report=lambda line: print(line, file=sys.stderr, flush=True),
    )


def _command(args: argparse.Namespace) -> list[str]:
    """The ``opguard diff`` that writes this report again (the report says it)."""
    words = ["opguard", "diff", args.run_a, args.run_b]
    for option in ("rank", "step"):
        if getattr(args, option) is not None:
            words += [f"--{option}", str(getattr(args, option))]
    if args.tolerant is not None:
        words.append("--tolerant" if args.tolerant == AUTO else f"--tolerant={args.tolerant}")
    if args.noise is not None:
        words += ["--noise", args.noise]
    if args.ray is not None:
        words.append(RAY if args.ray == RAY_AUTO else f"{RAY}={args.ray}")
    return [*words, "--html", args.html]
