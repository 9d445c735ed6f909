"""``opguard capture RUN_A RUN_B [--window K]``: re-record both runs, storing the full tensors
around their first divergence, in one command.

The diff names the divergent op by its index in each run; recording the same script again with
``--capture`` at those indices gives the tensors themselves. Each run's command, working
directory and numerics-relevant environment come from its ``meta.json``; the re-recording
stops after the step that holds the divergence. Only this command's parent side is torch-free:
the recordings are ordinary ``opguard record`` processes.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

from ...analysis import diff_runs
from ...analysis.state_diff import window_command
from ...capture_spec import DEFAULT_LIMIT, CaptureSpec
from ...store import OpRecord, Run
from ...store.meta import NUMERICS_ENV
from .base import CommandError, directory_name
from .record import parse_recorded


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "capture",
        help="re-record two runs, capturing the full tensors around their first divergence",
        description="Diffs RUN_A and RUN_B, then records each again (its own command, from its "
        "meta.json) with --capture at the first divergence's ops, into new run directories, "
        "and prints the commands that read the captures.",
    )
    p.add_argument("run_a", metavar="RUN_A")
    p.add_argument("run_b", metavar="RUN_B")
    p.add_argument(
        "--window", type=int, default=0, metavar="K", help="also capture K ops on each side"
    )
    p.add_argument(
        "--capture-limit",
        default=str(DEFAULT_LIMIT),
        metavar="SIZE",
        help=f"most bytes of tensors captured per rank (default: {DEFAULT_LIMIT >> 20}MiB)",
    )
    p.add_argument(
        "-o",
        "--outputs",
        nargs=2,
        type=directory_name,
        metavar=("NEW_A", "NEW_B"),
        help="the new run directories (default: RUN_A-capture and RUN_B-capture)",
    )
    p.add_argument("--overwrite", action="store_true", help="replace earlier capture runs")
    p.set_defaults(run=run)


def _indices(ops: list[OpRecord | None], window: int) -> list[int]:
    found = {op.index for op in ops if op is not None}
    return sorted({i for k in found for i in range(max(0, k - window), k + window + 1)})


def target_of(meta: dict[str, Any], path: str, *, new_window: bool = False) -> list[str]:
    """What ``opguard record`` ran and how, from the command ``meta.json`` keeps: the switches
    that change how the program runs (``--eager``, ``--verify-inputs``), then ``-- SCRIPT
    ARGS…`` or ``-m MODULE ARGS…``. Its own ``--steps`` and ``--capture`` are left out: the
    re-recording chooses them; so is its ``--window`` with ``new_window`` (a re-recording of
    other steps: the window given last would win)."""
    command = [str(c) for c in meta.get("command", [])]
    if command[:2] != ["opguard", "record"]:
        raise CommandError(
            f"{path} was recorded from code (opguard.record()), not by opguard record: pass "
            "capture=SPEC to opguard.record() and run it again"
        )
    try:
        options, target = parse_recorded(command)
    except CommandError:
        raise CommandError(
            f"{path}: cannot read the recorded command {shlex.join(command)}"
        ) from None
    if new_window:
        options = dataclasses.replace(options, window=None)
    return [*options.mode_switches(), *target]


def _record(
    run: Run,
    target: list[str],
    output: Path,
    spec: CaptureSpec,
    steps: int,
    args: argparse.Namespace,
) -> None:
    meta = run.meta
    command = [sys.executable, "-m", "opguard", "record", "-o", str(output.resolve())]
    command += ["--capture", spec.text, "--capture-limit", args.capture_limit]
    command += ["--steps", str(steps)]
    executable = meta.get("executable")
    if executable and os.path.realpath(executable) != os.path.realpath(sys.executable):
        command += ["--python", executable]
    if args.overwrite:
        command.append("--overwrite")
    command += target
    recorded_env = meta.get("env") or {}
    env = {**os.environ, **{k: v for k, v in recorded_env.items() if k in NUMERICS_ENV}}
    cwd = meta.get("cwd") or os.getcwd()
    print(f"opguard capture: recording {output} (ops {spec.text}) in {cwd}", file=sys.stderr)
    code = subprocess.run(command, cwd=cwd, env=env).returncode
    if code != 0:
        raise CommandError(f"re-recording {run.path} into {output} failed (exit {code})")


def _check(original: Run, new_path: Path, rank: int, op: OpRecord | None) -> str | None:
    """Says when the re-recorded op is not the original one (a run that is not reproducible,
    or a script that changed): the captures then show the re-run, not the recording."""
    if op is None:
        return None
    with Run(new_path) as new:
        again = new.rank(rank).op(op.index)
    if again.op != op.op:
        return f"{new_path}: op {op.index} is now {again.op}, was {op.op}: the script changed"
    if [t.content_key() for t in again.outputs] != [t.content_key() for t in op.outputs]:
        return (
            f"{new_path}: op {op.index} gave other outputs than in {original.path}: the run "
            "is not bit-reproducible; the captures show the re-run"
        )
    return None


def run(args: argparse.Namespace) -> int:
    if args.window < 0:
        raise CommandError("--window must be 0 or more")
    with Run(args.run_a) as run_a, Run(args.run_b) as run_b:
        result = diff_runs(run_a, run_b)
        div, state = result.first, result.state_first
        if div is None and state is not None:
            raise CommandError(
                f"the runs differ in their step-level records only (first at step "
                f"{state.step}): capture needs an op to capture at; record that step op by op "
                f"first ({window_command(state.step)})"
            )
        if div is None:
            print("the runs are identical: no divergence to capture")
            return 0
        targets = [target_of(r.meta, p) for r, p in ((run_a, args.run_a), (run_b, args.run_b))]
        notes = []
        outputs = [
            Path(p)
            for p in args.outputs or (f"{str(r.path).rstrip('/')}-capture" for r in (run_a, run_b))
        ]
        for run_, target, ops, output in (
            (run_a, targets[0], [div.a, div.observed_a], outputs[0]),
            (run_b, targets[1], [div.b, div.observed_b], outputs[1]),
        ):
            spec = CaptureSpec.of_indices(_indices(ops, args.window))
            limit = run_.meta.get("steps_limit")
            steps = div.step + 1 if limit is None else min(limit, div.step + 1)
            _record(run_, target, output, spec, steps, args)
            notes += [n for op in ops if (n := _check(run_, output, div.rank, op))]
    new_a, new_b = outputs
    rank = f" --rank {div.rank}" if div.rank else ""
    index = div.observed_a.index
    print(f"captured the first divergence ({div.kind}, #{index} {div.observed_a.op}):")
    for note in notes:
        print(f"  note: {note}")
    print("next:")
    print(
        f"  opguard tensor {shlex.quote(str(new_a))} {shlex.quote(str(new_b))} --op {index}{rank}"
    )
    if div.observed_a.rng is None:  # a random op's result cannot be replayed
        print(
            f"  opguard replay {shlex.quote(str(new_a))} --op {index} "
            f"--against {shlex.quote(str(new_b))}{rank}"
        )
    return 0
