"""``opguard nan RUN [--rank K] [--json]``: where NaN or Inf values first appeared, per rank.
Exit status: 0 none, 1 found, 2 error. Never imports torch."""

from __future__ import annotations

import argparse

from ...tools.runs import NAN_SCHEMA, nan_json, nan_scan
from .base import print_json


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "nan",
        help="name the first op whose outputs hold NaN or Inf while its inputs did not",
        description="Scans a run's recorded NaN/Inf counts and names, per rank, the first op "
        "that made NaN or Inf values from finite inputs. Values every op that read them made "
        "finite (an attention mask's -inf before a softmax) are intended: counted apart, not "
        "named. Exit status: 0 none (or intended only), 1 found, 2 error.",
    )
    p.add_argument("run_dir", metavar="RUN")
    p.add_argument("--rank", type=int, help="only this rank (default: all)")
    p.add_argument("--json", action="store_true", help=f"print one {NAN_SCHEMA} object")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    ranks, found = nan_scan(args.run_dir, args.rank)
    if args.json:
        print_json(nan_json(args.run_dir, ranks, found))
    else:
        from ..diff_report import print_nonfinite

        if not found:
            print(f"no NaN or Inf in {args.run_dir} (ranks {', '.join(map(str, ranks))})")
        for n in found:
            print_nonfinite(f"{args.run_dir} rank {n.rank}", n)
    return 1 if any(n.found for n in found) else 0
