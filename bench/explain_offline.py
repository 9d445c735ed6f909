"""How long ``opguard explain`` takes without a model (the offline reading), on the demo's runs.

The demo pair is recorded with ``opguard demo --dir DIR`` unless ``DIR`` holds it already. Then
``opguard explain DIR/baseline DIR/refactored`` (text, and ``--json``) runs as a user runs it, a
fresh ``python -m opguard`` process each time, ``--repeat`` times; its wall time is measured
around the subprocess. One more run with ``-X importtime`` says what the command imported of
LiteLLM (the offline reading needs no LLM library) and how long that took.

    python bench/explain_offline.py [--dir DIR] [--repeat N] [--json F]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RUNS = ("baseline", "refactored")  # the directories `opguard demo` records
VARIANTS = {"text": (), "json": ("--json",)}


def opguard(*args: str, options: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    """``python [OPTIONS] -m opguard ARGS`` from a neutral directory (a source checkout in the
    working directory would shadow the installed package)."""
    return subprocess.run(
        [sys.executable, *options, "-m", "opguard", *args],
        cwd=tempfile.gettempdir(),
        capture_output=True,
        text=True,
    )


def demo_runs(root: Path) -> tuple[str, str]:
    """The demo's two run directories under ``root``, recorded first when missing."""
    runs = tuple(str(root / name) for name in RUNS)
    if not all((Path(run) / "meta.json").is_file() for run in runs):
        print(f"recording the demo into {root} …", file=sys.stderr, flush=True)
        result = opguard("demo", "--dir", str(root))
        if result.returncode != 0:
            sys.exit(f"opguard demo failed:\n{result.stderr}")
    return runs[0], runs[1]


def timed_explain(runs: tuple[str, str], extra: tuple[str, ...]) -> float:
    """Wall seconds of one ``opguard explain`` run; it must report the demo's divergence."""
    start = time.perf_counter()
    result = opguard("explain", *runs, *extra)
    seconds = time.perf_counter() - start
    if result.returncode != 1:  # the demo's runs diverge
        sys.exit(f"opguard explain exited {result.returncode}:\n{result.stderr}")
    return seconds


def litellm_imports(runs: tuple[str, str]) -> tuple[int, float]:
    """Modules of LiteLLM the offline ``explain`` imported, and the seconds the outermost
    took (its cumulative import time), from ``-X importtime``."""
    result = opguard("explain", *runs, options=("-X", "importtime"))
    modules, seconds = 0, 0.0
    for line in result.stderr.splitlines():
        if not line.startswith("import time:"):
            continue
        _, cumulative, name = (part.strip() for part in line.split("|"))
        if name == "litellm" or name.startswith("litellm."):
            modules += 1
            if name == "litellm":  # the outermost import has the largest cumulative time
                seconds = max(seconds, int(cumulative) / 1e6)
    return modules, seconds


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--dir", type=Path, help="where the demo's runs are (default: temp)")
    parser.add_argument("--repeat", type=int, default=5, help="runs of each variant (default 5)")
    parser.add_argument("--json", type=Path, metavar="F", help="also write the figures as JSON")
    args = parser.parse_args()
    root = (args.dir or Path(tempfile.mkdtemp(prefix="opguard-explain-"))).resolve()
    runs = demo_runs(root)
    figures: dict[str, object] = {
        "machine": f"{platform.node()}, {os.cpu_count()} CPUs, {platform.platform()}",
        "python": platform.python_version(),
        "load_average": os.getloadavg()[0],
    }
    for name, extra in VARIANTS.items():
        timed_explain(runs, extra)  # warm the page cache and the bytecode
        times = [timed_explain(runs, extra) for _ in range(args.repeat)]
        figures[name] = {"min_s": min(times), "median_s": statistics.median(times)}
        print(
            f"opguard explain {' '.join((*runs, *extra))}"
            + f": median {statistics.median(times):.2f} s, min {min(times):.2f} s "
            f"({args.repeat} runs)"
        )
    modules, seconds = litellm_imports(runs)
    figures["litellm"] = {"modules_imported": modules, "import_s": seconds}
    print(
        f"LiteLLM: {modules} modules imported, {seconds:.2f} s"
        if modules
        else "LiteLLM: not imported"
    )
    print(f"load average at the start: {figures['load_average']:.2f}")
    if args.json:
        args.json.write_text(json.dumps(figures, indent=2))


if __name__ == "__main__":
    main()
