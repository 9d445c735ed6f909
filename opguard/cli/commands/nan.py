"""``opguard nan RUN [--rank K] [--json]``: where NaN or Inf values first appeared, per rank.
Exit status: 0 none, 1 found, 2 error. Never imports torch."""

from __future__ import annotations

import argparse
from typing import Any

from ...analysis.contract import nonfinite_json
from ...analysis.nonfinite import Nonfinite, find_nonfinite
from ...store import Run
from .base import print_json

SCHEMA = "opguard.nan/1"


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "nan",
        help="name the first op whose outputs hold NaN or Inf while its inputs did not",
        description="Scans a run's recorded NaN/Inf counts and names, per rank, the first op "
        "that made NaN or Inf values from finite inputs. Exit status: 0 none, 1 found, 2 error.",
    )
    p.add_argument("run_dir", metavar="RUN")
    p.add_argument("--rank", type=int, help="only this rank (default: all)")
    p.add_argument("--json", action="store_true", help=f"print one {SCHEMA} object")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    ranks, found = _scan(args.run_dir, args.rank)
    if args.json:
        print_json(_json(args.run_dir, ranks, found))
    else:
        from ..diff_report import print_nonfinite

        if not found:
            print(f"no NaN or Inf in {args.run_dir} (ranks {', '.join(map(str, ranks))})")
        for n in found:
            print_nonfinite(f"{args.run_dir} rank {n.rank}", n)
    return 1 if found else 0


def answer(args: dict[str, Any]) -> dict[str, Any]:
    """The ``nan`` tool: what ``opguard nan RUN --json`` prints."""
    return _json(args["run"], *_scan(args["run"], args["rank"]))


def _scan(path: str, rank: int | None) -> tuple[list[int], list[Nonfinite]]:
    with Run(path) as run_:
        ranks = [rank] if rank is not None else run_.ranks
        return ranks, [n for n in (find_nonfinite(run_.rank(k)) for k in ranks) if n is not None]


def _json(path: str, ranks: list[int], found: list[Nonfinite]) -> dict[str, Any]:
    return {
        "schema": SCHEMA,
        "run": path,
        "ranks_scanned": ranks,
        "ranks": [nonfinite_json(n) for n in found],
    }
