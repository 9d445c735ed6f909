"""``opguard demo [--dir DIR]``: record the bundled example pair on the CPU and diff it.

The example is a small GPT-style model and a refactor of it that was meant to change nothing;
the diff names the one line that did. The README shows this command's output as it is
(tests/readme_demo.py writes it there, and a test checks it). Both runs record with one
intra-op thread: the losses' last digits depend on how many threads sum them, and the demo
should print what the README shows on any machine with that CPU.
"""

from __future__ import annotations

import argparse
import importlib
import os
import subprocess
import sys
from pathlib import Path

from ...analysis import diff_runs
from ...store import Run
from .base import CommandError, directory_name

DEMO_DIR = Path(__file__).resolve().parents[2] / "demo"
SCRIPTS = (("baseline", "train_baseline.py"), ("refactored", "train_refactored.py"))


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "demo",
        help="record the bundled example pair on the CPU and diff it",
        description="Records a small GPT-style model and a refactor of it that was meant to "
        "change nothing (on the CPU, in seconds), then diffs the two runs: the report names the "
        "one line that changed the numbers.",
    )
    p.add_argument(
        "--dir",
        default="opguard-demo",
        type=directory_name,
        metavar="DIR",
        help="where to keep the two runs (default: ./opguard-demo)",
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    # The demo records: where torch is missing, the one-line refusal before any output.
    importlib.import_module("torch")
    root = Path(args.dir).resolve()
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CommandError(
            f"{args.dir}: cannot create the demo directory ({exc.strerror})"
        ) from None
    runs = []  # as the person would type them: under DIR as given
    for name, script in SCRIPTS:
        shown = str(Path(args.dir) / name)
        print(f"$ opguard record -o {shown} -- {script}", flush=True)
        code = subprocess.run(
            [
                sys.executable,
                "-m",
                "opguard",
                "record",
                "-o",
                str(root / name),
                "--overwrite",
                "--",
                str(DEMO_DIR / script),
            ],
            # `python -m` puts the working directory first on sys.path: a source checkout
            # there would shadow the installed package.
            cwd=root,
            env={**os.environ, "OMP_NUM_THREADS": "1"},
        ).returncode
        if code != 0:
            raise CommandError(f"recording {script} failed (exit status {code})")
        runs.append(shown)
    print(f"\n$ opguard diff {runs[0]} {runs[1]}", flush=True)
    from ..diff_report import print_diff  # rich: only when a report is printed

    with Run(runs[0]) as run_a, Run(runs[1]) as run_b:
        print_diff(diff_runs(run_a, run_b))
    print(
        f"\nNext: opguard show {runs[1]} --ops 170:180   ·   opguard diff {runs[0]} {runs[1]} --json"
    )
    return 0
