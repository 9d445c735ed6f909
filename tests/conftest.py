"""Shared fixtures: recording scripts through the real CLI in a subprocess.

The tests run in parallel, in pytest-xdist workers (pyproject.toml's addopts): a test writes
only under its tmp_path, listens on port 0, names anything machine-wide after its process id,
and a recording several modules read is made once per run with ``run_once.made_once`` (a
session-scoped fixture runs once per worker). The rules in full: docs/INSTALL.md, "Running the
tests".
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import subprocess
import sys
import tempfile
import textwrap
from collections.abc import Callable
from pathlib import Path

import pytest
import warm
from browser import browser_page, chromium  # noqa: F401  (fixtures of every module)
from run_once import BATCH_TIMEOUT, made_once

REPO = Path(__file__).resolve().parent.parent


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Modules that hold a test marked ``slow`` first. pytest-xdist hands whole modules to its
    workers in this order (pyproject.toml's addopts): the long ones start at once and the short
    ones fill in behind them, so the workers end together rather than one waiting on the
    other's last long module."""
    slow = {item.path for item in items if item.get_closest_marker("slow")}
    items.sort(key=lambda item: item.path not in slow)  # stable: each module's order kept


def line_of(script: Path, tag: str) -> int:
    """The line of ``script`` tagged ``# <- TAG``."""
    pattern = re.compile(rf"#\s*<-\s*{re.escape(tag)}(\s|$)")
    lines = [n for n, text in enumerate(script.read_text().splitlines(), 1) if pattern.search(text)]
    assert len(lines) == 1, f"{script.name}: tag {tag!r} on lines {lines}"
    return lines[0]


def opguard_cmd(*args: str) -> list[str]:
    """The command line of ``opguard ARGS`` as a user runs it (``python -m opguard``)."""
    return [sys.executable, "-m", "opguard", *args]


# The commands that import torch: run in a fork of a process that did already (warm.py).
WARM_COMMANDS = ("record", "replay")


def run_cli(
    *args: str, cwd: Path | None = None, timeout: float = 300, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Runs ``opguard ARGS`` as a user would (``python -m opguard``), capturing output. Never
    from the repository root, where the source tree would shadow the installed package."""
    command, where = opguard_cmd(*args), cwd or tempfile.gettempdir()
    full_env = {**os.environ, **(env or {})}
    if args and args[0] in WARM_COMMANDS:
        return warm.run(command, cwd=where, env=full_env, timeout=timeout)
    return subprocess.run(
        command, cwd=where, capture_output=True, text=True, timeout=timeout, env=full_env
    )


def cli_in_process(*args: str) -> tuple[int, str, str]:
    """``opguard ARGS`` in this process: exit status, stdout, stderr."""
    from opguard.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(list(args))
            code = 0
        except SystemExit as exit_:
            code = int(exit_.code or 0)
    return code, out.getvalue(), err.getvalue()


@pytest.fixture
def write_script(tmp_path: Path) -> Callable[[str, str], Path]:
    """Writes a dedented Python script into the test's directory and returns its path."""

    def write(name: str, source: str) -> Path:
        path = tmp_path / name
        path.write_text(textwrap.dedent(source))
        return path

    return write


@pytest.fixture
def record(tmp_path: Path) -> Callable[..., Path]:
    """Records a script with ``opguard record`` and returns the run directory."""

    def record_script(
        script: Path, *script_args: str, name: str | None = None, extra: tuple[str, ...] = ()
    ) -> Path:
        run_dir = tmp_path / (name or script.stem + "-run")
        result = run_cli(
            "record", "-o", str(run_dir), *extra, "--", str(script), *script_args, cwd=tmp_path
        )
        assert result.returncode == 0, result.stderr
        return run_dir

    return record_script


DEMO_RUNS = ("baseline", "refactored")


def _record_demo(root: Path) -> None:
    """Records the demo pair into ``root``, both at once."""
    recordings = []
    for name in DEMO_RUNS:
        script = REPO / "opguard" / "demo" / f"train_{name}.py"
        command = opguard_cmd("record", "-o", str(root / name), "--", str(script))
        recordings.append(warm.Popen(command, cwd=root))  # never the repository root: run_cli
    for recording in recordings:
        _, err = recording.communicate(timeout=BATCH_TIMEOUT)
        assert recording.returncode == 0, err


@pytest.fixture(scope="session")
def demo_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """The bundled demo pair (``opguard demo``), recorded once per test run (run_once.py)."""
    root = made_once(tmp_path_factory, "demo", _record_demo)
    baseline, refactored = (root / name for name in DEMO_RUNS)
    return baseline, refactored


TP_RUNS = ["tp1", "tp2", "tp2_bug"]


@pytest.fixture(scope="session")
def tp_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """``tests/data/tolerant/tp_mlp.py`` as TP=1, TP=2 (gloo, DTensor) and TP=2 with its
    sharding bug, recorded once per test run for every test of layouts (all at once)."""
    from tolerant_runs import record_runs

    root = made_once(tmp_path_factory, "tp", lambda root: record_runs(root, TP_RUNS))
    return {name: root / name for name in TP_RUNS}
