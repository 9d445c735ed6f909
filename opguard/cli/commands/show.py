"""``opguard show RUN_DIR [--rank K] [--ops START:END] [--json]``: what a trace holds."""

from __future__ import annotations

import argparse

from ...store import RankTrace, Run
from ...tools.runs import run_summary
from .base import CommandError, parse_range, print_json


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "show",
        help="summarise a recorded run, or list its ops",
        description="Prints a run's summary; with --ops, its ops as a table.",
    )
    p.add_argument("run_dir", metavar="RUN_DIR")
    p.add_argument("--rank", type=int, default=None, help="only this rank (default: all)")
    p.add_argument("--ops", metavar="START:END", help="list these ops (END exclusive)")
    p.add_argument("--json", action="store_true", help="print one JSON object")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    with Run(args.run_dir) as run_:
        ranks = [args.rank] if args.rank is not None else run_.ranks
        traces = [run_.rank(r) for r in ranks]
        if args.ops is not None:
            start, stop = parse_range(args.ops)
            _check_selects(args.ops, start, stop, traces)
            ops = {t.rank: list(t.ops(start, stop)) for t in traces}
            if args.json:
                print_json({"ranks": {str(r): [o.to_json() for o in v] for r, v in ops.items()}})
            else:
                from ..render import print_op_table

                for rank, listing in ops.items():
                    print_op_table(listing, title=f"{args.run_dir} rank {rank}")
            return 0
        summary = run_summary(run_, traces)
        if args.json:
            print_json(summary)
        else:
            from ..render import print_run_summary

            print_run_summary(args.run_dir, summary["run"], summary["ranks"])
    return 0


def _check_selects(text: str, start: int, stop: int | None, traces: list[RankTrace]) -> None:
    """Refuses an ``--ops`` range that holds no op of any rank shown: an empty table would read
    as "no ops there" rather than "wrong range"."""
    for t in traces:
        first, last = t.first_op(), t.last_op()
        if first and last and start <= last[0] and (stop is None or stop > first[0]):
            return
    held = "; ".join(f"rank {t.rank} {t.describe_ops()}" for t in traces)
    raise CommandError(f"--ops {text} selects no op: {held}")
