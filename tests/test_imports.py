"""Layering, as docs/ARCHITECTURE.md states it: a training job that records never pays for a
front end (Textual, LiteLLM), and reading a trace (``opguard.store``, ``opguard show``) never imports torch.

Each check runs in a fresh interpreter with an import hook that refuses the forbidden packages
and remembers every attempt, so a guarded ``try: import textual`` is caught as well as a plain
one; ``sys.modules`` is checked afterwards too.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

import opguard

BLOCKER = """
import importlib.abc
import sys

class Refuse(importlib.abc.MetaPathFinder):
    def __init__(self, names):
        self.names = set(names)
        self.attempts = []

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in self.names:
            import traceback
            self.attempts.append((name, "".join(traceback.format_stack(limit=12))))
            raise ImportError(f"import of {name} refused by the test")
        return None

refuse = Refuse(FORBIDDEN)
sys.meta_path.insert(0, refuse)

def report(**extra):
    import json
    loaded = sorted({m.partition(".")[0] for m in sys.modules} & refuse.names)
    print("RESULT " + json.dumps({"attempts": refuse.attempts, "loaded": loaded, **extra}))
"""


def run_guarded(forbidden: list[str], body: str, cwd: Path) -> dict:
    """Runs ``body`` in a fresh interpreter that refuses to import ``forbidden``."""
    source = f"FORBIDDEN = {forbidden!r}\n{BLOCKER}\n{textwrap.dedent(body)}"
    result = subprocess.run(
        [sys.executable, "-c", source],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "OMP_NUM_THREADS": "1"},
    )
    lines = [line for line in result.stdout.splitlines() if line.startswith("RESULT ")]
    assert result.returncode == 0 and lines, f"rc={result.returncode}\n{result.stderr}"
    return json.loads(lines[-1].removeprefix("RESULT "))


def cli_without(forbidden: list[str], commands: list[list[str]], cwd: Path) -> dict:
    """Runs ``opguard`` commands in one fresh interpreter that refuses to import ``forbidden``;
    the outcome's ``codes`` are their exit statuses."""
    return run_guarded(
        forbidden,
        f"""
        from opguard.cli import main
        codes = []
        for argv in {commands!r}:
            try:
                main(argv)
            except SystemExit as exc:
                codes.append(exc.code)
        report(codes=codes)
        """,
        cwd,
    )


def _explain(outcome: dict) -> str:
    return "\n\n".join(f"{name} imported from:\n{stack}" for name, stack in outcome["attempts"])


FRONT_ENDS = ["textual", "litellm", "mcp", "textual_serve", "aiohttp"]


def test_recording_loads_no_front_end(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(
        textwrap.dedent("""
        import torch
        model = torch.nn.Linear(4, 4)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        model(torch.ones(2, 4)).sum().backward()
        opt.step()
    """)
    )
    outcome = run_guarded(
        FRONT_ENDS,
        f"""
        import opguard
        from opguard import record, step
        import opguard.recorder
        import opguard.recorder.launch
        import opguard.store
        import torch

        # Record in code ...
        with record({str(tmp_path / "in-code")!r}):
            torch.ones(3).sum()
            step()
        # ... and through the CLI's record command, in this process.
        from opguard.cli import main
        try:
            main(["record", "-o", {str(tmp_path / "cli")!r}, "--", {str(script)!r}])
        except SystemExit as exc:
            code = exc.code
        report(code=code)
    """,
        tmp_path,
    )
    assert outcome["code"] == 0
    assert outcome["attempts"] == [], _explain(outcome)
    assert outcome["loaded"] == []


@pytest.fixture(scope="module")
def small_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    run_dir = tmp_path_factory.mktemp("imports") / "run"
    with opguard.record(run_dir):
        x = torch.arange(6.0).view(2, 3)
        (x * 2).sum()
    return run_dir


def test_reading_a_trace_does_not_import_torch(small_run: Path, tmp_path: Path) -> None:
    outcome = run_guarded(
        ["torch"],
        f"""
        import opguard
        import opguard.store
        from opguard.store import Run
        with Run({str(small_run)!r}) as run:
            ops = [op.to_json() for op in run.rank(0).ops()]
        report(ops=len(ops))
    """,
        tmp_path,
    )
    assert outcome["ops"] > 0
    assert outcome["attempts"] == [], _explain(outcome)
    assert outcome["loaded"] == []


@pytest.mark.parametrize(
    "args",
    [
        ["show", "{run}"],
        ["show", "{run}", "--json"],
        ["show", "{run}", "--ops", "0:3"],
        ["show", "{run}", "--ops", "0:3", "--json"],
        ["show", "{missing}"],
        ["--version"],
    ],
    ids=["show", "show-json", "show-ops", "show-ops-json", "show-error", "version"],
)
def test_cli_show_does_not_import_torch(args: list[str], small_run: Path, tmp_path: Path) -> None:
    argv = [a.format(run=small_run, missing=tmp_path / "missing") for a in args]
    outcome = cli_without(["torch"], [argv], tmp_path)
    assert outcome["codes"] == [2 if "{missing}" in args else 0]
    assert outcome["attempts"] == [], _explain(outcome)
    assert outcome["loaded"] == []


def test_the_import_hook_sees_imports(tmp_path: Path) -> None:
    """The checks above would pass vacuously if the hook missed imports."""
    outcome = run_guarded(
        ["rich"],
        """
        try:
            import opguard.cli.render
        except ImportError:
            pass
        report()
    """,
        tmp_path,
    )
    assert [name for name, _ in outcome["attempts"]] == ["rich"]


def test_the_diff_imports_no_ray_and_says_how_to_install_it_for_ray(
    small_run: Path, tmp_path: Path
) -> None:
    """The one-machine diff is the default and never loads Ray; ``--ray`` where Ray is not
    installed is one line naming the extra to install (exit 2)."""
    plain = cli_without(["ray"], [["diff", str(small_run), str(small_run)]], tmp_path)
    assert plain["codes"] == [0]
    assert plain["attempts"] == [], _explain(plain)
    outcome = run_guarded(
        ["ray"],
        f"""
        import contextlib, io
        from opguard.cli import main
        err = io.StringIO()
        with contextlib.redirect_stderr(err):
            try:
                main(["diff", {str(small_run)!r}, {str(small_run)!r}, "--ray"])
            except SystemExit as exc:
                code = exc.code
        report(code=code, err=err.getvalue())
        """,
        tmp_path,
    )
    assert outcome["code"] == 2
    assert outcome["err"].count("\n") == 1, outcome["err"]
    assert "pip install 'opguard[ray]'" in outcome["err"]
