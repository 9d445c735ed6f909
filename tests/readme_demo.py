"""The README's demo block is ``opguard demo``'s real output: ``python tests/readme_demo.py``
runs the demo and writes its output into README.md; tests/test_readme_demo.py runs it again and
checks the README still shows what it prints.

The demo runs in an empty directory (it records with one thread whatever the machine has: the
losses' last digits depend on how many threads sum them). Two things in its output depend on
the machine and are normalised:

- where OpGuard is installed: the bundled scripts' call sites read ``…/train_baseline.py``;
- the numbers a CPU's kernels compute (fingerprints, values, raw bits, stats, losses, and how
  many aligned ops differ in their last bits): the README names the torch version, CPU
  capability and CPU it was written with, and where those differ the check compares everything
  but these numbers (the other counts, op indices, line numbers, sections and wording stay
  exact).
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

import opguard

README = Path(__file__).resolve().parent.parent / "README.md"
DEMO_SCRIPTS = Path(opguard.__file__).resolve().parent / "demo"
MARKER = "<!-- opguard demo output, written by python tests/readme_demo.py ({}) -->"
_BLOCK = re.compile(
    re.escape(MARKER).replace(re.escape("{}"), "(?P<made_in>[^\n]*)")
    + r"\n```text\n(?P<body>.*?)```\n",
    re.S,
)
# Machine-dependent numbers: fingerprints, raw bits, numbers with a fraction or exponent, and
# the count of aligned ops whose outputs differ (which last bits differ is the kernels' doing).
_NUMBERS = (
    (re.compile(r"\b\d+ aligned ops differ\b"), "<count> aligned ops differ"),
    (re.compile(r"\bfp [0-9a-f]{16}\b"), "fp <fingerprint>"),
    (re.compile(r"\b0x[0-9a-f]+\b"), "<bits>"),
    (re.compile(r"-?\b\d+\.\d+(?:e[-+]?\d+)?\b|-?\b\d+e[-+]?\d+\b"), "<number>"),
)


def environment() -> str:
    """What the numbers depend on: the torch build, the CPU kernels it dispatches to, and the
    CPU (one capability runs other code paths on another vendor's CPU: the losses' last digits
    of an AVX512 Intel Xeon and an AVX512 AMD EPYC differ)."""
    import torch

    return f"torch {torch.__version__}, {torch.backends.cpu.get_cpu_capability()}, {cpu_model()}"


def cpu_model() -> str:
    """The CPU's model name, as Linux reports it ("unknown CPU" elsewhere)."""
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
    except OSError:
        return "unknown CPU"
    names = (line.split(":", 1)[1].strip() for line in lines if line.startswith("model name"))
    return next(names, "unknown CPU")


def run_demo() -> str:
    """``opguard demo``'s output, as a first-time user sees it, normalised (see above)."""
    with tempfile.TemporaryDirectory() as empty:
        done = subprocess.run(
            [sys.executable, "-m", "opguard", "demo"],
            cwd=empty,
            capture_output=True,
            text=True,
            timeout=600,
        )
    if done.returncode != 0:
        raise RuntimeError(f"opguard demo failed (exit {done.returncode}): {done.stderr[-2000:]}")
    return done.stdout.replace(f"{DEMO_SCRIPTS}{os.sep}", "…/")


def readme_block(text: str | None = None) -> tuple[str, str]:
    """The README's demo block and the environment it was written in."""
    found = _BLOCK.search(README.read_text() if text is None else text)
    if found is None:
        raise LookupError(f"{README}: no demo block (a {MARKER.format('…')} line, then ```text)")
    return found["body"], found["made_in"]


def without_numbers(text: str) -> str:
    for pattern, placeholder in _NUMBERS:
        text = pattern.sub(placeholder, text)
    return text


def write(output: str) -> None:
    """Puts ``output`` into the README's demo block."""
    text = README.read_text()
    readme_block(text)  # it must be there
    block = f"{MARKER.format(environment())}\n```text\n{output}```\n"
    README.write_text(_BLOCK.sub(lambda _: block, text, count=1))


if __name__ == "__main__":
    write(run_demo())
    print(f"{README}: demo block written ({environment()})")
