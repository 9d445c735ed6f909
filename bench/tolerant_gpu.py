"""Issue 38's GPU calibration pairs (``tests/tolerant_runs.py``'s :data:`GPU_PAIRS`): records
every run they need on this machine's GPU, runs ``opguard diff --tolerant`` on each pair, and
says whether its answer is the expected one (rounding-only pairs within rounding; a real change
behind the rounding named at its op and step), the fit half and the held-out half apart.

    python bench/tolerant_gpu.py --root DIR [--pairs NAME,NAME] [--json FILE]

``--root`` keeps the recordings (reused when present), so that
``bench/tolerant_calibration.py RUN_A RUN_B`` can measure each family's margin on them, here or
on another machine (the traces read without torch). ``bash bench/gpu_session.sh tolerant`` runs
it and brings the traces back as one archive.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from opguard.analysis import diff_runs
from opguard.analysis.contract import to_json
from opguard.analysis.tolerant.rule import Tolerance
from opguard.store import Run

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))  # the scenario runs
from tolerant_runs import GPU_PAIRS, record_runs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--root", type=Path, required=True, help="where the runs are recorded")
    parser.add_argument("--pairs", help="comma-separated names of GPU_PAIRS (default: all)")
    parser.add_argument("--json", type=Path, help="each pair's answer, as JSON")
    args = parser.parse_args()
    names = args.pairs.split(",") if args.pairs else list(GPU_PAIRS)
    pairs = {name: GPU_PAIRS[name] for name in names}
    runs = sorted({run for pair in pairs.values() for run in (pair.a, pair.b)})
    missing = [run for run in runs if not (args.root / run / "meta.json").exists()]
    args.root.mkdir(parents=True, exist_ok=True)
    if missing:
        record_runs(args.root, missing)
    rows = []
    for half in (False, True):
        print("held out:" if half else "fit:")
        for name, pair in pairs.items():
            if pair.held_out != half:
                continue
            with Run(args.root / pair.a) as run_a, Run(args.root / pair.b) as run_b:
                out = to_json(diff_runs(run_a, run_b, tolerance=Tolerance()))
            right, said = pair.check(out)
            expected = "within rounding" if pair.kind is None else f"{pair.kind} at {pair.op}"
            print(f"  {'right' if right else 'WRONG':5s}  {name:22s} expected {expected}; {said}")
            rows.append({"pair": name, "held_out": half, "right": right, "said": said})
    for half in (False, True):
        mine = [row for row in rows if row["held_out"] == half]
        score = sum(row["right"] for row in mine)
        print(f"{'held out' if half else 'fit'}: {score}/{len(mine)} right")
    if args.json:
        args.json.write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
