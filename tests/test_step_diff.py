"""``opguard diff`` on step-level records: the first step and rank whose state differs, what
differs first in it (loss, gradient, optimizer, buffer, RNG), entries in one run only, windows
of op records inside step-level runs, the JSON keys and the human report.

The runs are written by :mod:`state_runs` with the real writer, shaped like the recorder's.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import lmdb
import msgpack
import pytest
from conftest import cli_in_process
from state_runs import write_state_run

from opguard._C import step_contents
from opguard.analysis import diff_runs, state_diff
from opguard.store import Run, schema
from opguard.store.states import comparable_entries

# What changes in run B from step 5 on, and what the diff must say of step 5.
CAUSES = {
    # a scaled loss: the loss, and from it every gradient, parameter and optimizer state
    "loss": ({"loss": 5, "grad": 5, "param": 5, "state": 5}, ("loss", "loss", "")),
    # one gradient first (the loss equal): that step's forward or backward
    "gradient": (
        {"grad fc2.weight": 5, "param": 5, "state": 5, "loss": 6},
        ("grad", "fc2.weight", ""),
    ),
    # equal gradients, different parameters: the optimizer
    "optimizer": ({"param": 5, "state": 5, "grad": 6, "loss": 6}, ("param", "fc1.weight", "")),
    "buffer": ({"buffer norm.running_var": 5, "loss": 6}, ("buffer", "norm.running_var", "")),
    "rng": ({"rng": 5, "loss": 6}, ("rng", "cpu", "")),
}


def _diff_json(a: Path, b: Path, *args: str, code: int = 1) -> dict[str, Any]:
    status, out, err = cli_in_process("diff", str(a), str(b), "--json", *args)
    assert status == code, err
    result: dict[str, Any] = json.loads(out)
    return result


def _pair(root: Path, differ: dict[str, int], **kw: Any) -> tuple[Path, Path]:
    return write_state_run(root / "a", **kw), write_state_run(root / "b", differ=differ, **kw)


@pytest.mark.parametrize("cause", list(CAUSES))
def test_names_the_first_differing_step_and_what_differs_first(tmp_path: Path, cause: str) -> None:
    differ, (kind, name, slot) = CAUSES[cause]
    result = _diff_json(*_pair(tmp_path, differ))
    assert result["schema"] == "opguard.diff/1" and result["verdict"] == "diverged"
    first = result["first_divergence"]
    assert (first["kind"], first["step"], first["rank"], first["cause"]) == ("state", 5, 0, cause)
    assert (first["a"], first["b"], first["observed"]) == (None, None, None)
    state = first["state"]
    assert (state["kind"], state["name"], state["slot"]) == (kind, name, slot)
    assert state["a"]["fingerprint"] != state["b"]["fingerprint"]
    assert first["rng_state_differs"] is (cause == "rng")
    assert result["step_level"]["first_differing_step"] == 5
    assert result["ranks"][0]["level"] == "step"
    assert result["ranks"][0]["step_level"]["compared"] == 6  # steps 0-4 equal, then step 5


def test_the_loss_names_the_first_differing_gradient_too(tmp_path: Path) -> None:
    """Issue 28's pair: a scale of 1.0001 on step 5's loss. The loss differs first; the first
    differing gradient and the count of each kind come with it."""
    first = _diff_json(*_pair(tmp_path, CAUSES["loss"][0]))["first_divergence"]
    assert first["cause"] == "loss"
    differ = first["states_differ"]
    assert differ["by_kind"]["grad"] == {"count": 5, "first": "grad fc1.weight"}
    assert differ["count"] == 1 + 5 + 5 + 10
    assert [e["kind"] for e in differ["first"]] == ["loss", "grad", "grad", "grad", "grad"]
    assert first["summary"] == (
        "loss differs at step 5 (and 20 more entries): the loss differs: the forward of step 5 "
        "(or the loss computed from it)"
    )


def test_a_loss_that_reached_nothing_is_said_not_a_divergence(tmp_path: Path) -> None:
    """``loss / 3`` against ``loss * (1.0 / 3)``: the loss given to ``backward()`` rounds
    apart from step 4 on, every gradient, parameter and state is equal. The training is the
    same: identical, with a note; a gradient that differs later is still the divergence."""
    result = _diff_json(*_pair(tmp_path, {"loss": 4}), code=0)
    assert result["verdict"] == "identical" and result["first_divergence"] is None
    (rank,) = result["ranks"]
    assert rank["step_level"]["compared"] == 10
    (note,) = [n for n in rank["notes"] if "backward()" in n]
    assert note.startswith("step 4: the loss given to backward() differs (")
    assert note.endswith("while every gradient is equal: it reached nothing the step computed")
    first = _diff_json(*_pair(tmp_path / "later", {"loss": 4, "grad fc1.bias": 7}))[
        "first_divergence"
    ]
    assert first["step"] == 7
    assert first["states_differ"]["by_kind"]["grad"] == {"count": 1, "first": "grad fc1.bias"}


def test_optimizer_states_alone_are_the_optimizer(tmp_path: Path) -> None:
    first = _diff_json(*_pair(tmp_path, {"state fc2.bias exp_avg_sq": 3}))["first_divergence"]
    assert (first["cause"], first["state"]["name"], first["state"]["slot"]) == (
        "optimizer",
        "fc2.bias",
        "exp_avg_sq",
    )
    assert "gradients equal, optimizer states differ" in first["summary"]


def test_identical_runs(tmp_path: Path) -> None:
    result = _diff_json(*_pair(tmp_path, {}), code=0)
    assert result["verdict"] == "identical" and result["first_divergence"] is None
    assert result["step_level"]["first_differing_step"] is None
    assert result["ranks"][0]["step_level"]["compared"] == 10


@pytest.mark.parametrize("native", [True, False], ids=["native", "python"])
def test_equal_states_in_other_bytes_are_equal(
    tmp_path: Path, native: bool, monkeypatch: pytest.MonkeyPatch
) -> None:
    """State names interned in another order, stats computed as on another device: no step's
    bytes are equal, yet the states are, and the step whose content differs is still found
    (by the extension's reading of the records, and by Python's for an extension without
    it)."""
    if not native:
        monkeypatch.setattr(state_diff, "_step_contents", None)
    a = write_state_run(tmp_path / "a")
    for name, other in (("names", {"reverse_names": True}), ("stats", {"other_stats": True})):
        b = write_state_run(tmp_path / name, **other)
        assert _diff_json(a, b, code=0)["verdict"] == "identical", name
        c = write_state_run(tmp_path / f"{name}-c", differ={"grad fc2.bias": 4}, **other)
        first = _diff_json(a, c)["first_divergence"]
        assert (first["step"], first["state"]["name"]) == (4, "fc2.bias")


def test_step_contents_leave_out_only_what_equal_states_may_differ_in(tmp_path: Path) -> None:
    """The extension's and Python's readings: stats left out, names mapped; a fingerprint, a
    shape or a name still tells the records apart."""
    runs = {
        name: write_state_run(tmp_path / name, steps=[0], **kw)
        for name, kw in {
            "a": {},
            "stats": {"other_stats": True},
            "grad": {"differ": {"grad fc1.bias": 0}},
            "names": {"reverse_names": True},
        }.items()
    }
    raws, names = {}, {}
    for name, path in runs.items():
        with Run(path) as run:
            ((_, raws[name]),) = run.rank(0).raw_steps()
            names[name] = run.rank(0).state_names
    ids_a = {n: i for i, n in names["a"].items()}
    rename = [ids_a[names["names"][i]] for i in range(len(names["names"]))]
    for contents in (step_contents, comparable_entries):
        assert contents(raws["a"]) == contents(raws["stats"])
        assert contents(raws["a"]) != contents(raws["grad"])
        assert contents(raws["a"]) != contents(raws["names"])
        assert contents(raws["a"]) == contents(raws["names"], rename)
        assert contents(b"not a record") is None


def test_entries_in_one_run_only_are_said_not_compared(tmp_path: Path) -> None:
    extra = ("buffer", "extra.running_mean", "")
    a = write_state_run(tmp_path / "a", extra=[extra])
    b = write_state_run(tmp_path / "b", missing=[("grad", "fc2.bias", "")])
    result = _diff_json(a, b, code=0)
    assert any(
        "recorded in one run only" in n
        and "buffer extra.running_mean (A)" in n
        and "grad fc2.bias (A)" in n
        for n in result["notes"]
    ), result["notes"]
    c = write_state_run(tmp_path / "c", missing=[("grad", "fc2.bias", "")], differ={"param": 2})
    first = _diff_json(a, c)["first_divergence"]
    assert first["states_only_in"] == {
        "a": ["grad fc2.bias", "buffer extra.running_mean"],
        "b": [],
        "count_a": 2,
        "count_b": 0,
    }
    assert "1 gradient(s) recorded in one run only" in first["summary"]


def test_two_ranks_name_the_earliest_step_then_the_lowest_rank(tmp_path: Path) -> None:
    for rank, step in ((0, 6), (1, 4), (2, 4)):
        write_state_run(tmp_path / "a", rank=rank)
        write_state_run(tmp_path / "b", rank=rank, differ={"grad": step})
    result = _diff_json(tmp_path / "a", tmp_path / "b")
    assert (result["first_divergence"]["rank"], result["first_divergence"]["step"]) == (1, 4)
    assert [r["step_level"]["first_differing_step"] for r in result["ranks"]] == [6, 4, 4]
    assert result["step_level"]["rank"] == 1


def test_a_window_whose_state_already_differed(tmp_path: Path) -> None:
    """Op records for step 7 only (``--window 7:8``), step-level records for all: the op-level
    diff names the window's op, and a note and the JSON say the state differed from step 4."""
    a = write_state_run(tmp_path / "a", op_steps=[7])
    b = write_state_run(tmp_path / "b", op_steps=[7], ops_differ_from=7, differ={"grad": 4})
    result = _diff_json(a, b)
    first = result["first_divergence"]
    assert (first["kind"], first["step"], first["a"]["op"]) == ("origin", 7, "aten::mm.default")
    assert result["step_level"] == {
        "first_differing_step": 4,
        "rank": 0,
        "cause": "gradient",
        "entry": "grad fc1.weight",
        "window_start": 7,
        "differed_before_window": True,
        "envelope": None,  # bit for bit
    }
    assert any(
        "already differed when the op-level records began (step 7): first at step 4" in note
        for note in result["notes"]
    )
    assert result["ranks"][0]["steps_a"] == 10  # the step-level records count every step
    c = write_state_run(tmp_path / "c", op_steps=[7], ops_differ_from=7, differ={"grad": 7})
    later = _diff_json(a, c)
    assert later["step_level"]["differed_before_window"] is False
    assert not any("already differed" in note for note in later["notes"])


def test_a_window_with_equal_ops_still_diverges_at_step_level(tmp_path: Path) -> None:
    a = write_state_run(tmp_path / "a", op_steps=[2])
    b = write_state_run(tmp_path / "b", op_steps=[2], differ={"param": 6})
    result = _diff_json(a, b)
    assert result["verdict"] == "diverged" and result["aligned"] == 2
    assert (result["first_divergence"]["kind"], result["first_divergence"]["step"]) == ("state", 6)


def test_full_op_level_diff_cross_checks_the_first_step(tmp_path: Path) -> None:
    a = write_state_run(tmp_path / "a", op_steps=range(10))
    b = write_state_run(
        tmp_path / "b", op_steps=range(10), ops_differ_from=3, differ={"grad": 3, "param": 3}
    )
    result = _diff_json(a, b)
    assert (result["first_divergence"]["kind"], result["first_divergence"]["step"]) == (
        "origin",
        3,
    )
    level = result["step_level"]
    assert (level["first_differing_step"], level["window_start"]) == (3, 0)
    assert level["differed_before_window"] is False
    assert result["ranks"][0]["level"] == "op"


def test_traces_without_step_records_keep_their_json(tmp_path: Path) -> None:
    a = write_state_run(tmp_path / "a", op_steps=range(3), step_records=False)
    b = write_state_run(tmp_path / "b", op_steps=range(3), step_records=False, ops_differ_from=1)
    result = _diff_json(a, b)
    assert result["first_divergence"]["kind"] == "origin"
    assert result["step_level"] is None and result["ranks"][0]["step_level"] is None


def test_one_run_recorded_ops_the_other_steps_only(tmp_path: Path) -> None:
    a = write_state_run(tmp_path / "a", op_steps=range(10))
    b = write_state_run(tmp_path / "b", differ={"loss": 8, "grad": 8})
    result = _diff_json(a, b)
    assert (result["first_divergence"]["kind"], result["first_divergence"]["step"]) == ("state", 8)
    assert any("run A holds op records" in note for note in result["notes"])


def test_nothing_to_compare_is_an_error(tmp_path: Path) -> None:
    """Op records without step-level records against step-level records without ops."""
    ops_only = write_state_run(tmp_path / "ops", op_steps=range(3), step_records=False)
    steps_only = write_state_run(tmp_path / "steps")
    code, out, err = cli_in_process("diff", str(ops_only), str(steps_only))
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and "holds no step-level records" in err, err


def test_step_option_compares_that_step(tmp_path: Path) -> None:
    a, b = _pair(tmp_path, {"grad": 5})
    assert _diff_json(a, b, "--step", "3", code=0)["ranks"][0]["step_level"]["compared"] == 1
    assert _diff_json(a, b, "--step", "7")["first_divergence"]["step"] == 7
    short = write_state_run(tmp_path / "short", steps=range(5))
    code, _, err = cli_in_process("diff", str(a), str(short), "--step", "8")
    assert code == 2 and "step 8 was recorded only in run A" in err


def test_steps_recorded_in_one_run_only(tmp_path: Path) -> None:
    """A run resumed from a checkpoint at step 4 holds step-level records of steps 4-9."""
    a = write_state_run(tmp_path / "a")
    b = write_state_run(tmp_path / "b", steps=range(4, 10))
    result = _diff_json(a, b, code=0)
    assert result["ranks"][0]["step_level"]["steps_only_in_a"] == [[0, 3]]
    assert "steps 0-3: step-level records only in run A" in result["notes"]
    assert result["ranks"][0]["step_level"]["compared"] == 6


def test_an_unfinished_run_is_a_note_and_a_damaged_step_record_incomplete(tmp_path: Path) -> None:
    """A run that stopped early is compared up to its last step (a note); a step record that
    does not decode is damage, never a verdict of equality: incomplete, exit 3."""
    a = write_state_run(tmp_path / "a")
    b = write_state_run(tmp_path / "b", finished=False)
    notes = _diff_json(a, b, code=0)["notes"]
    assert (
        "run B did not finish (killed, crashed or still recording): compared up to its last recorded step"
        in notes
    )
    env = lmdb.open(str(b / "rank-0"), max_dbs=len(schema.DB_NAMES))
    with env.begin(write=True) as txn:
        txn.put(
            schema.op_key(3),
            msgpack.packb({"s": 3, "e": "not entries"}),
            db=env.open_db(b"steps", txn=txn),
        )
    env.close()
    result = _diff_json(a, b, code=3)
    assert result["verdict"] == "incomplete"
    assert result["ranks"][0]["step_level"]["compared"] == 4
    damaged = [n for n in result["notes"] if "stopped at a damaged step record: step 3" in n]
    assert len(damaged) == 1, result["notes"]  # said once


def test_the_report_says_what_differs_what_it_means_and_what_to_run(tmp_path: Path) -> None:
    a, b = _pair(tmp_path, CAUSES["gradient"][0])
    code, out, err = cli_in_process("diff", str(a), str(b))
    assert code == 1, err
    assert out.startswith("DIVERGED")
    assert "First differing step — rank 0, step 5, kind: state (gradient)" in out
    assert "the gradients differ: the forward or backward of step 5" in out
    assert "grad fc2.weight differs:" in out
    with Run(a) as run_a, Run(b) as run_b:
        pair = diff_runs(run_a, run_b).state_first.first  # type: ignore[union-attr]
    for run, entry in (("A", pair.a), ("B", pair.b)):
        assert entry is not None
        value = entry.tensor.values()[0]
        assert f"{run}: float32[4] fp {entry.tensor.fingerprint_text()}" in out
        assert f"values [{value:.8g}" in out  # the leading values, then bits and stats
    assert "differing in step 5: 1 grad (first fc2.weight), 5 param" in out
    assert f"opguard record --window 5:6 --steps 6 -o {a}-step5 -- SCRIPT ARGS" in out
    assert f"opguard diff {a}-step5 {b}-step5" in out
    assert "step-level records: first differ at step 5 in grad fc2.weight, 5 steps equal" in out
    assert "both runs: 10 steps" in out


def test_the_report_of_the_optimizer(tmp_path: Path) -> None:
    code, out, _ = cli_in_process("diff", *map(str, _pair(tmp_path, CAUSES["optimizer"][0])))
    assert code == 1
    assert "gradients equal, parameters differ: the optimizer step of step 5" in out


def test_capture_refuses_a_step_level_only_difference(tmp_path: Path) -> None:
    code, out, err = cli_in_process("capture", *map(str, _pair(tmp_path, {"grad": 2})))
    assert code == 2 and "identical" not in out
    assert "step-level records only (first at step 2)" in err and "--window 2:3" in err
