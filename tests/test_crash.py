"""Traces survive the death of the training: SIGKILL, SIGTERM and an exception in the script at
random moments, a full disk, and readers (diff, show, the TUI's model) of a run that is still
being recorded.

Every case records ``tests/scripts/crash_train.py`` with ``opguard record`` in a process of its
own (tests/warm.py), as a user would, several at a time. Each trace must open, say that it is
partial and where it ends, and agree op for op with a complete recording of the same script up
to that point; the losses the killed training printed must be the complete run's.
``OPGUARD_TEST_KILLS`` sets the number of kills (default 12, four of each kind;
``OPGUARD_TEST_KILLS=200 pytest tests/test_crash.py`` for a long soak),
``OPGUARD_TEST_KILL_SEED`` their random moments.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import resource
import signal
import subprocess
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import warm
from conftest import cli_in_process as cli
from conftest import opguard_cmd

from opguard.analysis import diff_runs
from opguard.analysis.browse.rows import Side, Status
from opguard.analysis.contract import to_json
from opguard.store import Run
from opguard.tui.session import Session

pytestmark = pytest.mark.slow  # long in all: started first (conftest.py)

SCRIPT = Path(__file__).resolve().parent / "scripts" / "crash_train.py"
STEPS = 60
SLEEP = "0.02"  # per step: a run lasts a few seconds, so kills land at every stage of it
KILLS = int(os.environ.get("OPGUARD_TEST_KILLS", "12"))
SEED = int(os.environ.get("OPGUARD_TEST_KILL_SEED", "20240610"))
KINDS = ("sigkill", "sigterm", "exception")
PARALLEL = max(2, min(4, os.cpu_count() or 2))
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}


def record_command(run_dir: Path, *script_args: str) -> list[str]:
    return opguard_cmd(
        "record",
        "-o",
        str(run_dir),
        "--",
        str(SCRIPT),
        str(STEPS),
        "--sleep",
        SLEEP,
        *script_args,
    )


def losses(stdout: str) -> list[str]:
    return [line.split()[2] for line in stdout.splitlines() if line.startswith("loss ")]


def show(run_dir: Path) -> dict[str, Any]:
    code, out, err = cli("show", str(run_dir), "--json")
    assert code == 0 and not err, err
    summary: dict[str, Any] = json.loads(out)["ranks"][0]
    return summary


def diff_against(complete: Path, run_dir: Path) -> dict[str, Any]:
    with Run(complete) as a, Run(run_dir) as b:
        return to_json(diff_runs(a, b))


def ops_per_step(run_dir: Path) -> dict[int, int]:
    with Run(run_dir) as run:
        counts: dict[int, int] = {}
        for raw in run.rank(0).raw_ops():
            counts[raw.get("s", 0)] = counts.get(raw.get("s", 0), 0) + 1
        return counts


@dataclass
class Kill:
    name: str
    kind: str
    run_dir: Path
    delay: float  # seconds after the first step, for the signals
    raise_at: str | None  # STEP:WHERE, for the exception
    returncode: int = 0
    stdout: str = ""
    stderr: str = ""


def _plan(root: Path) -> list[Kill]:
    rng = random.Random(SEED)
    plan = []
    for n in range(KILLS):
        kind = KINDS[n % len(KINDS)]
        raise_at = None
        if kind == "exception":
            raise_at = (
                f"{rng.randrange(STEPS - 10)}:{rng.choice(('forward', 'backward', 'optimizer'))}"
            )
        plan.append(
            Kill(f"{kind}-{n}", kind, root / f"{kind}-{n}", rng.uniform(0.0, 1.2), raise_at)
        )
    return plan


def _run(kill: Kill) -> Kill:
    extra = ("--raise-at", kill.raise_at) if kill.raise_at else ()
    proc = warm.Popen(record_command(kill.run_dir, *extra), cwd=kill.run_dir.parent, env=ENV)
    first = proc.first_line(timeout=600)  # step 0 is done: recording is under way
    if kill.kind != "exception" and first.startswith("loss "):
        time.sleep(kill.delay)
        proc.send_signal(signal.SIGKILL if kill.kind == "sigkill" else signal.SIGTERM)
    kill.stdout, kill.stderr = proc.communicate(timeout=600)
    kill.returncode = proc.wait()  # ended: its status at once
    return kill


@pytest.fixture(scope="module")
def complete(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """The script recorded to its end: what every killed run is compared with."""
    root = tmp_path_factory.mktemp("complete")
    result = warm.run(record_command(root / "run"), cwd=root, env=ENV)
    assert result.returncode == 0, result.stderr
    assert len(losses(result.stdout)) == STEPS
    return root / "run", losses(result.stdout)


@pytest.fixture(scope="module")
def kills(tmp_path_factory: pytest.TempPathFactory) -> list[Kill]:
    root = tmp_path_factory.mktemp("kills")
    with ThreadPoolExecutor(PARALLEL) as pool:
        return list(pool.map(_run, _plan(root)))


# -- kills at random moments -------------------------------------------------------------------


def test_every_killed_trace_opens_says_where_it_ended_and_matches_the_complete_run(
    kills: list[Kill], complete: tuple[Path, list[str]]
) -> None:
    complete_dir, complete_losses = complete
    partial = 0
    for kill in kills:
        where = f"{kill.name} (exit {kill.returncode}): {kill.stderr[-2000:]}"
        printed = losses(kill.stdout)
        assert printed == complete_losses[: len(printed)], where  # the training was unchanged
        summary = show(kill.run_dir)
        with Run(kill.run_dir) as run:
            trace = run.rank(0)
            indices = [raw["i"] for raw in trace.raw_ops()]
            assert trace.damage is None, where
        assert indices == list(range(len(indices))), where  # a gapless prefix
        assert summary["ops"] == len(indices), where
        if summary["partial"]:
            partial += 1
        if indices:
            last = summary["last_op"]
            assert last["index"] == len(indices) - 1, where
            assert last["step"] == max(ops_per_step(kill.run_dir)), where
        found = diff_against(complete_dir, kill.run_dir)
        assert found["verdict"] == "identical", (where, found["first_divergence"])
        assert found["unaligned_b"] == 0, where  # every op of the killed run has its twin
        assert found["aligned"] == len(indices), where
    assert partial >= len(kills) * 3 // 4  # most kills landed while the training ran


def test_sigterm_closes_the_trace_and_loses_nothing(
    kills: list[Kill], complete: tuple[Path, list[str]]
) -> None:
    complete_steps = ops_per_step(complete[0])
    for kill in (k for k in kills if k.kind == "sigterm"):
        where = f"{kill.name}: {kill.stderr[-2000:]}"
        if kill.returncode == 0:  # the training ended before the signal came
            continue
        assert kill.returncode == -signal.SIGTERM, where  # died of it, as unrecorded
        with Run(kill.run_dir) as run:
            assert run.status == "terminated", where
            end = run.rank(0).info["end"]
        assert end["status"] == "terminated" and "SIGTERM" in end["error"], where
        summary = show(kill.run_dir)
        assert summary["finished"] and summary["partial"], where
        # Every step the training printed a loss for is in the trace, whole.
        recorded = ops_per_step(kill.run_dir)
        for step in range(len(losses(kill.stdout))):
            assert recorded.get(step) == complete_steps[step], (where, step)


def test_script_exception_ends_the_trace_where_it_failed(
    kills: list[Kill], complete: tuple[Path, list[str]]
) -> None:
    complete_steps = ops_per_step(complete[0])
    for kill in (k for k in kills if k.kind == "exception"):
        assert kill.raise_at is not None
        step = int(kill.raise_at.split(":")[0])
        where = f"{kill.name} ({kill.raise_at}): {kill.stderr[-2000:]}"
        assert kill.returncode == 1 and "injected failure" in kill.stderr, where
        assert len(losses(kill.stdout)) == step, where
        with Run(kill.run_dir) as run:
            assert run.status == "failed" and "injected failure" in run.meta["error"], where
        summary = show(kill.run_dir)
        assert summary["partial"] and summary["last_op"]["step"] == step, where
        recorded = ops_per_step(kill.run_dir)
        assert all(recorded[s] == complete_steps[s] for s in range(step)), where
        assert 0 < recorded[step] <= complete_steps[step], where


def test_sigkill_leaves_an_unfinished_trace(kills: list[Kill]) -> None:
    killed = [k for k in kills if k.kind == "sigkill" and k.returncode == -signal.SIGKILL]
    assert killed
    for kill in killed:
        with Run(kill.run_dir) as run:
            assert run.status == "running"  # nobody could write the end
            assert not run.rank(0).finished
            held = len(run.rank(0))  # none when killed before the first batch was written
        code, out, _ = cli("show", str(kill.run_dir))
        assert code == 0
        said = " ".join(out.split())
        assert "partial trace: " + ("ends at op" if held else "holds no op") in said
        assert "the recorder did not close it" in said


# -- a full disk -------------------------------------------------------------------------------


def _file_size_limit(limit: int) -> Any:
    def apply() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # writes past it fail with EFBIG instead
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    return apply


def test_full_disk_stops_recording_with_one_message_and_the_training_finishes(
    tmp_path: Path, complete: tuple[Path, list[str]]
) -> None:
    complete_dir, complete_losses = complete
    full_size = (complete_dir / "rank-0" / "data.mdb").stat().st_size
    limit = full_size // 3  # room for part of the trace, not for all of it
    result = subprocess.run(
        record_command(tmp_path / "run"),
        cwd=tmp_path,
        env=ENV,
        capture_output=True,
        text=True,
        preexec_fn=_file_size_limit(limit),
        timeout=300,
    )
    assert result.returncode == 0, result.stderr
    assert losses(result.stdout) == complete_losses  # every step, the same bits
    messages = result.stderr.splitlines()
    assert len(messages) == 1, result.stderr  # said once
    assert messages[0].startswith("opguard: recording stopped at op ")
    assert "could not be written" in messages[0] and "training continues" in messages[0]
    assert (tmp_path / "run" / "rank-0" / "data.mdb").stat().st_size <= limit

    with Run(complete_dir) as run:
        complete_ops = len(run.rank(0))
    with Run(tmp_path / "run") as run:
        assert "could not be written" in run.meta["recorder_failure"]
        trace = run.rank(0)
        held = len(trace)
        assert 0 < held < complete_ops
        assert [raw["i"] for raw in trace.raw_ops()] == list(range(held))
        assert trace.damage is None
    summary = show(tmp_path / "run")
    assert summary["partial"]
    recorded_failure = summary.get("write_failure") or summary["recorder_failure"]["error"]
    assert "could not be written" in recorded_failure
    found = diff_against(complete_dir, tmp_path / "run")
    assert found["verdict"] == "identical" and found["aligned"] == held


# -- readers of a run that is still being recorded ------------------------------------------------


@contextlib.contextmanager
def live_recording(tmp_path: Path, pause_at: int) -> Iterator[tuple[subprocess.Popen[str], Path]]:
    """A recording paused before step ``pause_at``; resumed by creating the returned file."""
    resume = tmp_path / "resume"
    proc = subprocess.Popen(
        record_command(
            tmp_path / "live", "--pause-at", str(pause_at), "--resume-file", str(resume)
        ),
        cwd=tmp_path,
        env=ENV,
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        while (line := proc.stdout.readline()) and line.strip() != "paused":
            pass
        assert line.strip() == "paused", proc.stderr.read() if proc.stderr else ""
        yield proc, resume
    finally:
        if proc.poll() is None:
            proc.kill()
        proc.communicate()


PAUSE = 25  # the step the live recording waits before


def test_diff_and_show_of_a_live_recording_read_a_consistent_prefix(
    tmp_path: Path, complete: tuple[Path, list[str]]
) -> None:
    complete_dir, _ = complete
    complete_steps = ops_per_step(complete_dir)
    with live_recording(tmp_path, pause_at=PAUSE) as (proc, resume):
        live = tmp_path / "live"
        # The writer commits what was queued within 0.25 s, in batches: the step before the
        # pause whole, and what the script ran after it (`loss.item()`) in step PAUSE.
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            counts = ops_per_step(live)
            if counts.get(PAUSE - 1) == complete_steps[PAUSE - 1] and counts.get(PAUSE):
                break
            time.sleep(0.05)
        paused = diff_against(complete_dir, live)
        assert paused["verdict"] == "identical"
        with Run(live) as run:  # the steps before the pause whole, and what the next one ran
            assert paused["aligned"] == len(run.rank(0))
        assert paused["aligned"] > sum(complete_steps[s] for s in range(PAUSE))
        assert any("did not finish" in note for note in paused["notes"])
        summary = show(live)
        assert summary["partial"] and not summary["finished"]
        session = Session.open(complete_dir, live)  # what `opguard tui` opens
        try:
            assert session.state(Side.B, 0).describe().startswith("unfinished")
            for step in range(PAUSE):
                rows = session.rows(0).rows(step)
                assert rows and all(row.status is Status.EQUAL for row in rows), step
        finally:
            session.close()

        resume.touch()  # and read while it writes
        readings = []
        while proc.poll() is None:
            code, out, err = cli("diff", str(complete_dir), str(live), "--json")
            assert code == 0, err
            readings.append(json.loads(out)["aligned"])
        assert proc.returncode == 0
    assert readings and readings == sorted(
        readings
    )  # each read a longer prefix, never a broken one
    final = diff_against(complete_dir, tmp_path / "live")
    assert final["verdict"] == "identical" and final["unaligned_a"] == final["unaligned_b"] == 0
    assert not show(tmp_path / "live")["partial"]
