"""Issue 28's acceptance tests on the CPU: long runs, from "the runs differ" to "this op, this
line".

A 400-step pair (tests/long_runs/train.py, a tiny MLP: seconds) whose run B scales step 311's
loss by 1.0001: ``--steps-only`` names step 311 and the first differing gradient, ``opguard
hunt`` names the op and its line, ``--window 311:312`` alone names them too, ``--keep-last 5``
keeps five steps of ops. A pair that first differs in the optimizer says so; a window recorded
in a run resumed from a checkpoint lines up with the original run's; a 2-rank DDP pair (gloo)
names the rank that parted first. Then the hunt's other outcomes: identical runs (one pass, and
no torch in the hunt's own process), a difference the second pass does not reproduce, failing
scripts. Every recording is an ``opguard record`` or ``opguard hunt`` process, as a user runs it.
"""

from __future__ import annotations

import json
import os
import shlex
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import torch
from conftest import cli_in_process, line_of, run_cli
from state_runs import hunt_of
from test_imports import cli_without

from opguard.hunt import HuntError, target_words
from opguard.store import Run

pytestmark = pytest.mark.slow  # long in all: started first (conftest.py)

LONG_RUNS = Path(__file__).resolve().parent / "long_runs"
SCRIPT = LONG_RUNS / "train.py"
DDP = LONG_RUNS / "ddp_train.py"
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
PARALLEL = max(2, min(4, os.cpu_count() or 2))
STEPS, AT = 400, 311  # the pair: 400 steps, run B's loss scaled at step 311
CHECKPOINT = 300  # the original run A saves a checkpoint as step 300 starts
WINDOW = ["--window", f"{AT}:{AT + 1}", "--steps", str(AT + 1)]
# Run A, saving a checkpoint as step 300 starts (in the directory it runs in)
A_SAVES = f"{SCRIPT} --checkpoint-at {CHECKPOINT} --checkpoint ckpt.pt"


@dataclass
class Done:
    code: int
    stdout: str
    stderr: str


def _opguard(root: Path, *args: str) -> Done:
    done = run_cli(*args, cwd=root, env=ENV, timeout=600)
    return Done(done.returncode, done.stdout, done.stderr)


def _record(root: Path, name: str, options: list[str], script_args: list[str]) -> Done:
    return _opguard(root, "record", "-o", name, *options, "--", str(SCRIPT), *script_args)


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("hunt")


GLOO = torch.distributed.is_available() and torch.distributed.is_gloo_available()
TORCHRUN = [
    str(Path(sys.executable).with_name("torchrun")),
    "--standalone",
    "--nproc-per-node",
    "2",
]


def _hunts(root: Path) -> dict[str, tuple[str, ...]]:
    """The hunts the tests read, as ``opguard hunt`` arguments (run in ``root``)."""
    scaled = shlex.join([str(SCRIPT), "--scale-at", str(AT)])
    short = f"{SCRIPT} --steps 150"
    once = f"{SCRIPT} --steps 60 --scale-at 40 --once {root / 'once'}"
    hunts = {
        "hunt": ("--a", A_SAVES, "--b", scaled),
        "hunt-optimizer": ("--json", "--a", short, "--b", f"{short} --lr-at 120"),
        "hunt-once": ("--a", f"{SCRIPT} --steps 60", "--b", once),
    }
    if GLOO:
        ddp = shlex.join([*TORCHRUN, str(DDP)])
        hunts["hunt-ddp"] = ("--json", "--a", ddp, "--b", f"{ddp} --lr-rank 1 --lr-at 20")
    return {name: ("hunt", "-o", name, *args) for name, args in hunts.items()}


@pytest.fixture(scope="module")
def runs(root: Path) -> dict[str, Done]:
    """The hunts, and the 400-step pair recorded the ways a hunt does not, several at once.
    The pair's hunt records it with --steps-only (hunt/a-steps, hunt/b-steps) and with
    --window 311:312 --steps 312 (hunt/a-window, hunt/b-window), as a user would: the tests
    diff those recordings too."""
    scaled = ["--scale-at", str(AT)]
    jobs: dict[str, tuple[list[str], list[str]]] = {"b-keep-last": (["--keep-last", "5"], scaled)}
    with ThreadPoolExecutor(PARALLEL) as pool:
        futures = {
            **{name: pool.submit(_opguard, root, *hunt) for name, hunt in _hunts(root).items()},
            **{name: pool.submit(_record, root, name, *job) for name, job in jobs.items()},
        }
        done = {name: future.result() for name, future in futures.items()}
    for name, result in done.items():  # a hunt of runs that differ: exit status 1
        assert result.code == (1 if name.startswith("hunt") else 0), (name, result.stderr)
    # From the checkpoint of step 300: run A numbered by --first-step, run B by opguard.step()
    resumed = {
        "a-resumed": (["--first-step", str(CHECKPOINT), *WINDOW], []),
        "b-resumed": (WINDOW, [*scaled, "--renumber"]),
    }
    with ThreadPoolExecutor(PARALLEL) as pool:
        futures = {
            name: pool.submit(_record, root, name, options, [*args, "--resume", "ckpt.pt"])
            for name, (options, args) in resumed.items()
        }
        for name, future in futures.items():
            done[name] = future.result()
            assert done[name].code == 0, (name, done[name].stderr)
    return done


def _diff(root: Path, a: str, b: str, code: int = 1) -> dict[str, Any]:
    status, out, err = cli_in_process("diff", str(root / a), str(root / b), "--json")
    assert status == code, err
    result: dict[str, Any] = json.loads(out)
    return result


def _ops_by_step(run: Path) -> dict[int, int]:
    with Run(run) as opened:
        counts: dict[int, int] = {}
        for raw in opened.rank(0).raw_ops():
            counts[raw.get("s", 0)] = counts.get(raw.get("s", 0), 0) + 1
        return counts


def _assert_names_the_scale(first: dict[str, Any]) -> None:
    """The op-level first divergence of the pair: step 311's ``* scale``, 1.0 against 1.0001,
    in the forward pass (the scaled loss is the step's state: the ``ones_like`` seeding the
    backward pass reads only its size, so nothing absorbs it)."""
    assert (first["step"], first["kind"]) == (AT, "argument"), first["summary"]
    for side in ("a", "b"):
        op = first[side]
        assert op["op"] == "aten::mul.Tensor" and op["step"] == AT
        assert op["phase"] == "forward"
        assert op["call_site"]["line"] == line_of(SCRIPT, "scale")
    assert first["arguments_differ"][0]["a"] == 1.0
    assert first["arguments_differ"][0]["b"] == pytest.approx(1.0001)


# -- the 400-step pair --------------------------------------------------------------------------


def test_steps_only_names_step_311_and_the_first_differing_gradient(
    root: Path, runs: dict[str, Done]
) -> None:
    result = _diff(root, "hunt/a-steps", "hunt/b-steps")
    first = result["first_divergence"]
    assert (first["kind"], first["step"], first["rank"], first["cause"]) == ("state", AT, 0, "loss")
    assert first["states_differ"]["by_kind"]["grad"] == {"count": 4, "first": "grad fc1.weight"}
    assert result["ranks"][0]["step_level"]["compared"] == AT + 1  # 0-310 equal, then 311
    code, out, _ = cli_in_process("diff", str(root / "hunt/a-steps"), str(root / "hunt/b-steps"))
    assert code == 1 and "4 grad (first fc1.weight)" in out
    # The report's next step: the hunt that made these runs (test_hunt_names_the_op_and_its_line)
    hunt = f"opguard hunt -o {root / 'hunt/hunt'} --a '{A_SAVES}' --b '{SCRIPT} --scale-at {AT}'"
    assert hunt in " ".join(out.split())


def test_hunt_names_the_op_and_its_line(root: Path, runs: dict[str, Done]) -> None:
    hunted = runs["hunt"]
    lines = hunted.stdout.splitlines()
    assert lines[0] == (
        f"step {AT} (rank 0): the step-level records first differ at the loss (first gradient: "
        "grad fc1.weight); recorded its ops in both runs:"
    )
    assert lines[1].startswith("DIVERGED  A: hunt/a-window  B: hunt/b-window")
    said = "\n".join(lines)
    assert f"aten::mul.Tensor at train.py:{line_of(SCRIPT, 'scale')}" in said
    assert "argument other: 1.0 (A) vs 1.0001 (B)" in said
    assert f"step-level records: first differ at step {AT}" in said
    # progress on stderr, each recording's output in its log
    assert hunted.stderr.splitlines() == [
        "opguard hunt: recording run A at step level into hunt/a-steps",
        "opguard hunt: recording run B at step level into hunt/b-steps",
        f"opguard hunt: recording run A op by op in step {AT} into hunt/a-window",
        f"opguard hunt: recording run B op by op in step {AT} into hunt/b-window",
    ]
    assert (root / "hunt" / "a-steps.log").read_text().startswith("loss ")  # what train.py prints
    assert _ops_by_step(root / "hunt" / "a-steps") == {}
    assert set(_ops_by_step(root / "hunt" / "b-window")) == {AT}


def test_a_window_alone_names_them_too(root: Path, runs: dict[str, Done]) -> None:
    result = _diff(root, "hunt/a-window", "hunt/b-window")
    _assert_names_the_scale(result["first_divergence"])
    level = result["step_level"]
    assert (level["first_differing_step"], level["window_start"]) == (AT, AT)
    assert level["differed_before_window"] is False


def test_keep_last_5_keeps_five_steps_of_ops(root: Path, runs: dict[str, Done]) -> None:
    kept = _ops_by_step(root / "b-keep-last")
    assert sorted(kept) == [*range(STEPS - 5, STEPS), STEPS]  # and the final loss.item()
    with Run(root / "b-keep-last") as run:
        assert run.rank(0).step_count() == STEPS  # step level for every step
    # Against run A's step-level records: step 311 still named, from the step-level records.
    first = _diff(root, "hunt/a-steps", "b-keep-last")["first_divergence"]
    assert (first["kind"], first["step"]) == ("state", AT)


def test_a_pair_parting_in_the_optimizer_says_so(root: Path, runs: dict[str, Done]) -> None:
    first = _diff(root, "hunt-optimizer/a-steps", "hunt-optimizer/b-steps")["first_divergence"]
    assert (first["step"], first["cause"], first["state"]["kind"]) == (120, "optimizer", "param")
    assert "grad" not in first["states_differ"]["by_kind"]
    pair = (str(root / "hunt-optimizer/a-steps"), str(root / "hunt-optimizer/b-steps"))
    code, out, _ = cli_in_process("diff", *pair)
    assert code == 1
    assert "gradients equal, parameters differ: the optimizer step of step 120" in out


def test_a_resumed_window_lines_up_with_the_original_run(root: Path, runs: dict[str, Done]) -> None:
    """Windows recorded from the checkpoint of step 300 (numbered by --first-step, or by the
    script's opguard.step(300)) compare with the original run's window op by op."""
    same = _diff(root, "hunt/a-window", "a-resumed", code=0)
    assert same["verdict"] == "identical"
    rank = same["ranks"][0]
    assert [s["step"] for s in rank["steps"]] == [AT] and rank["aligned"] > 0
    assert rank["step_level"]["steps_only_in_a"] == [[0, CHECKPOINT - 1]]
    assert rank["step_level"]["compared"] == AT + 1 - CHECKPOINT
    parted = _diff(root, "hunt/a-window", "b-resumed")
    _assert_names_the_scale(parted["first_divergence"])
    assert parted["first_divergence"]["a"]["index"] == parted["first_divergence"]["b"]["index"]


# -- the hunt's other outcomes ---------------------------------------------------------------------


def test_a_hunt_in_the_optimizer_names_its_op_as_json(runs: dict[str, Done]) -> None:
    hunted = runs["hunt-optimizer"]
    assert not hunted.stderr, hunted.stderr  # no progress lines with --json
    answer = json.loads(hunted.stdout)
    assert answer["schema"] == "opguard.hunt/1" and answer["verdict"] == "diverged"
    assert (answer["step"], answer["rank"], answer["reproduced"]) == (120, 0, True)
    assert answer["found_by"].startswith("step 120 (rank 0): the step-level records first differ")
    assert answer["next"] is None
    for pass_, name in (("step_level", "steps"), ("op_level", "window")):
        assert answer[pass_]["schema"] == "opguard.diff/1"  # the whole diff objects
        for run in "ab":
            assert answer["runs"][f"{run}_{name}"] == f"hunt-optimizer/{run}-{name}"
            assert answer["logs"][f"{run}_{name}"] == f"hunt-optimizer/{run}-{name}.log"
    assert answer["step_level"]["first_divergence"]["cause"] == "optimizer"
    first = answer["op_level"]["first_divergence"]
    assert first["step"] == 120 and first["a"]["phase"] == "optimizer"
    assert first["a"]["call_site"]["line"] == line_of(SCRIPT, "opt.step")
    assert [a["name"] for a in first["arguments_differ"]] == ["alpha"]  # -lr


def test_a_difference_the_second_pass_does_not_repeat_is_said_plainly(
    runs: dict[str, Done],
) -> None:
    """Run B scales step 40's loss in its first recording only (``--once``): as a
    nondeterministic cause behaves. The hunt says the difference was not reproduced and what
    to record next time, instead of reporting the identical windows as the answer."""
    hunted = runs["hunt-once"]
    lines = hunted.stdout.splitlines()
    assert lines[0] == (
        "step 40 (rank 0): the step-level records first differ at the loss (first gradient: "
        "grad fc1.weight), but recorded again the runs' state is equal up to step 40: not "
        "reproduced, so the cause is nondeterministic (a race, a nondeterministic kernel, a "
        "hardware fault)"
    )
    assert lines[1] == "IDENTICAL  A: hunt-once/a-window  B: hunt-once/b-window"
    assert lines[-1].startswith("Next: record the next runs with a flight recorder (opguard ")
    assert "--keep-last 20" in lines[-1]


def test_identical_runs_take_one_pass_and_no_torch_in_the_hunt(root: Path, tmp_path: Path) -> None:
    """The hunt's own process reads traces and starts recordings: it never imports torch."""
    argv = ["hunt", "-o", str(tmp_path / "same"), "--json"]
    argv += ["--a", f"{SCRIPT} --steps 20", "--b", f"{SCRIPT} --steps 20"]
    outcome = cli_without(["torch"], [argv], tmp_path)
    assert outcome["codes"] == [0]
    assert outcome["attempts"] == [] and outcome["loaded"] == []
    assert sorted(p.name for p in (tmp_path / "same").iterdir()) == [
        "a-steps",
        "a-steps.log",
        "b-steps",
        "b-steps.log",
    ]


def test_a_failing_script_is_one_line_naming_the_run_and_its_output(root: Path) -> None:
    # --checkpoint-at without --checkpoint: torch.save(…, None) raises in step 1
    failing = f"{SCRIPT} --steps 3 --checkpoint-at 1"
    hunt = ("hunt", "-o", "hunt-fails", "--a", f"{SCRIPT} --steps 3", "--b", failing)
    hunted = _opguard(root, *hunt, "--json")
    assert hunted.code == 2 and not hunted.stdout
    assert hunted.stderr == (
        "opguard: error: run B failed while recorded at step level (exit status 1); its "
        "output: hunt-fails/b-steps.log\n"
    )
    assert "Traceback" in (root / "hunt-fails" / "b-steps.log").read_text()
    again = _opguard(root, *hunt)
    assert again.code == 2 and again.stderr.splitlines()[-1] == (
        "opguard: error: hunt-fails/a-steps exists (an earlier hunt?): pass --overwrite to "
        "replace it"
    )
    refused = _opguard(root, "hunt", "-o", "h", "--a", "-m opguard_no_such", "--b", failing)
    assert refused.code == 2
    assert refused.stderr.splitlines()[-1] == (
        "opguard: error: run A: opguard_no_such: no such module (output: h/a-steps.log)"
    )


# -- distributed -----------------------------------------------------------------------------------


@pytest.mark.skipif(not GLOO, reason="torch.distributed with gloo is not in this build")
def test_ddp_step_level_per_rank_names_the_rank_that_parted_first(runs: dict[str, Done]) -> None:
    """Rank 1 of run B alone takes step 20 with another learning rate: rank 1's parameters
    part at step 20, rank 0's gradients (DDP's all-reduce) at step 21. The step-level records
    name rank 1, and the hunt (of torchrun jobs) its optimizer op."""
    hunted = runs["hunt-ddp"]
    answer = json.loads(hunted.stdout)
    assert (answer["step"], answer["rank"], answer["reproduced"]) == (20, 1, True)
    steps = answer["step_level"]
    assert steps["first_divergence"]["cause"] == "optimizer"
    by_rank = {r["rank"]: r["step_level"] for r in steps["ranks"]}
    assert by_rank[0]["first_differing_step"] == 21 and by_rank[0]["cause"] == "gradient"
    assert by_rank[1]["first_differing_step"] == 20 and by_rank[1]["cause"] == "optimizer"
    ops = answer["op_level"]
    assert ops["origin_ranks"] == [1] and ops["first_divergence"]["rank"] == 1
    assert ops["first_divergence"]["a"]["call_site"]["line"] == line_of(DDP, "opt.step")


# -- the verdict, on written runs ---------------------------------------------------------------


def test_the_second_pass_decides_whether_the_step_is_reproduced(tmp_path: Path) -> None:
    found = hunt_of(tmp_path / "found", {"grad fc2.weight": 5}, {"grad fc2.weight": 5})
    assert found.reproduced is True and found.next_time is None and found.exit_code == 1
    assert found.found_by == (
        "step 5 (rank 0): the step-level records first differ at grad fc2.weight; recorded its "
        "ops in both runs:"
    )
    moved = hunt_of(tmp_path / "moved", {"grad fc2.weight": 5}, {"param": 3})
    assert moved.reproduced is False and "--keep-last 20" in str(moved.next_time)
    assert "but recorded again they first differ at step 3 (rank 0, param fc1.weight)" in (
        moved.found_by
    )
    equal = hunt_of(tmp_path / "equal", {"loss": 5, "grad": 5}, {})
    assert equal.reproduced is False
    assert "the runs' state is equal up to step 5: not reproduced" in equal.found_by
    assert equal.to_json()["reproduced"] is False
    same = hunt_of(tmp_path / "same", {}, None)
    assert (same.reproduced, same.exit_code, same.verdict) == (None, 0, "identical")
    assert same.found_by.startswith("identical: the step-level records of both runs agree (8 ")
    brief = same.to_json(brief=True)
    assert set(brief["step_level"]) == {"verdict", "first_divergence", "step_level", "notes"}
    assert brief["op_level"] is None and brief["runs"]["a_window"] is None


def test_targets_are_what_opguard_record_takes(tmp_path: Path) -> None:
    assert target_words(f"{SCRIPT} --lr '3e-4 x'", "--a") == ["--", str(SCRIPT), "--lr", "3e-4 x"]
    for module in ("-m pkg.train --x 1", "-m pkg.train -- --x 1"):
        assert target_words(module, "--b") == ["-m", "pkg.train", "--", "--x", "1"]
    for text, said in (
        ("", "--a is empty"),
        ("'x", "No closing quotation"),
        ("-m", "-m needs a module"),
        (str(tmp_path / "nope.py"), "nope.py: no such script"),
    ):
        with pytest.raises(HuntError, match=said):
            target_words(text, "--a")


def test_the_step_level_report_offers_the_hunt_only_for_what_it_can_record() -> None:
    """``Next:`` gives the hunt of both runs' own commands (a module too); not for a run
    recorded from code, or with a switch the hunt does not pass on."""
    from opguard.analysis import RunDiff
    from opguard.cli.diff_report import _hunt_command

    def command(*args: str) -> dict[str, Any]:
        return {"command": ["opguard", "record", "-o", "runs/x", *args]}

    def offered(meta_b: dict[str, Any]) -> str | None:
        a = command("--steps-only", "--", "train.py", "--lr", "3e-4")
        return _hunt_command(RunDiff("runs/a", "runs/b", a, meta_b, []))

    assert offered(command("-m", "pkg.train", "5")) == (
        "opguard hunt -o runs/hunt --a 'train.py --lr 3e-4' --b '-m pkg.train 5'"
    )
    assert offered(command("--window", "5:6", "--", "t.py")) is not None  # the hunt's own
    for switch in (["--eager"], ["--verify-inputs"], ["--first-step", "300"]):
        assert offered(command(*switch, "--", "t.py")) is None, switch
    assert offered({"command": ["python", "train.py"]}) is None  # opguard.record() in code
