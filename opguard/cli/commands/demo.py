"""``opguard demo [--dir DIR]``: record the bundled example pair on the CPU and diff it.

The example is a small GPT-style model and a refactor of it that was meant to change nothing;
the diff names the one line that did.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

from .base import CommandError

DEMO_DIR = Path(__file__).resolve().parents[2] / "demo"
SCRIPTS = (("baseline", "train_baseline.py"), ("refactored", "train_refactored.py"))


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser(
        "demo",
        help="record the bundled example pair on the CPU and diff it",
        description=__doc__.splitlines()[0] if __doc__ else None,
    )
    p.add_argument(
        "--dir",
        default="opguard-demo",
        metavar="DIR",
        help="where to keep the two runs (default: ./opguard-demo)",
    )
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    root = Path(args.dir).resolve()
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CommandError(
            f"{args.dir}: cannot create the demo directory ({exc.strerror})"
        ) from None
    runs = []
    for name, script in SCRIPTS:
        run_dir = root / name
        print(f"$ opguard record -o {run_dir} -- {script}", flush=True)
        code = subprocess.run(
            [
                sys.executable,
                "-m",
                "opguard",
                "record",
                "-o",
                str(run_dir),
                "--overwrite",
                "--",
                str(DEMO_DIR / script),
            ],
            # `python -m` puts the working directory first on sys.path: a source checkout
            # there would shadow the installed package.
            cwd=root,
        ).returncode
        if code != 0:
            raise CommandError(f"recording {script} failed (exit status {code})")
        runs.append(str(run_dir))
    print(f"\n$ opguard diff {runs[0]} {runs[1]}", flush=True)
    code = subprocess.run([sys.executable, "-m", "opguard", "diff", *runs], cwd=root).returncode
    print(
        f"\nNext: opguard show {runs[1]} --ops 170:180   ·   opguard diff {runs[0]} {runs[1]} --json"
    )
    return 0 if code in (0, 1) else code
