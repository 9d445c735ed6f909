"""``opguard show RUN_DIR [--rank K] [--ops START:END] [--json]``: what a trace holds."""

from __future__ import annotations

import argparse
from collections import Counter
from typing import Any

from ...analysis.steps import count_steps
from ...store import RankTrace, Run
from ...store import schema as store_schema
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


def rank_summary(trace: RankTrace) -> dict[str, Any]:
    phases: Counter[str] = Counter()
    step_values: Counter[int] = Counter()
    count = 0
    for raw in trace.raw_ops():
        phases[store_schema.PHASES[raw.get("p", 3)]] += 1
        step_values[raw.get("s", 0)] += 1
        count += 1
    end = trace.info.get("end")
    if not isinstance(end, dict):
        end = None
    write_failure = trace.info.get("write_failure")
    steps = count_steps(trace, step_values)
    summary: dict[str, Any] = {
        "rank": trace.rank,
        "ops": count,
        "steps": steps.steps,
        "ops_after_last_step": steps.ops_after,
        "phases": dict(phases),
        "finished": trace.finished,
        "partial": trace.partial,
    }
    first, last = trace.first_op(), trace.last_op()
    if first is not None and first != (0, 0):  # ops of some steps only (--window, --keep-last)
        summary["first_op"] = {"index": first[0], "step": first[1]}
    if last is not None:
        summary["last_op"] = {"index": last[0], "step": last[1]}
    span = trace.step_span()
    if span is not None:
        summary["step_records"] = {"count": trace.step_count(), "first": span[0], "last": span[1]}
    if end:
        summary["end"] = end.get("status")
        if end.get("stopped"):
            summary["stopped"] = end["stopped"]
        if end.get("error"):
            summary["error"] = end["error"]
    if trace.failure:
        summary["recorder_failure"] = trace.failure
    if write_failure:
        summary["write_failure"] = write_failure
    if trace.damage:
        summary["damage"] = trace.damage
    return summary


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
        summary = _summary(run_, traces)
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


def answer(args: dict[str, Any]) -> dict[str, Any]:
    """The ``show`` tool: what ``opguard show RUN_DIR --json`` prints."""
    with Run(args["run"]) as run_:
        ranks = [args["rank"]] if args["rank"] is not None else run_.ranks
        return _summary(run_, [run_.rank(r) for r in ranks])


def _summary(run_: Run, traces: list[RankTrace]) -> dict[str, Any]:
    return {"run": _meta_summary(run_.meta), "ranks": [rank_summary(t) for t in traces]}


def _meta_summary(meta: dict[str, Any]) -> dict[str, Any]:
    keys = (
        "status",
        "command",
        "cwd",
        "python",
        "torch",
        "cuda",
        "devices",
        "world_size",
        "host",
        "started",
        "ended",
        "exit_code",
        "error",
        "stopped",
        "recorder_failure",
        "steps_only",
        "window",
        "keep_last",
        "first_step",
    )
    return {k: meta[k] for k in keys if meta.get(k) is not None}
