"""The recorder's side of long runs (issue 28): step-level records, op-level windows, the flight
recorder (``--keep-last``), absolute step numbers (``--first-step``, ``opguard.step(n)``).

Recordings of ``tests/scripts/steps_train.py`` (a linear layer, a BatchNorm, dropout and a
parameter no module owns) run through ``opguard record`` as a user runs it, several at once in
a module fixture; their traces are read back with ``opguard.store`` and checked against what
the script itself printed and saved.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import lmdb
import msgpack
import pytest
import torch
import warm
from conftest import cli_in_process, opguard_cmd, run_cli
from run_once import BATCH_TIMEOUT

import opguard
from opguard.recorder.tensors import fingerprint_fields
from opguard.store import Run, schema
from opguard.store.states import StateEntry, decode_step, expand_step

pytestmark = pytest.mark.slow  # long in all: started first (conftest.py)

SCRIPTS = Path(__file__).resolve().parent / "scripts"
SCRIPT = SCRIPTS / "steps_train.py"
CRASH = SCRIPTS / "crash_train.py"
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
PARALLEL = max(2, min(4, os.cpu_count() or 2))
STEPS = 6
LONG = 150  # steps of the runs that show the flight recorder's disk stays bounded
KEEP = 3

# The names of the script's parameters in the optimizer's order, and its buffers.
PARAMS = [
    "body.0.weight",
    "body.0.bias",
    "body.1.weight",
    "body.1.bias",
    "head.weight",
    "head.bias",
    "group 1 param 0",  # `scale`: no module owns it
]
BUFFERS = ["body.1.running_mean", "body.1.running_var", "body.1.num_batches_tracked"]


@dataclass
class Recorded:
    run: Path
    stdout: str
    returncode: int
    stderr: str


def _record(root: Path, name: str, options: list[str], script_args: list[str]) -> Recorded:
    run = root / name
    done = run_cli(
        "record", "-o", str(run), *options, "--", str(SCRIPT), *script_args, cwd=root, env=ENV
    )
    return Recorded(run, done.stdout, done.returncode, done.stderr)


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Recorded]:
    root = tmp_path_factory.mktemp("long")
    steps = ["--steps", str(STEPS)]
    ckpt = str(root / "checkpoint.pt")
    checkpoint = ["--checkpoint-at", "3", "--checkpoint", ckpt]
    jobs: dict[str, tuple[list[str], list[str]]] = {
        "full": ([], [*steps, "--show-modes"]),
        "steps-only": (
            ["--steps-only"],
            [*steps, "--show-modes", "--save", str(root / "s.pt"), *checkpoint],
        ),
        "adam": (["--steps-only"], [*steps, "--optimizer", "adam", "--save", str(root / "a.pt")]),
        "window": (["--window", "2:4"], [*steps, "--show-modes"]),
        "keep-last": (["--keep-last", "2"], steps),
        "window-keep-last": (["--window", "1:5", "--keep-last", "2"], steps),
        "limit": (["--steps", "4", "--window", "3:9"], steps),
        f"keep-last-{LONG}": (["--keep-last", str(KEEP)], ["--steps", str(LONG)]),
        "keep-last-50": (["--keep-last", str(KEEP)], ["--steps", "50"]),
        f"steps-only-{LONG}": (["--steps-only"], ["--steps", str(LONG)]),
        "steps-only-50": (["--steps-only"], ["--steps", "50"]),
        f"full-{LONG}": ([], ["--steps", str(LONG)]),
        "full-50": ([], ["--steps", "50"]),
    }
    with ThreadPoolExecutor(PARALLEL) as pool:
        futures = {name: pool.submit(_record, root, name, *job) for name, job in jobs.items()}
        plain = pool.submit(warm.run, [sys.executable, str(SCRIPT), *steps], cwd=root, env=ENV)
        done = {name: future.result() for name, future in futures.items()}
        done["plain"] = Recorded(root, plain.result().stdout, plain.result().returncode, "")
    for name, recorded in done.items():
        assert recorded.returncode == 0, (name, recorded.stderr)
    # The checkpoint of step 3 exists now: resume from it, numbering by opguard.step(3) and by
    # --first-step 3, recording ops of step 4 only.
    resumed = {
        "resumed": (["--window", "4:5"], [*steps, "--resume", ckpt]),
        "first-step": (
            ["--first-step", "3", "--window", "4:5"],
            [*steps, "--resume", ckpt, "--no-renumber"],
        ),
    }
    with ThreadPoolExecutor(PARALLEL) as pool:
        futures = {name: pool.submit(_record, root, name, *job) for name, job in resumed.items()}
        for name, future in futures.items():
            done[name] = future.result()
            assert done[name].returncode == 0, (name, done[name].stderr)
    return done


def printed(stdout: str, what: str = "loss") -> dict[int, str]:
    """``WHAT STEP VALUE`` lines the script printed, by step."""
    return {
        int(line.split()[1]): line.split()[2]
        for line in stdout.splitlines()
        if line.startswith(what + " ")
    }


def states(run: Path, rank: int = 0) -> dict[int, list[StateEntry]]:
    with Run(run) as opened:
        return {s.step: list(s.entries) for s in opened.rank(rank).step_states()}


def contents(run: Path, rank: int = 0) -> dict[int, dict[tuple[str, str, str], Any]]:
    """Each step's state entries' content keys (dtype, shape, fingerprint) by entry key."""
    return {
        step: {e.key: e.tensor.content_key() for e in entries}
        for step, entries in states(run, rank).items()
    }


def ops_per_step(run: Path) -> dict[int, int]:
    with Run(run) as opened:
        counts: dict[int, int] = {}
        for raw in opened.rank(0).raw_ops():
            counts[raw.get("s", 0)] = counts.get(raw.get("s", 0), 0) + 1
        return counts


def op_indices(run: Path) -> list[int]:
    with Run(run) as opened:
        return [raw["i"] for raw in opened.rank(0).raw_ops()]


def fingerprint(tensor: torch.Tensor) -> int:
    fields = fingerprint_fields(tensor)
    assert isinstance(fields, dict)
    return int(fields["h"])


# -- step-level records ------------------------------------------------------------------------


def test_steps_only_records_each_state_tensor_by_name_and_no_op(
    runs: dict[str, Recorded],
) -> None:
    run = runs["steps-only"].run
    recorded = states(run)
    assert sorted(recorded) == list(range(STEPS))
    expected = (
        [("loss", "loss", "0")]
        + [("grad", name, "") for name in PARAMS]
        + [("param", name, "") for name in PARAMS]
        + [("state", name, "momentum_buffer") for name in PARAMS]
        + [("buffer", name, "") for name in BUFFERS]
        + [("rng", "cpu", "")]
    )
    for step, entries in recorded.items():
        assert [e.key for e in entries] == expected, step
    with Run(run) as opened:
        trace = opened.rank(0)
        assert len(trace) == 0 and trace.info["end"]["ops"] == 0
        assert opened.meta["steps_only"] is True
    # The dispatch mode was never pushed: no op went through OpGuard.
    assert set(printed(runs["steps-only"].stdout, "modes").values()) == {"0"}


def test_step_entries_are_the_fingerprints_of_the_training_state(
    runs: dict[str, Recorded],
) -> None:
    """The last step's gradients, parameters, momentum buffers, running stats and RNG state,
    as the script saved them, and every step's loss as it printed it."""
    for name, saved_at in (("steps-only", "s.pt"), ("adam", "a.pt")):
        run = runs[name].run
        saved = torch.load(run.parent / saved_at, weights_only=False)
        last = {e.key: e for e in states(run)[STEPS - 1]}
        for k, param in enumerate(PARAMS):
            assert last[("grad", param, "")].tensor.hash == fingerprint(saved["grads"][k])
            assert last[("param", param, "")].tensor.hash == fingerprint(saved["params"][k])
            assert last[("param", param, "")].tensor.shape == tuple(saved["params"][k].shape)
            for slot, value in saved["states"][k].items():
                assert last[("state", param, slot)].tensor.hash == fingerprint(value), slot
        for buffer in BUFFERS:
            assert last[("buffer", buffer, "")].tensor.hash == fingerprint(saved["buffers"][buffer])
        assert last[("rng", "cpu", "")].tensor.hash == fingerprint(saved["rng"])
        for step, value in printed(runs[name].stdout).items():
            (loss,) = [e for e in states(run)[step] if e.kind == "loss"]
            assert loss.tensor.values() == [float.fromhex(value)], (name, step)
    adam = {e.slot for e in states(runs["adam"].run)[0] if e.kind == "state"}
    assert adam == {"step", "exp_avg", "exp_avg_sq"}


def test_step_records_are_stored_compressed_and_read_as_the_plain_layout(
    runs: dict[str, Recorded],
) -> None:
    """The recorder stores a step's entries packed and compressed (GPT-2's ~85 KiB of entries
    take ~42 KiB); read back, and expanded to bytes, it is the ``{"s", "e"}`` layout."""
    run = runs["steps-only"].run
    env = lmdb.open(str(run / "rank-0"), readonly=True, max_dbs=16, lock=False)
    try:
        with env.begin() as txn:
            stored = dict(txn.cursor(db=env.open_db(b"steps", txn=txn, create=False)))
    finally:
        env.close()
    with Run(run) as opened:
        names = opened.rank(0).state_names
    for key, raw in stored.items():
        assert set(msgpack.unpackb(raw)) == {"s", "z"}
        expanded = msgpack.unpackb(expand_step(raw), strict_map_key=False)
        assert expanded["s"] == schema.op_index(key)
        assert decode_step(expanded, names) == decode_step(msgpack.unpackb(raw), names)
        assert msgpack.packb(expanded) == expand_step(raw)
        assert expand_step(expand_step(raw)) == expand_step(raw)


def test_recording_changes_no_numbers(runs: dict[str, Recorded]) -> None:
    plain = printed(runs["plain"].stdout)
    assert sorted(plain) == list(range(STEPS))
    for name in ("full", "steps-only", "window", "keep-last"):
        assert printed(runs[name].stdout) == plain, name


def test_every_mode_writes_the_same_step_level_records(runs: dict[str, Recorded]) -> None:
    """Op-level recording or not, the state is fingerprinted alike: any two traces compare at
    step level."""
    reference = contents(runs["steps-only"].run)
    for name in ("full", "window", "keep-last"):
        assert contents(runs[name].run) == reference, name


# -- windows -----------------------------------------------------------------------------------


def test_a_window_records_ops_of_its_steps_only_with_the_mode_off_outside(
    runs: dict[str, Recorded],
) -> None:
    full, window = ops_per_step(runs["full"].run), ops_per_step(runs["window"].run)
    assert set(window) == {2, 3}
    assert all(window[s] == full[s] for s in window)
    assert op_indices(runs["window"].run) == list(range(sum(window.values())))
    assert sorted(states(runs["window"].run)) == list(range(STEPS))  # step level everywhere
    modes = printed(runs["window"].stdout, "modes")
    assert modes == {s: "1" if s in (2, 3) else "0" for s in range(STEPS)}
    assert set(printed(runs["full"].stdout, "modes").values()) == {"1"}


def test_the_op_level_diff_compares_the_steps_both_runs_hold(runs: dict[str, Recorded]) -> None:
    code, out, err = cli_in_process("diff", str(runs["full"].run), str(runs["window"].run))
    assert code == 0, err
    assert out.startswith("IDENTICAL")
    said = " ".join(out.split())
    assert "op level: compared step(s) 2 to 3, the steps both runs hold ops for" in said
    assert "run B: steps 2 to 3 (--window 2:4)" in said
    assert "exists only in run" not in said


def test_runs_without_op_records_of_a_common_step(
    runs: dict[str, Recorded], tmp_path: Path
) -> None:
    """Steps 2-3 against step 4: the op-level diff compares none, and says so; without
    step-level records in a run to go by (a trace recorded before they existed), that is an
    error, not "identical"."""
    window, resumed = runs["window"].run, runs["resumed"].run
    code, out, err = cli_in_process("diff", str(window), str(resumed))
    assert code == 0, err
    assert "op level: compared no step" in " ".join(out.split())
    older = tmp_path / "older"
    shutil.copytree(window, older)
    env = lmdb.open(str(older / "rank-0"), max_dbs=16)
    with env.begin(write=True) as txn:
        txn.drop(env.open_db(b"steps", txn=txn), delete=True)
    env.close()
    code, _, err = cli_in_process("diff", str(older), str(resumed))
    assert code == 2 and "hold ops of no common step" in err and len(err.splitlines()) == 1
    assert "run A: steps 2 to 3 (--window 2:4); run B: steps 4 to 4 (--window 4:5)" in err


def test_steps_end_the_run_at_an_absolute_step(runs: dict[str, Recorded]) -> None:
    """``--steps 4 --window 3:9``: the run ends after step 3, whose ops are recorded."""
    limited = runs["limit"]
    assert sorted(printed(limited.stdout)) == [0, 1, 2]  # step 3 ended inside optimizer.step()
    assert set(ops_per_step(limited.run)) == {3}
    assert sorted(states(limited.run)) == [0, 1, 2, 3]
    with Run(limited.run) as opened:
        assert opened.meta["stopped"] == "step limit 4 reached"


# -- the flight recorder -------------------------------------------------------------------------


def test_keep_last_holds_the_last_steps_ops_as_the_full_run_numbered_them(
    runs: dict[str, Recorded],
) -> None:
    full, kept = ops_per_step(runs["full"].run), ops_per_step(runs["keep-last"].run)
    # the last 2 completed steps, and the ops after the last one (its final loss.item())
    assert sorted(kept) == [STEPS - 2, STEPS - 1, STEPS]
    assert all(kept[s] == full[s] for s in kept)
    first = sum(n for s, n in full.items() if s < STEPS - 2)
    assert op_indices(runs["keep-last"].run) == list(range(first, sum(full.values())))
    code, out, err = cli_in_process("diff", str(runs["full"].run), str(runs["keep-last"].run))
    assert code == 0 and out.startswith("IDENTICAL"), err
    assert f"compared step(s) {STEPS - 2} to {STEPS}" in " ".join(out.split())
    code, out, _ = cli_in_process("show", str(runs["keep-last"].run))
    assert code == 0
    said = " ".join(out.split())
    assert f"ops {first} to {sum(full.values()) - 1}: steps {STEPS - 2} to {STEPS}" in said
    assert "(--keep-last 2)" in said
    assert f"step-level records: {STEPS} step(s), 0 to {STEPS - 1}" in said
    code, _, err = cli_in_process("show", str(runs["keep-last"].run), "--ops", "0:5")
    assert code == 2 and f"rank 0 has ops {first} to " in err


def test_keep_last_in_a_window_keeps_the_windows_last_steps(runs: dict[str, Recorded]) -> None:
    """Steps after the window record no op: they do not push the window's ops out."""
    full, kept = ops_per_step(runs["full"].run), ops_per_step(runs["window-keep-last"].run)
    assert sorted(kept) == [3, 4] and all(kept[s] == full[s] for s in kept)
    assert sorted(states(runs["window-keep-last"].run)) == list(range(STEPS))


def _size(run: Path) -> int:
    return (run / "rank-0" / "data.mdb").stat().st_size


def test_keep_last_keeps_the_disk_bounded(runs: dict[str, Recorded]) -> None:
    """From 50 to 150 steps the flight recorder's file grows by what the step-level records
    take (as a --steps-only run's does), not by the ops of 100 steps."""
    kept = _size(runs[f"keep-last-{LONG}"].run) - _size(runs["keep-last-50"].run)
    steps_only = _size(runs[f"steps-only-{LONG}"].run) - _size(runs["steps-only-50"].run)
    full = _size(runs[f"full-{LONG}"].run) - _size(runs["full-50"].run)
    assert kept <= steps_only + full // 10, (kept, steps_only, full)
    assert set(ops_per_step(runs[f"keep-last-{LONG}"].run)) == {LONG - 3, LONG - 2, LONG - 1, LONG}
    assert len(states(runs[f"keep-last-{LONG}"].run)) == LONG


# -- absolute step numbers -----------------------------------------------------------------------


def test_a_resumed_window_lines_up_with_the_original_run(runs: dict[str, Recorded]) -> None:
    original = contents(runs["full"].run)
    for name in ("resumed", "first-step"):
        resumed = runs[name]
        assert printed(resumed.stdout) == {
            s: v for s, v in printed(runs["full"].stdout).items() if s >= 3
        }, name
        recorded = contents(resumed.run)
        assert sorted(recorded) == [3, 4, 5], name
        assert all(recorded[s] == original[s] for s in recorded), name
        assert set(ops_per_step(resumed.run)) == {4}, name
        code, out, err = cli_in_process("diff", str(runs["full"].run), str(resumed.run))
        assert code == 0 and out.startswith("IDENTICAL"), (name, err)
        assert "compared step(s) 4," in out, name


@pytest.mark.parametrize("steps_only", [True, False], ids=["steps-only", "full"])
def test_a_parameter_given_other_memory_or_layout_is_recorded_as_it_now_is(
    tmp_path: Path, steps_only: bool
) -> None:
    """The recorder keeps what it read of each state tensor from one step to the next; a
    parameter whose ``.data`` is replaced (other memory and shape, then a transposed view of the
    same memory) or which is transposed in place (same memory and shape, other strides) is read
    anew: every step records the values it ends with, and every op the values it is given."""
    weight = torch.nn.Parameter(torch.arange(12.0).reshape(3, 4))
    square = torch.nn.Parameter(torch.arange(16.0).reshape(4, 4))
    opt = torch.optim.SGD([weight, square], lr=0.5)
    ended_with, given = [], []
    with opguard.record(tmp_path / "run", steps_only=steps_only):
        for step in range(4):
            if step == 1:
                weight.data = torch.arange(12.0).reshape(4, 3) * 2
            if step == 2:
                weight.data = weight.data.t()
                with torch.no_grad():
                    square.t_()
            given.append((square.stride(), fingerprint(square)))
            factor = torch.arange(weight.numel()).view(weight.shape)
            ((weight * factor).sum() + (square * 3).sum()).backward()
            opt.step()
            opt.zero_grad()
            ended_with.append([(tuple(p.shape), fingerprint(p)) for p in (weight, square)])
    recorded = [
        [(e.tensor.shape, e.tensor.hash) for e in entries if e.kind == "param"]
        for _, entries in sorted(states(tmp_path / "run").items())
    ]
    assert recorded == ended_with
    assert [shapes[0][0] for shapes in ended_with] == [(3, 4), (4, 3), (3, 4), (3, 4)]
    if not steps_only:  # each step's `square * 3`, as the op level saw its input
        with Run(tmp_path / "run") as opened:
            muls = [
                (op.inputs[0].stride, op.inputs[0].hash)
                for op in opened.rank(0).ops()
                if op.op == "aten::mul.Tensor"
                and op.inputs[0].shape == (4, 4)
                and op.phase == "forward"
            ]
        assert muls == given
        assert given[2][0] == (1, 4)


def test_opguard_step_numbers_the_step_now_starting(tmp_path: Path) -> None:
    """In code: ``opguard.step(n)`` renumbers, never backwards; ``opguard.step()`` ends a step
    (two backward calls in it: two loss entries); ``torch.autograd.backward`` is restored."""
    original = torch.autograd.backward
    weight = torch.nn.Parameter(torch.ones(3))
    with opguard.record(tmp_path / "run", steps_only=True):
        opguard.step(10)
        for _ in range(2):
            (weight * 2).sum().backward()
            torch.autograd.backward([(weight * 3).sum()])
            opguard.step()
        opguard.step(5)  # backwards: said on stderr, ignored
        with pytest.raises(ValueError, match="step number"):
            opguard.step(-1)
    assert torch.autograd.backward is original
    recorded = states(tmp_path / "run")
    assert sorted(recorded) == [10, 11]
    keys = [e.key for e in recorded[10]]
    assert keys == [("loss", "loss", "0"), ("loss", "loss", "1"), ("rng", "cpu", "")]
    assert recorded[10][0].tensor.values() == [6.0] and recorded[10][1].tensor.values() == [9.0]


def test_a_failing_step_level_recorder_stops_and_the_training_goes_on(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from opguard.recorder import step_records

    calls = []

    def failing(tensors: list[torch.Tensor], labels: list[bytes], *, sketch: bool) -> Any:
        calls.append(len(tensors))
        raise RuntimeError("injected")

    monkeypatch.setattr(step_records, "fingerprint_all", failing)
    weight = torch.nn.Parameter(torch.ones(3))
    opt = torch.optim.SGD([weight], lr=0.5)
    with opguard.record(tmp_path / "run", steps_only=True):
        for _ in range(3):
            opt.zero_grad()
            (weight * 2).sum().backward()
            opt.step()
    assert weight.tolist() == [-2.0, -2.0, -2.0]  # three steps taken, 2 * 0.5 each
    assert len(calls) == 1  # the first failure stopped it
    err = capsys.readouterr().err
    assert err.count("opguard: step-level recording stopped at step 0: RuntimeError: injected") == 1
    with Run(tmp_path / "run") as opened:
        trace = opened.rank(0)
        assert trace.info["step_failure"] == {"at_step": 0, "error": "RuntimeError: injected"}
        assert trace.step_count() == 0 and trace.info["end"]["steps"] == 3


# -- crashes ---------------------------------------------------------------------------------------


def test_sigkill_leaves_step_records_readable_up_to_the_last_committed_batch(
    tmp_path: Path,
) -> None:
    """Killed mid-run, a --steps-only and a --keep-last run keep what was committed: step
    records of consecutive steps from 0, each the complete run's, and the last steps' ops."""

    def killed(name: str, *options: str) -> tuple[Path, str]:
        run = tmp_path / name
        command = opguard_cmd(
            "record", "-o", str(run), *options, "--", str(CRASH), "400", "--sleep", "0.02"
        )
        proc = subprocess.Popen(
            command,
            cwd=tmp_path,
            env=ENV,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            bufsize=0,  # readline() takes no more than its line: communicate() reads the rest
        )
        assert proc.stdout is not None
        lines = [proc.stdout.readline() for _ in range(40)]  # 40 steps done, ~1 s of writing
        proc.send_signal(signal.SIGKILL)
        rest, _ = proc.communicate(timeout=600)
        assert proc.returncode == -signal.SIGKILL
        return run, b"".join([*lines, rest]).decode()

    with ThreadPoolExecutor(2) as pool:
        steps_only = pool.submit(killed, "steps-only", "--steps-only")
        keep_last = pool.submit(killed, "keep-last", "--keep-last", "3")
        results = [steps_only.result(), keep_last.result()]
    for run, stdout in results:
        losses = {int(line.split()[1]): line.split()[2] for line in stdout.splitlines()}
        with Run(run) as opened:
            trace = opened.rank(0)
            assert not trace.finished and trace.damage is None
            held = list(trace.step_states())
            indices = [raw["i"] for raw in trace.raw_ops()]
        assert [s.step for s in held] == list(range(len(held))) and len(held) >= 10, run
        for step in held:
            (loss,) = [e for e in step.entries if e.kind == "loss"]
            assert loss.tensor.values() == [float.fromhex(losses[step.step])]
        if indices:  # a gapless run of ops
            assert indices == list(range(indices[0], indices[0] + len(indices)))
    assert not op_indices(results[0][0])
    assert op_indices(results[1][0])[0] > 0  # the first steps' ops were dropped


# -- options ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "said"),
    [
        (["--window", "5:3"], "--window 5:3: needs 0 <= START < STOP"),
        (["--window", "5"], "--window takes START:STOP"),
        (["--keep-last", "0"], "--keep-last must be at least 1"),
        (["--window", "2:4", "--steps-only"], "--window needs op-level recording"),
        (["--keep-last", "2", "--steps-only"], "--keep-last needs op-level recording"),
        (["--capture", "3", "--steps-only"], "--capture needs op-level recording"),
        (["--steps", "3", "--first-step", "5"], "--steps 3 ends the run before step 5"),
        (["--first-step", "-1"], "--first-step must be 0 or more"),
        (["--window", "0:2", "--first-step", "4"], "--window 0:2 ends before step 4 starts"),
        (["--window", "8:9", "--steps", "5"], "--window 8:9 starts after --steps 5"),
    ],
)
def test_options_that_cannot_be_recorded_are_refused_in_one_line(
    tmp_path: Path, options: list[str], said: str
) -> None:
    code, out, err = cli_in_process(
        "record", "-o", str(tmp_path / "run"), *options, "--", str(SCRIPT)
    )
    assert code == 2 and not out
    assert err.startswith("opguard: error: ") and said in err and len(err.splitlines()) == 1
    assert not (tmp_path / "run").exists()


HUGE = "99999999999999999999999"  # past 64 bits


@pytest.mark.parametrize(
    ("options", "said"),
    [
        (["--keep-last", HUGE], "--keep-last must be at most "),
        (["--steps", HUGE], "--steps must be at most "),
        (["--first-step", HUGE], "--first-step must be at most "),
        (["--window", f"0:{HUGE}"], f"--window 0:{HUGE}: needs 0 <= START < STOP <= "),
    ],
)
def test_numbers_past_what_a_trace_holds_are_refused_in_one_line(
    tmp_path: Path, options: list[str], said: str
) -> None:
    """As the user types it (a process of its own: before the fix the recording started, died
    of an OverflowError and left a run reading "running")."""
    run = tmp_path / "run"
    args = ("record", "-o", str(run), *options, "--", str(SCRIPT), "--steps", "1")
    done = run_cli(*args, cwd=tmp_path, env=ENV)
    assert done.returncode == 2 and "Traceback" not in done.stderr, done.stderr
    assert done.stderr.startswith("opguard: error: ") and said in done.stderr, done.stderr
    assert len(done.stderr.splitlines()) == 1 and not run.exists()


def test_a_window_the_run_never_reached_is_said(tmp_path: Path) -> None:
    """``--window 50:60`` on a run of 4 steps records no op: the recording says so as it ends,
    and ``show`` and ``diff`` say it of the run (not only "no op-level records"); the diff's
    next step records the differing step in place of that window, not with it again."""
    with ThreadPoolExecutor(2) as pool:
        late, adam = pool.map(
            lambda job: _record(tmp_path, *job),
            [
                ("late", ["--window", "50:60"], ["--steps", "4"]),
                ("adam", [], ["--steps", "4", "--optimizer", "adam"]),
            ],
        )
    assert late.returncode == 0 == adam.returncode, late.stderr + adam.stderr
    said = "--window 50:60 was never reached: the run ended at step 4, so no op was recorded"
    assert said in late.stderr, late.stderr
    code, out, _ = cli_in_process("show", str(late.run))
    assert code == 0 and said in out, out
    code, out, _ = cli_in_process("show", str(late.run), "--json")
    assert json.loads(out)["ranks"][0]["unreached_window"].startswith("--window 50:60 was never")
    for pair in ((adam.run, late.run), (late.run, adam.run)):
        code, out, _ = cli_in_process("diff", *map(str, pair))
        assert code == 1 and said in out, out
        assert "opguard record --window 0:1 --steps 1 -o" in out and "50:60 --" not in out, out


def test_options_reach_every_process_that_records() -> None:
    """torchrun's workers and other interpreters get the options as typed; ``opguard
    capture`` re-runs with those that number ops and steps."""
    from opguard.cli.commands.record import parse_recorded

    command = ["opguard", "record", "-o", "r", "--first-step", "3", "--window", "4:6"]
    command += ["--keep-last", "2", "--", "t.py"]
    options, target = parse_recorded(command)
    assert options.switches() == ["--first-step", "3", "--window", "4:6", "--keep-last", "2"]
    assert options.mode_switches() == ["--first-step", "3", "--window", "4:6"]
    assert target == ["--", "t.py"]
    only, _ = parse_recorded(["opguard", "record", "-o", "r", "--steps-only", "--", "t.py"])
    assert only.switches() == ["--steps-only"] and only.session_arguments()["steps_only"]


def test_record_in_code_refuses_what_the_cli_refuses(tmp_path: Path) -> None:
    for bad in ({"window": (4, 2)}, {"keep_last": 0}, {"steps_only": True, "keep_last": 3}):
        with pytest.raises(ValueError):
            opguard.record(tmp_path / "run", **bad)  # type: ignore[arg-type]


# -- distributed -----------------------------------------------------------------------------------


@pytest.mark.skipif(
    not (torch.distributed.is_available() and torch.distributed.is_gloo_available()),
    reason="torch.distributed with the gloo backend is not available in this build",
)
def test_each_rank_writes_its_step_records_sharded_state_as_its_shard(tmp_path: Path) -> None:
    """DDP on two gloo ranks: per-rank losses differ, gradients (after the all-reduce) and
    parameters agree, named through the DDP wrapper. FSDP2: parameters are local shards."""
    torchrun = str(Path(sys.executable).with_name("torchrun"))
    jobs = []
    for name, script in (("ddp", SCRIPTS / "dist_ddp.py"), ("fsdp", SCRIPTS / "dist_fsdp2.py")):
        command = ["--", torchrun, "--standalone", "--nproc-per-node", "2", str(script)]
        jobs.append(
            subprocess.Popen(
                opguard_cmd("record", "-o", str(tmp_path / name), "--steps-only", *command),
                cwd=tmp_path,
                env={**ENV, "OMP_NUM_THREADS": "1"},
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
                text=True,
            )
        )
    for job in jobs:
        out, _ = job.communicate(timeout=BATCH_TIMEOUT)
        assert job.returncode == 0, out
    ddp = [states(tmp_path / "ddp", rank) for rank in (0, 1)]
    assert sorted(ddp[0]) == sorted(ddp[1]) == [0, 1]
    for step in (0, 1):
        by_rank = [{e.key: e.tensor.content_key() for e in ddp[r][step]} for r in (0, 1)]
        names = {key[1] for key in by_rank[0] if key[0] == "param"}
        assert names == {"0.weight", "0.bias", "2.weight", "2.bias"}
        assert by_rank[0][("loss", "loss", "0")] != by_rank[1][("loss", "loss", "0")]  # own data
        for key in by_rank[0]:
            if key[0] in ("grad", "param", "state"):
                assert by_rank[0][key] == by_rank[1][key], (step, key)
    fsdp = [states(tmp_path / "fsdp", rank) for rank in (0, 1)]
    params = [{e.name: e.tensor for e in fsdp[r][0] if e.kind == "param"} for r in (0, 1)]
    for rank in (0, 1):
        shapes = {name: tensor.shape for name, tensor in params[rank].items()}
        assert shapes == {"0.weight": (8, 8), "0.bias": (8,), "2.weight": (2, 16), "2.bias": (2,)}
    assert params[0]["0.weight"].hash != params[1]["0.weight"].hash  # each rank's own shard


def test_the_writer_drops_old_ops_and_keeps_the_file_whole(tmp_path: Path) -> None:
    """``drop_ops`` deletes ops (steps stay) in the transaction that writes newer ones. Such a
    transaction can number a page it then frees and never writes; the file must still hold
    every page its header counts, or readers take it for a truncated copy."""
    from opguard.store.pagecheck import check_snapshot
    from opguard.store.writer import TraceWriter

    writer = TraceWriter(tmp_path / "rank-0", start_info={"rank": 0}, flush_interval=3600)
    index, starts = 0, [0]
    for step in range(8):
        for _ in range(60 + (7 + 13 * step) % 90):
            writer.append(index, {"i": index, "s": step, "b": bytes(index * 37 % 400)})
            index += 1
        writer.put_step(step, {"s": step, "e": []})
        starts.append(index)
        if step:
            writer.drop_ops(starts[-2])  # keep the last step's ops
        if step == 0:  # one commit now, the rest at close
            writer.wake()
            while writer.records_written < index:
                time.sleep(0.001)
    writer.close({"status": "finished"})
    env = lmdb.open(str(tmp_path / "rank-0"), readonly=True, max_dbs=16, lock=False)
    try:
        with env.begin() as txn:
            assert check_snapshot(tmp_path / "rank-0" / "data.mdb", txn.id()) == {}  # whole
            ops = [
                schema.op_index(k)
                for k in txn.cursor(db=env.open_db(b"ops", txn=txn)).iternext(values=False)
            ]
            steps = txn.stat(env.open_db(b"steps", txn=txn))["entries"]
    finally:
        env.close()
    assert ops == list(range(starts[-2], index)) and steps == 8
