"""Human-readable terminal output (rich) for the CLI."""

from __future__ import annotations

import datetime
from collections.abc import Sequence
from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from ..analysis.align.steps import StepCount, op_level_limits
from ..store import OpRecord

# Recorded text (commands, paths, errors) is printed as it is: no emoji codes (":abc:" in a
# --capture SPEC), and markup only where this module writes it, around escaped text.
console = Console(highlight=False, soft_wrap=True, emoji=False)


def _when(timestamp: float | None) -> str:
    if timestamp is None:
        return "-"
    return datetime.datetime.fromtimestamp(timestamp).strftime("%Y-%m-%d %H:%M:%S")


def print_run_summary(path: str, meta: dict[str, Any], ranks: Sequence[dict[str, Any]]) -> None:
    status = meta.get("status", "unknown")
    console.print(
        f"[bold]{escape(path)}[/]  status: [bold]{escape(str(status))}[/]"
        + (f"  exit code {meta['exit_code']}" if "exit_code" in meta else "")
    )
    console.print(f"  command: {escape(' '.join(meta.get('command', [])))}")
    console.print(
        escape(
            f"  torch {meta.get('torch')}  python {meta.get('python')}  "
            f"cuda {meta.get('cuda') or '-'}  host {meta.get('host')}"
        )
    )
    console.print(f"  devices: {escape(', '.join(meta.get('devices', [])))}")
    console.print(f"  started {_when(meta.get('started'))}  ended {_when(meta.get('ended'))}")
    if meta.get("stopped"):
        console.print(f"  stopped early: {escape(str(meta['stopped']))}")
    if meta.get("error"):
        console.print(f"  script error: {escape(str(meta['error']))}")
    for r in ranks:
        phases = ", ".join(f"{k} {v}" for k, v in sorted(r["phases"].items()))
        state = (
            "finished" if r["finished"] else "[yellow]did not finish (killed or still recording)[/]"
        )
        steps = StepCount(r["steps"], r["ops_after_last_step"]).describe()
        if r["ops"] or not r.get("step_records"):
            console.print(f"  rank {r['rank']}: {r['ops']} ops in {steps} ({phases}); {state}")
        else:
            console.print(f"  rank {r['rank']}: no op-level records; {state}")
        if "unreached_window" in r:
            console.print(f"    [yellow]{escape(r['unreached_window'])}[/]")
        limits = op_level_limits(meta)
        if r["ops"] and limits:
            first, last = r.get("first_op", {"index": 0, "step": 0}), r["last_op"]
            console.print(
                f"    ops {first['index']} to {last['index']}: steps {first['step']} to "
                f"{last['step']} ({escape(limits)})"
            )
        if r.get("step_records"):
            held = r["step_records"]
            console.print(
                f"    step-level records: {held['count']} step(s), {held['first']} to {held['last']}"
            )
        if r.get("partial"):
            console.print(f"    [yellow]partial trace: {escape(_partial_end(r))}[/]")
        if "recorder_failure" in r:
            f = r["recorder_failure"]
            error = escape(str(f["error"]))
            console.print(f"    [red]recording stopped at op {f['at_op']}: {error}[/]")
        if "write_failure" in r:
            console.print(f"    [red]{escape(str(r['write_failure']))}[/]")
        if "damage" in r:
            console.print(f"    [red]{escape(str(r['damage']))}[/]")
    if meta.get("recorder_failure") and not any(
        "recorder_failure" in r or "write_failure" in r for r in ranks
    ):
        console.print(f"  [red]recording stopped: {escape(str(meta['recorder_failure']))}[/]")


def _partial_end(rank: dict[str, Any]) -> str:
    """Where a partial trace ends, and why when it is known."""
    last = rank.get("last_op")
    where = f"ends at op {last['index']} (step {last['step']})" if last else "holds no op"
    if not rank["finished"]:
        return f"{where}; the recorder did not close it (killed, or still recording)"
    if "recorder_failure" in rank or "write_failure" in rank:
        return f"{where}; recording stopped early"
    return f"{where}; {rank.get('error') or 'run ' + str(rank.get('end'))}"


def print_op_table(ops: Sequence[OpRecord], title: str) -> None:
    table = Table(title=title, show_lines=False, expand=False)
    for name in ("#", "step", "phase", "op", "call site", "inputs", "outputs"):
        table.add_column(name, overflow="fold")
    for op in ops:
        table.add_row(
            str(op.index),
            str(op.step),
            op.phase,
            op.op,
            op.call_site.short(),
            "\n".join(f"{t.slot}: {t.describe_shape()}" for t in op.inputs),
            "\n".join(f"{t.describe_shape()} {t.fingerprint_text()}" for t in op.outputs),
        )
    if console.is_terminal:
        console.print(table)
    else:
        _print_unfolded(table)


def _print_unfolded(table: Table) -> None:
    """A table into a pipe or a file: as wide as its longest cells, so that an op name or a
    call site stays on one line for grep and for other programs (rich would fold it to 80
    columns, the width it assumes when there is no terminal)."""
    width = console.width
    console.width = console.measure(table, options=console.options.update_width(1 << 16)).maximum
    try:
        console.print(table)
    finally:
        console.width = width
