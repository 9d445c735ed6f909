"""The front ends on runs recorded at step level: the TUI's step list and its detail, the
agent's evidence bundle and offline reading, ``opguard explain``. Runs written by
:mod:`state_runs` with the real writer."""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from conftest import cli_in_process
from rich.console import Console
from state_runs import write_state_run
from textual.widgets import Static

from opguard.agent.evidence import build_evidence
from opguard.analysis import diff_runs
from opguard.store import Run
from opguard.tui.app import OpguardApp
from opguard.tui.screens.steps import StepScreen
from opguard.tui.session import Session
from opguard.tui.step_detail import render_step
from opguard.tui.step_records import EQUAL, FIRST, NOT_COMPARED, ONLY_A, StepRecords
from opguard.tui.widgets.detail_pane import SETTLE_SECONDS

SIZE = (150, 44)
GRADIENT_AT_5 = {"grad fc2.weight": 5, "param": 5, "state": 5, "loss": 6}


def _pair(root: Path, differ: dict[str, int], **kw: Any) -> tuple[Path, Path]:
    return write_state_run(root / "a", **kw), write_state_run(root / "b", differ=differ, **kw)


def _text(renderable: Any) -> str:
    console = Console(width=140, record=True, file=open(os.devnull, "w"))  # noqa: SIM115
    console.print(renderable)
    return console.export_text()


# -- the TUI's model and detail, without a UI ---------------------------------------------------


def test_step_list_marks_steps_from_the_diff(tmp_path: Path) -> None:
    a = write_state_run(tmp_path / "a", steps=range(10))
    b = write_state_run(tmp_path / "b", steps=range(2, 10), differ=GRADIENT_AT_5)
    with Run(a) as run_a, Run(b) as run_b:
        records = StepRecords(run_a.rank(0), run_b.rank(0))
        assert records.steps == list(range(10))
        assert records.status(3) == NOT_COMPARED  # before the diff has run
        records.set_diff(diff_runs(run_a, run_b).ranks[0])
        statuses = [records.status(step) for step in records.steps]
        assert statuses == [ONLY_A] * 2 + [EQUAL] * 3 + [FIRST] + [NOT_COMPARED] * 4
        assert records.compare(0) is None and records.only_in(0) == "A"  # run A only
        assert records.compare(4).equal  # type: ignore[union-attr]
        later = records.compare(7)  # past the first: compared when selected
        assert later is not None and not later.equal


def test_step_detail_shows_the_differing_entries_and_their_values(tmp_path: Path) -> None:
    a, b = _pair(tmp_path, GRADIENT_AT_5)
    with Run(a) as run_a, Run(b) as run_b:
        result = diff_runs(run_a, run_b)
        records = StepRecords(run_a.rank(0), run_b.rank(0))
        first = result.state_first
        comparison = records.compare(5)
        assert first is not None and comparison is not None
        text = _text(render_step(5, comparison, first))
        pair = comparison.differing[0]
        assert pair.a is not None and pair.b is not None
        values = (pair.a.tensor.values()[0], pair.b.tensor.values()[0])
        equal = _text(render_step(4, records.compare(4), first))
    assert "first differing step: the gradients differ: the forward or backward of step 5" in text
    assert "16 entries differ: 1 grad (first fc2.weight), 5 param" in text
    assert "grad fc2.weight" in text and all(f"{v:.8g}" in text for v in values)
    assert "the state is equal in both runs" in equal
    assert "in run A only" in _text(render_step(9, None, first, "A"))


# -- the app, headless ---------------------------------------------------------------------------


async def _settle_until(pilot: Any, condition: Callable[[], bool], timeout: float = 60) -> None:
    """Waits for the diff from the child process, then for the detail pane."""
    deadline = time.monotonic() + timeout
    while not condition() and time.monotonic() < deadline:
        await pilot.pause(0.1)
    await pilot.app.workers.wait_for_complete()
    await pilot.pause(SETTLE_SECONDS * 3)


def _detail(app: OpguardApp) -> str:
    return _text(app.screen.query_one("#detail-body", Static).content)


async def test_tui_opens_step_level_runs_on_the_first_differing_step(tmp_path: Path) -> None:
    app = OpguardApp(Session.open(*_pair(tmp_path, GRADIENT_AT_5)))
    assert isinstance(app.main, StepScreen)
    async with app.run_test(size=SIZE) as pilot:
        screen = app.main
        assert isinstance(screen, StepScreen)
        await _settle_until(pilot, lambda: screen.diff is not None)
        assert screen.step == 5
        header = str(app.query_one("#run-header").render())
        assert "DIVERGED" in header and "state (gradient), first differing step 5" in header
        assert "step 5 (6 of 10)" in header
        assert "grad fc2.weight differs at step 5" in header
        assert "the gradients differ" in _detail(app)
        await pilot.press("j")
        await _settle_until(pilot, lambda: screen.step == 6)
        assert screen.step == 6 and "entries differ" in _detail(app)
        await pilot.press("k", "k")
        await _settle_until(pilot, lambda: screen.step == 4)
        assert "the state is equal in both runs" in _detail(app)
        await pilot.press("d")
        await _settle_until(pilot, lambda: screen.step == 5)
        assert screen.step == 5


async def test_tui_switches_rank_on_step_level_runs(tmp_path: Path) -> None:
    for rank, step in ((0, 6), (1, 3)):
        write_state_run(tmp_path / "a", rank=rank)
        write_state_run(tmp_path / "b", rank=rank, differ={"grad": step})
    app = OpguardApp(Session.open(tmp_path / "a", tmp_path / "b"))
    async with app.run_test(size=SIZE) as pilot:
        screen = app.main
        assert isinstance(screen, StepScreen)
        await _settle_until(pilot, lambda: screen.diff is not None)
        assert (screen.rank, screen.step) == (0, 6)
        await pilot.press("r")
        await _settle_until(pilot, lambda: screen.diff is not None and screen.rank == 1)
        assert (screen.rank, screen.step) == (1, 3)
        assert "rank 1 (2 compared) · step 3" in str(app.query_one("#run-header").render())


async def test_tui_says_identical_step_level_runs(tmp_path: Path) -> None:
    app = OpguardApp(Session.open(*_pair(tmp_path, {})))
    async with app.run_test(size=SIZE) as pilot:
        screen = app.main
        await _settle_until(pilot, lambda: screen.diff is not None)  # type: ignore[union-attr]
        header = str(app.query_one("#run-header").render())
        assert "IDENTICAL" in header and "10 steps' state, all equal" in header


# -- the agent -------------------------------------------------------------------------------------


def test_evidence_carries_the_step_level_divergence(tmp_path: Path) -> None:
    a, b = _pair(tmp_path, {"param": 5, "state": 5, "grad": 6, "loss": 6})
    with Run(a) as run_a, Run(b) as run_b:
        evidence = build_evidence(diff_runs(run_a, run_b), run_a, run_b)
    first = evidence.data["first_divergence"]
    assert (first["kind"], first["step"], first["rank"], first["cause"]) == (
        "state",
        5,
        0,
        "optimizer",
    )
    assert first["state"]["name"] == "fc1.weight"
    text = evidence.text
    assert "verdict: diverged at rank 0, step 5; kind state, cause optimizer" in text
    assert "## what differs at the end of step 5" in text
    assert "param fc1.weight:\n  A float32[4] values [" in text
    assert "rank 0 step-level records: first differ at step 5" in text
    reading = evidence.data["reading"]
    assert reading[0] == "gradients equal, parameters differ: the optimizer step of step 5"
    assert any("the update differs" in line for line in reading)
    assert any(line.startswith("next: record step 5 op by op") for line in reading)


def test_the_reading_of_a_loss_names_the_first_differing_gradient(tmp_path: Path) -> None:
    a, b = _pair(tmp_path, {"loss": 3, "grad fc2.bias": 3})
    with Run(a) as run_a, Run(b) as run_b:
        reading = build_evidence(diff_runs(run_a, run_b), run_a, run_b).data["reading"]
    assert reading[:2] == [
        "the loss differs: the forward of step 3 (or the loss computed from it)",
        "1 gradient(s) differ as well, the first fc2.bias",
    ]


def test_explain_works_on_step_level_runs(tmp_path: Path) -> None:
    code, out, err = cli_in_process("explain", *map(str, _pair(tmp_path, GRADIENT_AT_5)), "--json")
    assert code == 1, err
    report = json.loads(out)
    assert report["verdict"] == "diverged"
    assert report["evidence"]["first_divergence"]["cause"] == "gradient"
    assert "the gradients differ: the forward or backward of step 5" in report["evidence_text"]
