"""Answers about one recorded run: what it holds (``show``) and where NaN or Inf first appeared
in it (``nan``). The JSON of ``opguard show --json`` and ``opguard nan --json``, and of the tools
of the same names."""

from __future__ import annotations

from collections import Counter
from typing import Any

from ..analysis.align.steps import count_steps
from ..analysis.contract import nonfinite_json
from ..analysis.divergence.nonfinite import Nonfinite, find_nonfinite
from ..store import RankTrace, Run
from ..store import schema as store_schema

NAN_SCHEMA = "opguard.nan/1"


def show(args: dict[str, Any]) -> dict[str, Any]:
    """The ``show`` tool: what ``opguard show RUN_DIR --json`` prints."""
    with Run(args["run"]) as run_:
        ranks = [args["rank"]] if args["rank"] is not None else run_.ranks
        return run_summary(run_, [run_.rank(r) for r in ranks])


def run_summary(run_: Run, traces: list[RankTrace]) -> dict[str, Any]:
    return {"run": _meta_summary(run_.meta), "ranks": [rank_summary(t) for t in traces]}


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
    if trace.unreached_window:
        summary["unreached_window"] = trace.unreached_window
    return summary


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


def nan(args: dict[str, Any]) -> dict[str, Any]:
    """The ``nan`` tool: what ``opguard nan RUN --json`` prints."""
    return nan_json(args["run"], *nan_scan(args["run"], args["rank"]))


def nan_scan(path: str, rank: int | None) -> tuple[list[int], list[Nonfinite]]:
    """The ranks scanned (``rank``, else all) and the first NaN or Inf made on each, if any."""
    with Run(path) as run_:
        ranks = [rank] if rank is not None else run_.ranks
        return ranks, [n for n in (find_nonfinite(run_.rank(k)) for k in ranks) if n is not None]


def nan_json(path: str, ranks: list[int], found: list[Nonfinite]) -> dict[str, Any]:
    return {
        "schema": NAN_SCHEMA,
        "run": path,
        "ranks_scanned": ranks,
        "ranks": [nonfinite_json(n) for n in found],
    }
