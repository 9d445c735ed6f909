"""The wheel installs and records where there is no compiler.

``tools/build_wheel.sh``'s wheel for this Python (``.ci/run`` builds it first) is installed into
a fresh venv whose PATH holds only the venv's own programs (no cc, c++, nvcc or cmake; CC and
CXX unset), with ``torch==2.13.0``; there ``opguard demo`` records both demo runs and diffs
them. Skipped when dist/ holds no wheel for this Python.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TAG = "cp{}{}".format(*sys.version_info[:2])
WHEELS = sorted((ROOT / "dist").glob(f"opguard-*-{TAG}-{TAG}-*.whl"))
COMPILERS = ("cc", "c++", "gcc", "g++", "clang", "clang++", "nvcc", "cmake")
BUILD_VARIABLES = ("CC", "CXX", "CUDACXX", "CUDAHOSTCXX", "CMAKE_ARGS")


@pytest.mark.slow
@pytest.mark.skipif(
    len(WHEELS) != 1,
    reason=f"wants one {TAG} wheel in dist/ (found {len(WHEELS)}): bash tools/build_wheel.sh",
)
def test_the_wheel_installs_and_records_without_a_compiler(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    bin_dir = venv / "bin"
    env = {k: v for k, v in os.environ.items() if k not in (*BUILD_VARIABLES, "PYTHONPATH")}
    env["PATH"] = str(bin_dir)
    assert [c for c in COMPILERS if shutil.which(c, path=env["PATH"])] == []

    def run(*args: str | Path) -> subprocess.CompletedProcess[str]:
        done = subprocess.run(
            [str(a) for a in args], env=env, cwd=tmp_path, capture_output=True, text=True
        )
        assert done.returncode == 0, f"{args}: exit {done.returncode}\n{done.stdout}{done.stderr}"
        return done

    # --no-compile: no bytecode for torch's thousands of files, which this test never imports
    # twice; what is checked is that nothing needs a C or C++ compiler.
    pip = (bin_dir / "python", "-m", "pip", "install", "-q", "--no-compile")
    run(*pip, "torch==2.13.0")
    run(*pip, WHEELS[0])

    loaded = run(bin_dir / "python", "-c", "import opguard._C as C; print(C.__file__)")
    assert Path(loaded.stdout.strip()).is_relative_to(venv), loaded.stdout

    demo = run(bin_dir / "opguard", "demo", "--dir", tmp_path / "demo")
    assert "DIVERGED" in demo.stdout, demo.stdout
    assert "argument eps: 1e-05 (A) vs 1e-06 (B)" in demo.stdout, demo.stdout
