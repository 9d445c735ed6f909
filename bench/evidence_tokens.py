"""What the evidence bundle saves: for every scenario pair of the test suite, the tokens of the
bundle next to the tokens of what one would otherwise paste into a model, namely both runs'
full stdout and stderr plus the unfiltered op dump of both runs (``opguard show RUN --ops 0:
--json``).

Tokens are counted with LiteLLM's ``token_counter`` for ``groq/openai/gpt-oss-20b``, the model
the offline estimate (what ``opguard explain`` without a model reports, LiteLLM unimported)
approximates; the estimate and its error are shown beside the count. The scenarios are recorded
with ``opguard record`` into ``--dir`` (runs already there are reused).

    python bench/evidence_tokens.py [--dir DIR] [--json F]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))

from scenario_runs import PAIRS, Recordings  # noqa: E402

from opguard.agent.evidence import COUNT_MODEL, build_evidence  # noqa: E402
from opguard.agent.llm import count_tokens  # noqa: E402
from opguard.analysis import diff_runs  # noqa: E402
from opguard.store import Run  # noqa: E402


def recorded(root: Path, names: set[str]) -> dict[str, Path]:
    """Run directories for ``names``, recording those not already under ``root``."""
    missing = sorted(n for n in names if not (root / n / "meta.json").is_file())
    if missing:
        print(f"recording {', '.join(missing)} …", file=sys.stderr, flush=True)
        Recordings(root)(*missing)
    return {n: root / n for n in names}


def op_dump(run_dir: Path) -> str:
    """``opguard show RUN --ops 0: --json``: every op of every rank, as a user gets it."""
    return subprocess.run(
        [sys.executable, "-m", "opguard", "show", str(run_dir.resolve()), "--ops", "0:", "--json"],
        cwd=tempfile.gettempdir(),  # a source checkout in the cwd would shadow the install
        capture_output=True,
        text=True,
        check=True,
    ).stdout


def logs(run_dir: Path) -> str:
    return "".join(
        (run_dir.parent / f"{run_dir.name}.{stream}").read_text() for stream in ("stdout", "stderr")
    )


def measure(run_a: Path, run_b: Path) -> dict[str, object]:
    with Run(run_a) as a, Run(run_b) as b:
        result = diff_runs(a, b)
        evidence = build_evidence(result, a, b)
    first = result.first
    raw_logs = logs(run_a) + logs(run_b)
    dump = op_dump(run_a) + op_dump(run_b)
    bundle_tokens = count_tokens(COUNT_MODEL, text=evidence.text)
    log_tokens = count_tokens(COUNT_MODEL, text=raw_logs)
    dump_tokens = count_tokens(COUNT_MODEL, text=dump)
    return {
        "pair": f"{run_a.name} vs {run_b.name}",
        "verdict": evidence.verdict,
        "cause": first.cause if first else "-",
        "bundle_tokens": bundle_tokens,
        "estimate": evidence.tokens,
        "estimate_error": evidence.tokens / bundle_tokens - 1,
        "log_tokens": log_tokens,
        "dump_tokens": dump_tokens,
        "ratio": (log_tokens + dump_tokens) / bundle_tokens,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--dir", type=Path, help="where the scenario runs are (default: temp)")
    parser.add_argument("--json", type=Path, metavar="F", help="also write the rows as JSON")
    args = parser.parse_args()
    root = args.dir or Path(tempfile.mkdtemp(prefix="opguard-evidence-"))
    root.mkdir(parents=True, exist_ok=True)
    runs = recorded(root, {name for pair in PAIRS for name in pair})
    rows = [measure(runs[a], runs[b]) for a, b in PAIRS]
    header = (
        f"{'pair':<24} {'verdict':<9} {'cause':<9} {'bundle':>7} {'estimate':>14} "
        f"{'logs':>7} {'op dump':>10} {'saving':>8}"
    )
    print(f"tokens counted for {COUNT_MODEL}\n{header}")
    for r in rows:
        estimate = f"{r['estimate']:,} ({r['estimate_error']:+.1%})"
        print(
            f"{r['pair']:<24} {r['verdict']:<9} {r['cause']:<9} {r['bundle_tokens']:>7,} "
            f"{estimate:>14} {r['log_tokens']:>7,} {r['dump_tokens']:>10,} {r['ratio']:>7,.0f}x"
        )
    if args.json:
        args.json.write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
