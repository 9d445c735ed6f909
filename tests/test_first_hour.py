"""What a new user meets in the first hour: help written for them, one way of counting steps,
NaN/Inf reported where the runs differ, a source checkout that works in place, tracebacks and
tables as plain Python and a pipe would show them, and the command a run was recorded with.

Bad input (one line, exit status 2) is checked with everything else in tests/test_bad_input.py.
"""

from __future__ import annotations

import ctypes
import json
import os
import re
import shutil
import site
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import warm
from conftest import cli_in_process, run_cli
from traces import TraceBuilder

import opguard
from opguard import _C
from opguard.analysis import diff_runs
from opguard.analysis.align.steps import count_steps
from opguard.cli import build_parser
from opguard.cli.commands.capture import target_of
from opguard.store import Run

pytestmark = pytest.mark.slow  # long in all: started first (conftest.py)

# Three optimizer steps, then one op after the last (the printed loss). With "nan", run B also
# takes the log of a negative number after the last step.
TRAIN = """
    import sys
    import torch

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(3):
        loss = model(torch.ones(3, 4)).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    if "nan" in sys.argv:
        torch.log(loss.detach() - 10)
    print(loss.item())
"""


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """Run A recorded with ``record --json`` (its answer kept) and run B, which adds a NaN."""
    root = tmp_path_factory.mktemp("first-hour")
    script = root / "train.py"
    script.write_text(textwrap.dedent(TRAIN))
    recorded = run_cli("record", "-o", str(root / "a"), "--json", "--", str(script), cwd=root)
    assert recorded.returncode == 0, recorded.stderr
    nan = run_cli("record", "-o", str(root / "b"), "--", str(script), "nan", cwd=root)
    assert nan.returncode == 0, nan.stderr
    return {"a": root / "a", "b": root / "b", "record": json.loads(recorded.stdout)}


def _json(*args: str) -> Any:
    result = run_cli(*args, "--json")
    assert result.returncode in (0, 1), result.stderr
    return json.loads(result.stdout)


# -- help ------------------------------------------------------------------------------------

COMMANDS = sorted(build_parser()._subparsers._group_actions[0].choices)  # type: ignore[union-attr]
MARKUP = re.compile(r"``|:(func|mod|class|meth|attr):|`")


@pytest.mark.parametrize("command", COMMANDS)
def test_each_commands_help_is_written_for_users(command: str) -> None:
    code, out, _ = cli_in_process(command, "--help")
    assert code == 0
    description = " ".join(out.split("\n\n")[1].split())  # the paragraph after the usage
    assert not MARKUP.search(out), out
    assert description[0].isupper() and description.endswith("."), description


def test_the_command_lists_help_starts_where_a_user_starts() -> None:
    code, out, err = cli_in_process()  # bare `opguard`
    assert (code, err) == (0, "")
    assert out.startswith("usage: opguard")
    description = out.split("\n\n")[1]
    assert description.startswith("OpGuard records every op of two PyTorch training runs")
    assert "opguard demo" in out and "opguard COMMAND --help" in out
    assert not MARKUP.search(out) and "gPU" not in out and "Subcommands import" not in out
    for command in COMMANDS:
        assert re.search(rf"^    {command}\b", out, re.M), command


def test_explain_help_shows_its_defaults() -> None:
    _, out, _ = cli_in_process("explain", "--help")
    text = " ".join(out.split())
    for default in ("(default: 0.05)", "(default: 40000)", "(default: 2048)", "(default: 3)"):
        assert default in text, default


def test_an_unknown_option_points_to_the_commands_own_help() -> None:
    code, _, err = cli_in_process("diff", "a", "b", "--bogus")
    assert code == 2
    assert err == "opguard: error: unrecognized arguments: --bogus (see opguard diff --help)\n"


# -- one way of counting steps -----------------------------------------------------------------


def test_every_front_end_counts_steps_the_same_way(runs: dict[str, Any]) -> None:
    from opguard.analysis.browse.rows import RankRows
    from opguard.tui.session import Session

    a = str(runs["a"])
    said = "3 steps + 1 op after the last step"
    recorded = runs["record"]["ranks"][0]
    shown = _json("show", a)["ranks"][0]
    assert (recorded["steps"], recorded["ops_after_last_step"]) == (3, 1)
    assert (shown["steps"], shown["ops_after_last_step"]) == (3, 1)
    rank = _json("diff", a, a)["ranks"][0]
    assert (rank["steps_a"], rank["steps_b"]) == (3, 3)
    assert (rank["ops_after_last_step_a"], rank["ops_after_last_step_b"]) == (1, 1)
    assert f"ops in {said} (" in run_cli("show", a).stdout
    assert f"both runs: {said}" in run_cli("diff", a, a).stdout
    assert f"both runs: {said}" in run_cli("explain", a, a).stdout
    session = Session.open(a, a)
    try:
        rows: RankRows = session.rows(0)
        assert rows.steps_taken == 3 and list(rows.steps) == [0, 1, 2, 3]
    finally:
        session.close()


def test_a_step_limit_in_code_counts_the_steps_recorded(tmp_path: Path) -> None:
    """``opguard.record(steps=2)`` in a longer loop: the training goes on unrecorded, and the
    trace holds two steps (the recorder's own count goes on to five)."""
    script = tmp_path / "limited.py"
    script.write_text(
        textwrap.dedent(
            f"""
            import torch, opguard
            model = torch.nn.Linear(4, 2)
            opt = torch.optim.SGD(model.parameters(), lr=0.1)
            with opguard.record({str(tmp_path / "run")!r}, steps=2):
                for _ in range(5):
                    model(torch.ones(3, 4)).sum().backward()
                    opt.step()
            """
        )
    )
    done = warm.run([sys.executable, str(script)], cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    rank = _json("show", str(tmp_path / "run"))["ranks"][0]
    assert (rank["steps"], rank["ops_after_last_step"]) == (2, 0)


def _written(path: Path, steps: list[int], end: dict[str, Any] | None) -> Path:
    """A trace whose ops carry these step numbers, ended as ``end`` says (None: killed)."""
    trace = TraceBuilder(path)
    for step in steps:
        trace.op("aten::add.Tensor", step=step)
    return trace.close(end or {}, killed=end is None)


@pytest.mark.parametrize(
    ("steps", "end", "expected"),
    [
        ([0, 0, 1, 1, 2], {"status": "finished", "steps": 2}, (2, 1)),
        ([0, 0, 1, 1], {"status": "finished", "steps": 2}, (2, 0)),
        ([0, 0, 1, 1], {"status": "stopped", "steps": 5}, (2, 0)),  # a step limit, in code
        ([0, 0, 1, 2, 2], {"status": "failed", "steps": 2}, (2, 2)),  # failed inside step 2
        ([0, 0, 1, 2, 2, 2], None, (2, 3)),  # killed inside step 2
        ([0, 0, 0], {"status": "finished", "steps": 0}, (0, 3)),  # no optimizer
    ],
)
def test_the_counting_rule(
    tmp_path: Path, steps: list[int], end: dict[str, Any] | None, expected: tuple[int, int]
) -> None:
    with Run(_written(tmp_path / "run", steps, end)) as run:
        trace = run.rank(0)
        by_bisection = count_steps(trace)
        by_histogram = count_steps(trace, {s: steps.count(s) for s in set(steps)})
    assert (by_bisection.steps, by_bisection.ops_after) == expected
    assert by_histogram == by_bisection


def test_a_diff_says_how_two_runs_lengths_differ(tmp_path: Path) -> None:
    longer = _written(tmp_path / "longer", [0, 0, 1, 1, 2, 2], {"status": "finished", "steps": 3})
    tail = _written(tmp_path / "tail", [0, 0, 1, 1, 2], {"status": "finished", "steps": 2})
    plain = _written(tmp_path / "plain", [0, 0, 1, 1], {"status": "finished", "steps": 2})
    with Run(longer) as a, Run(plain) as b:
        rank = diff_runs(a, b).ranks[0]
    assert (rank.steps_a, rank.steps_b) == (3, 2)
    assert rank.notes == ["run A has 1 more step(s) than run B; compared the first 2"]
    with Run(plain) as a, Run(tail) as b:
        rank = diff_runs(a, b).ranks[0]
    assert (rank.steps_a, rank.steps_b) == (2, 2)
    assert rank.notes == ["run B has 1 op(s) after its last step, run A none: not compared"]


# -- NaN / Inf in a diff: where the runs differ ------------------------------------------------


def test_nan_and_inf_both_runs_meet_alike_are_one_line(demo_runs: tuple[Path, Path]) -> None:
    """The demo's causal mask is filled with -inf in both runs: no difference to report."""
    a, b = map(str, demo_runs)
    report = run_cli("diff", a, b).stdout
    lines = [line for line in report.splitlines() if "NaN" in line or "Inf" in line]
    assert len(lines) == 1, report
    assert lines[0].startswith("NaN / Inf: the same in both runs (rank 0: 8 op(s)"), lines[0]
    assert "aten::masked_fill.Scalar" in lines[0]
    nonfinite = _json("diff", a, b)["nonfinite"]
    assert nonfinite["same_in_both"] is True
    assert len(nonfinite["a"]) == len(nonfinite["b"]) == 1  # the data is kept


def test_nan_that_only_one_run_makes_is_reported(runs: dict[str, Any]) -> None:
    a, b = str(runs["a"]), str(runs["b"])
    report = run_cli("diff", a, b).stdout
    section = report.split("NaN / Inf\n")[1].split("\n\n")[0]
    assert "run A rank 0: no NaN or Inf" in section
    assert "run B rank 0: 1 op(s) output NaN or Inf" in section
    assert "aten::log.default" in section
    nonfinite = _json("diff", a, b)["nonfinite"]
    assert nonfinite["same_in_both"] is False
    assert nonfinite["a"] == [] and nonfinite["b"][0]["origin"]["op"] == "aten::log.default"


# -- a source checkout, run in place ------------------------------------------------------------


def _package_copy(into: Path, *, built: bool) -> None:
    """OpGuard's Python package copied into ``into``, with the built extension or without."""
    source = Path(opguard.__file__).parent
    shutil.copytree(source, into / "opguard", ignore=shutil.ignore_patterns("__pycache__", "_C.*"))
    if built:
        shutil.copy(_C.__file__, into / "opguard")


def _site_without_opguard(into: Path) -> Path:
    """This environment's site-packages without OpGuard itself (links to everything else):
    the libraries a checkout imports, and no installed OpGuard to defer to."""
    into.mkdir()
    for directory in map(Path, site.getsitepackages()):
        for entry in directory.iterdir():
            if "opguard" not in entry.name.lower() and not (into / entry.name).exists():
                (into / entry.name).symlink_to(entry)
    return into


def _python_without_site(
    *args: str, cwd: Path, path: list[Path], sites: list[str] | None = None
) -> subprocess.CompletedProcess:
    """Python as a non-editable install leaves it, run from ``cwd``: ``path`` is all it adds
    to ``sys.path`` after the working directory, then ``sites`` (default: this environment's
    site-packages; no .pth file: no editable-install finder)."""
    entries = [*map(str, path), *(site.getsitepackages() if sites is None else sites)]
    return subprocess.run(
        [sys.executable, "-S", *args],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(entries)},
    )


def test_the_source_tree_defers_to_the_installed_package(tmp_path: Path) -> None:
    """``pip install .`` then, at the repository root, the README's ``import opguard._C``
    check and ``python -m opguard``: the unbuilt source tree comes first on sys.path."""
    installed, checkout = tmp_path / "site-packages", tmp_path / "checkout"
    _package_copy(installed, built=True)
    _package_copy(checkout, built=False)
    (tmp_path / "train.py").write_text("import torch\nprint((torch.ones(2) * 2).sum().item())\n")
    check = _python_without_site(
        "-c", "import opguard._C as C; print(C.cuda_status())", cwd=checkout, path=[installed]
    )
    assert check.returncode == 0, check.stderr
    run = str(tmp_path / "run")
    recorded = _python_without_site(
        "-m",
        "opguard",
        "record",
        "-o",
        run,
        "--",
        str(tmp_path / "train.py"),
        cwd=checkout,
        path=[installed],
    )
    assert recorded.returncode == 0, recorded.stderr
    assert recorded.stdout == "4.0\n" and Run(run).rank(0).finished


def test_an_uninstalled_source_tree_says_what_to_do(tmp_path: Path) -> None:
    checkout = tmp_path / "checkout"
    _package_copy(checkout, built=False)
    (tmp_path / "train.py").write_text("print('should not run')\n")
    done = _python_without_site(
        "-m",
        "opguard",
        "record",
        "-o",
        str(tmp_path / "run"),
        "--",
        str(tmp_path / "train.py"),
        cwd=checkout,
        path=[],
        sites=[str(_site_without_opguard(tmp_path / "site-packages"))],
    )
    assert done.returncode == 2 and "should not run" not in done.stdout
    assert done.stderr.startswith("opguard: error: OpGuard's compiled part (opguard._C) is not")
    assert len(done.stderr.splitlines()) == 1 and "pip install" in done.stderr


def test_cuda_status_says_when_there_is_no_driver() -> None:
    if not _C.CUDA_BUILT:
        pytest.skip("built without CUDA")
    try:
        ctypes.CDLL("libcuda.so.1")
    except OSError:
        assert _C.cuda_status() == (False, "CUDA is unavailable: no NVIDIA driver")
    else:
        pytest.skip("an NVIDIA driver is installed here")


# -- what a script's failure, a piped table and a run's command line look like -----------------


def test_a_recorded_scripts_traceback_is_the_one_python_shows(tmp_path: Path) -> None:
    script = tmp_path / "fails.py"
    script.write_text(
        textwrap.dedent(
            """
            import torch

            def project(x):
                return x @ torch.ones(3, 3)

            project(torch.ones(2, 2))
            """
        )
    )
    plain = warm.run([sys.executable, str(script)])
    recorded = run_cli("record", "-o", str(tmp_path / "run"), "--", str(script), cwd=tmp_path)
    assert plain.returncode == recorded.returncode == 1
    assert recorded.stderr == plain.stderr
    assert recorded.stderr.startswith(f'Traceback (most recent call last):\n  File "{script}"')


def test_a_piped_op_table_keeps_each_op_on_one_line(runs: dict[str, Any]) -> None:
    a = str(runs["a"])
    last = Run(a).rank(0).last_op()
    assert last is not None
    table = run_cli("show", a, "--ops", f"{last[0] - 2}:{last[0] + 1}").stdout  # piped
    rows = [line.split("│")[1:-1] for line in table.splitlines() if line.startswith("│")]
    ops = [cells[3].strip() for cells in rows if cells[3].strip()]
    sites = [cells[4].strip() for cells in rows if cells[4].strip()]
    assert ops[-1] == "aten::_local_scalar_dense.default", table
    assert len(ops) == len(sites) == 3 and all(op.startswith("aten::") for op in ops), table
    assert all(re.fullmatch(r"train\.py:\d+ \(<module>\)", site) for site in sites), table


def test_show_tells_the_whole_command_and_a_capture_that_matched_nothing(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(TRAIN))
    run = str(tmp_path / "run")
    recorded = run_cli(
        *("record", "-o", run, "--steps", "2", "--capture", "zz:abc:1", "--", str(script)),
        cwd=tmp_path,
    )
    assert recorded.returncode == 0, recorded.stderr
    assert "opguard: capture zz:abc:1 matched no op: nothing was captured" in recorded.stderr
    shown = run_cli("show", run).stdout
    assert f"command: opguard record -o {run} --steps 2 --capture zz:abc:1 -- {script}" in shown


def test_capture_reruns_a_recorded_command_with_its_switches() -> None:
    command = ["opguard", "record", "-o", "r", "--steps", "2", "--eager", "--capture", "3"]
    assert target_of({"command": [*command, "--", "t.py", "--x"]}, "r") == [
        "--eager",
        "--",
        "t.py",
        "--x",
    ]
    module = ["opguard", "record", "-o", "r", "--verify-inputs", "-m", "pkg.train", "a"]
    assert target_of({"command": module}, "r") == ["--verify-inputs", "-m", "pkg.train", "a"]
