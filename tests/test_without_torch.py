"""An analysis install has no torch: every reading command works there, and the commands that
run PyTorch say in one line where to run them.

Each command runs in a child process whose imports of torch fail (a meta-path finder raises, as
an environment without torch would), on the real traces the repository ships (the same script
recorded with torch 2.11 and 2.13). ``.ci/run`` also installs OpGuard into a venv that has no
torch and runs ``opguard diff`` and ``opguard explain`` there.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import pytest

CROSS_PAIR = [
    Path(__file__).parent / "data" / "cross_version" / f"torch-{v}" for v in ("2.11", "2.13")
]

# `python -c` this, then the command's arguments: opguard's CLI with torch unimportable.
WITHOUT_TORCH = textwrap.dedent(
    """
    import sys

    class NoTorch:
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] == "torch":
                raise ModuleNotFoundError(f"No module named {name!r}", name=name)
            return None

    sys.meta_path.insert(0, NoTorch())
    from opguard.cli import main
    main(sys.argv[1:])
    """
)


def _without_torch(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-c", WITHOUT_TORCH, *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
    )


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str]:
    """The shipped traces, copied (opening an LMDB environment writes its lock file)."""
    root = tmp_path_factory.mktemp("cross_version")
    a, b = (shutil.copytree(run, root / run.name) for run in CROSS_PAIR)
    return str(a), str(b)


@pytest.mark.parametrize(
    ("args", "code", "says"),
    [
        (("diff", "{a}", "{b}"), 1, "First observed difference"),
        (("diff", "{a}", "{b}", "--json"), 1, '"schema":"opguard.diff/1"'),
        (("explain", "{a}", "{b}"), 1, "verdict: diverged"),
        (("show", "{a}"), 0, "torch 2.11"),
        (("nan", "{a}"), 0, ""),
        (("tools",), 0, "producers"),
    ],
)
def test_reading_commands_run_without_torch(
    pair: tuple[str, str], tmp_path: Path, args: tuple[str, ...], code: int, says: str
) -> None:
    a, b = pair
    done = _without_torch(*(arg.format(a=a, b=b) for arg in args), cwd=tmp_path)
    assert done.returncode == code, done.stderr
    assert "Traceback" not in done.stderr
    assert says in done.stdout


@pytest.mark.parametrize(
    "args",
    [
        ("record", "-o", "run", "--", "train.py"),
        ("replay", "{a}", "--op", "3"),
        ("demo", "--dir", "demo"),
    ],
)
def test_commands_that_run_torch_say_where_to_run_them(
    pair: tuple[str, str], tmp_path: Path, args: tuple[str, ...]
) -> None:
    (tmp_path / "train.py").write_text("import torch\n")
    done = _without_torch(*(arg.format(a=pair[0]) for arg in args), cwd=tmp_path)
    assert done.returncode == 2
    lines = done.stderr.splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"opguard: error: opguard {args[0]} runs PyTorch"), lines[0]
    assert "--python PY" in lines[0]
    assert not done.stdout  # refused before anything else is said


def test_record_with_python_runs_the_training_environments_torch(tmp_path: Path) -> None:
    """``--python PY``: OpGuard without torch records a script with the torch of PY's
    environment (here this one's), as a laptop's analysis install drives a training venv."""
    script = tmp_path / "train.py"
    script.write_text("import torch\nprint((torch.ones(3) * 2).sum().item())\n")
    run = tmp_path / "run"
    done = _without_torch(
        "record", "-o", str(run), "--python", sys.executable, "--", str(script), cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert "6.0" in done.stdout
    shown = _without_torch("show", str(run), "--ops", "0:10", cwd=Path(tempfile.gettempdir()))
    assert "aten::mul.Tensor" in shown.stdout, shown.stdout + shown.stderr
