"""Zooming into the evidence on recorded CPU runs: capture (and that it changes nothing),
``opguard capture`` re-recording around the first divergence, the element-wise diff of the
scenario pairs, replay against the recorded fingerprints, the NaN/Inf origin, and one-line
errors for bad input."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import line_of, run_cli
from scenario_runs import BASE, session_recordings
from test_imports import _explain, cli_without

from opguard.store import Run

pytestmark = pytest.mark.slow  # long in all: started first (conftest.py)


@pytest.fixture(scope="module")
def recordings(tmp_path_factory: pytest.TempPathFactory):
    return session_recordings(tmp_path_factory)


def _json(*args: str, codes: tuple[int, ...] = (0, 1)) -> dict[str, Any]:
    result = run_cli(*args)
    assert result.returncode in codes, result.stderr
    return json.loads(result.stdout)


@pytest.fixture(scope="module")
def gelu_captures(recordings) -> tuple[Path, Path, str]:
    """``opguard capture`` on the tanh-GELU pair: (A capture, B capture, its stdout)."""
    base, variant = recordings("base", "gelu_tanh")
    new = (Path(f"{base}-gelu"), Path(f"{variant}-gelu"))
    result = run_cli("capture", str(base), str(variant), "-o", *map(str, new), "--window", "1")
    assert result.returncode == 0, result.stderr
    return *new, result.stdout


@pytest.fixture(scope="module")
def seed_captures(recordings) -> tuple[Path, Path]:
    base, variant = recordings("base", "seed")
    result = run_cli("capture", str(base), str(variant))  # into BASE-capture, SEED-capture
    assert result.returncode == 0, result.stderr
    return Path(f"{base}-capture"), Path(f"{variant}-capture")


def test_capture_changes_no_number(recordings, tmp_path: Path) -> None:
    """A recording with captures prints the same losses and records the same fingerprints."""
    (base,) = recordings("base")
    run_dir = tmp_path / "captured"
    spec = "aten::addmm.default,aten::mm.default,base.py:26,0-3"
    result = run_cli("record", "-o", str(run_dir), "--capture", spec, "--", str(BASE))
    assert result.returncode == 0, result.stderr
    assert result.stdout == Path(f"{base}.stdout").read_text()
    assert run_cli("diff", str(base), str(run_dir)).returncode == 0
    with Run(run_dir) as run:
        trace = run.rank(0)
        info = trace.info["capture"]
        assert info["spec"] == spec and info["tensors"] > 0 and not info["limit_hit"]
        names = {trace.op(i).op for i in trace.captured_ops()}
        lines = {trace.op(i).call_site.line for i in trace.captured_ops()}
        assert {"aten::addmm.default", "aten::mm.default"} <= names
        assert 26 in lines and {2, 3} <= set(trace.captured_ops())
        # Ops 0 and 1 (torch.empty) wrote nothing yet: uninitialized memory is not captured.
        assert trace.captures(0) == [] and [t.label for t in trace.captures(2)] == ["output 0"]
        # Each capture holds what the op recorded: same shape, and the bytes' fingerprint.
        for index in trace.captured_ops()[:20]:
            op = trace.op(index)
            for t in trace.captures(index):
                entry = (op.inputs if t.direction == "x" else op.outputs)[t.position]
                assert (t.slot, t.dtype, t.shape) == (entry.slot, entry.dtype, entry.shape)
                assert len(t.raw()) == entry.nbytes or entry.is_view


def test_capture_limit_is_kept_and_reported(tmp_path: Path) -> None:
    run_dir = tmp_path / "capped"
    result = run_cli(
        "record", "-o", str(run_dir), "--capture", "aten::mm", "--capture-limit", "2KiB",
        "--", str(BASE),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "capture limit 2.0 KiB reached" in result.stderr
    with Run(run_dir) as run:
        info = run.rank(0).info["capture"]
    assert info["limit_hit"] and info["skipped"] > 0 and 0 < info["bytes"] <= 2048
    assert info["first_skipped"][1] in ("input", "output")


def test_capture_command_prints_the_next_commands(gelu_captures) -> None:
    a, b, stdout = gelu_captures
    assert f"opguard tensor {a} {b} --op 18" in stdout
    assert f"opguard replay {a} --op 18 --against {b}" in stdout
    with Run(a) as run:
        trace = run.rank(0)
        assert trace.captured_ops() == [17, 18, 19]  # the divergent op and a window of 1
        assert run.meta["capture"]["spec"] == "17-19"
        assert trace.info["end"]["steps"] == 1  # stopped after the step that diverged


def test_activation_variant_is_a_smooth_small_error(gelu_captures) -> None:
    a, b, _ = gelu_captures
    report = _json("tensor", str(a), str(b), "--op", "18", "--json")
    (d,) = report["tensors"]
    assert report["a"]["op"] == report["b"]["op"] == "aten::gelu.default"
    assert d["tensor"] == "output 0" and d["fraction"] > 0.5
    assert d["max_rel_error"] < 1e-2 and d["ulp_max"] > 16
    assert d["verdict"].startswith("smooth small error")
    assert d["first_differing"][0]["a_bits"] != d["first_differing"][0]["b_bits"]
    assert sum(d["where"][0]["bins"]) == d["differing"]
    # The inputs were equal: the same element-wise report says so.
    same = _json("tensor", str(a), str(b), "--op", "18", "--input", "self", "--json")
    assert same["tensors"][0]["verdict"] == "identical"
    text = run_cli("tensor", str(a), str(b), "--op", "18")
    assert text.returncode == 1 and "→ smooth small error" in text.stdout


def test_changed_seed_is_a_different_mask(seed_captures) -> None:
    a, b = seed_captures
    report = _json("tensor", str(a), str(b), "--op", "20", "--json")
    (d,) = report["tensors"]
    assert report["a"]["op"] == "aten::bernoulli_.float"
    assert d["verdict"].startswith("different mask")
    assert {p["a"] for p in d["first_differing"]} | {p["b"] for p in d["first_differing"]} <= {
        0.0,
        1.0,
    }


def test_replay_reproduces_the_recorded_fingerprints(gelu_captures) -> None:
    a, b, _ = gelu_captures
    report = _json("replay", str(a), "--op", "18", "--times", "3", "--against", str(b), "--json")
    assert report["devices"] == [
        {
            "device": "cpu",
            "results": [report["recorded_a"]] * 3,
            "distinct": 1,
            "deterministic": True,
        }
    ]
    assert report["deterministic"] and report["matches_a"] and report["inputs_faithful"]
    assert report["matches_b"] is False and report["b_inputs_equal"] is True
    assert [d["name"] for d in report["b_arguments_differ"]] == ["approximate"]
    (ref,) = report["reference"]["outputs"]
    # tanh GELU is further from the exact (erf) GELU in float64 than the float32 erf GELU is.
    assert ref["a"]["rel"] < 1e-6 < ref["b"]["rel"] < 1e-2
    assert ref["replay"] == ref["a"]


def test_replay_of_gemms_with_transposed_weights(recordings, tmp_path: Path) -> None:
    """Linear layers read the weight transposed: the replay must give the GEMM that layout to
    take the recorded path and reproduce its bits."""
    run_dir = tmp_path / "gemms"
    result = run_cli("record", "-o", str(run_dir), "--capture", "aten::addmm,aten::mm", "--steps",
                     "1", "--", str(BASE))  # fmt: skip
    assert result.returncode == 0, result.stderr
    with Run(run_dir) as run:
        ops = run.rank(0).captured_ops()
    assert len(ops) >= 6
    for index in ops:
        report = _json("replay", str(run_dir), "--op", str(index), "--times", "2", "--json")
        assert report["matches_a"] and report["deterministic"], report


PLAIN_ARGUMENTS_SCRIPT = """
import torch
torch.manual_seed(0)
x = torch.randn(4, 4)
idx = torch.tensor([2, 0])
a = x * 1.0  # <- number
b = torch.add(x, 2, alpha=3)  # <- int
c = x * 1j  # <- complex
d = x[:, idx]  # <- none in list
"""


def test_replay_of_plain_values_where_a_tensor_is_taken(write_script, record) -> None:
    """``x * 1.0`` calls ``mul.Tensor`` with ``other=1.0``: the schema says Tensor, the trace
    holds the number among the arguments. ``x[:, idx]`` indexes with ``[None, idx]``, of which
    only ``indices[1]`` is a tensor. The replay passes each as the call did and reproduces it."""
    script = write_script("plain_arguments.py", PLAIN_ARGUMENTS_SCRIPT)
    spec = ",".join(f"plain_arguments.py:{line_of(script, tag)}"
                    for tag in ("number", "int", "complex", "none in list"))  # fmt: skip
    run_dir = record(script, extra=("--capture", spec))
    with Run(run_dir) as run:
        trace = run.rank(0)
        ops = {i: trace.op(i).op for i in trace.captured_ops()}
    assert sorted(ops.values()) == [
        "aten::add.Tensor", "aten::index.Tensor", "aten::mul.Tensor", "aten::mul.Tensor"
    ]  # fmt: skip
    for index in ops:
        report = _json("replay", str(run_dir), "--op", str(index), "--times", "2", "--json")
        assert report["matches_a"] and report["deterministic"], report
        assert report["inputs_faithful"], report


NAN_SCRIPT = """
import torch
torch.manual_seed(0)
w = torch.nn.Parameter(torch.randn(4, 4))
opt = torch.optim.SGD([w], lr=0.1)
for step in range(3):
    h = torch.randn(8, 4) @ w
    if step == 1:
        h = h / torch.zeros(())  # Inf here
        h = h * 0  # NaN here
    loss = h.square().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


def test_nan_origin_is_found(recordings, write_script, record) -> None:
    run_dir = record(write_script("nan_train.py", NAN_SCRIPT))
    report = _json("nan", str(run_dir), "--json", codes=(1,))
    (rank,) = report["ranks"]
    origin, nan = rank["origin"], rank["nan_origin"]
    assert (origin["op"], origin["step"], origin["call_site"]["line"]) == ("aten::div.Tensor", 1, 9)
    assert origin["outputs"] == [{"slot": "0", "nan": 0, "inf": 32}] and origin["inputs"] == []
    assert (nan["op"], nan["call_site"]["line"]) == ("aten::mul.Tensor", 10)
    assert rank["first_seen"]["index"] == origin["index"] and not rank["from_outside"]
    assert rank["intended"] is None  # the Inf made NaN: neither is intended
    (base,) = recordings("base")
    assert run_cli("nan", str(base)).returncode == 0
    diff = _json("diff", str(base), str(run_dir), "--json")
    assert diff["nonfinite"]["a"] == []
    assert diff["nonfinite"]["b"][0]["origin"]["index"] == origin["index"]
    assert _json("diff", str(base), str(run_dir), "--step", "0", "--json")["nonfinite"] is None
    text = run_cli("diff", str(base), str(run_dir))
    assert "first made (inputs finite): #" in text.stdout and "aten::div.Tensor" in text.stdout


def test_detail_pane_shows_the_captured_difference(gelu_captures) -> None:
    from test_tui import _text

    from opguard.analysis.browse.rows import RankRows
    from opguard.tui.detail import Selection, render

    a, b, _ = gelu_captures
    with Run(a) as run_a, Run(b) as run_b:
        traces = (run_a.rank(0), run_b.rank(0))
        row = next(r for r in RankRows(*traces).rows(0) if r.a is not None and r.a.index == 18)
        text = _text(render(Selection.load(row, traces)))
    assert "captured tensors" in text and "smooth small error" in text
    assert "dim 0 " in text and "dim 1 " in text


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("tensor", "{a}", "{b}", "--op", "40"), "op 40 was not captured (captured ops: 17-19)"),
        (("tensor", "{a}", "{b}", "--op", "99999"), "no op 99999"),
        (("tensor", "{a}", "{missing}", "--op", "18"), "no such run directory"),
        (("tensor", "{a}", "{b}", "--op", "18", "--output", "5"), "no captured output '5'"),
        (("replay", "{a}", "--op", "40"), "op 40 was not captured"),
        (("replay", "{a}", "--op", "99999"), "no op 99999"),
        (("replay", "{notrace}", "--op", "1"), "not an OpGuard run"),
        (("nan", "{notrace}"), "not an OpGuard run"),
        (("record", "-o", "{missing}", "--capture", "relu", "--", "x.py"), "cannot read capture"),
        (
            (
                "record",
                "-o",
                "{missing}",
                "--capture",
                "1",
                "--capture-limit",
                "lots",
                "--",
                "x.py",
            ),
            "cannot read size",
        ),
        (("capture", "{a}", "{notrace}"), "not an OpGuard run"),
    ],
)
def test_bad_input_is_one_line_and_exit_2(
    gelu_captures, tmp_path: Path, args: tuple[str, ...], message: str
) -> None:
    a, b, _ = gelu_captures
    (tmp_path / "notrace").mkdir()
    paths = {"a": a, "b": b, "missing": tmp_path / "missing", "notrace": tmp_path / "notrace"}
    result = run_cli(*(arg.format(**paths) for arg in args))
    assert result.returncode == 2
    assert message in result.stderr and len(result.stderr.strip().splitlines()) == 1, result.stderr


def test_random_ops_are_not_replayed(seed_captures) -> None:
    a, _ = seed_captures
    result = run_cli("replay", str(a), "--op", "20")
    assert result.returncode == 2 and "random op" in result.stderr


def test_the_demo_masks_are_intended(demo_runs: tuple[Path, Path]) -> None:
    """The demo's causal mask fills the scores with -inf, which the softmax turns into zeros:
    meant, so ``opguard nan`` names no origin and exits 0, counting them apart."""
    baseline, _ = demo_runs
    result = run_cli("nan", str(baseline))
    assert result.returncode == 0, result.stderr
    assert "8 op(s) output NaN or Inf, all intended" in result.stdout
    (rank,) = _json("nan", str(baseline), "--json", codes=(0,))["ranks"]
    assert rank["origin"] is rank["nan_origin"] is rank["first_seen"] is None
    assert rank["ops"] == rank["intended"]["ops"] == 8
    assert rank["intended"]["first"]["op"] == "aten::masked_fill.Scalar"


INTENDED_SCRIPT = """
import torch
torch.manual_seed(0)
T = 4
w = torch.nn.Parameter(torch.randn(T, T))
opt = torch.optim.SGD([w], lr=0.1)
causal = torch.full((T, T), float("-inf")).triu(1)  # <- mask
for step in range(3):
    scores = w * 1.0 + causal[None, :, :]  # the mask added through views, then the softmax
    handled = torch.nan_to_num(w.detach() / 0.0, posinf=0.0, neginf=0.0)
    loss = (scores.softmax(-1) + handled).sum()
    if step == 1:
        masked = w.detach().masked_fill(torch.ones(T, T, dtype=torch.bool), float("-inf"))  # <- all
        loss = loss + masked.softmax(-1).sum()  # <- NaN
    opt.zero_grad()
    loss.backward()
    opt.step()
"""


def test_intended_values_are_told_from_a_nan_they_do_not_explain(write_script, record) -> None:
    """A mask made once and added through views in every step, and an Inf that nan_to_num
    replaces, are intended; a row masked whole, whose softmax makes NaN that reaches the loss, is
    not: its masked_fill is the origin and the softmax the NaN origin."""
    script = write_script("intended.py", INTENDED_SCRIPT)
    (rank,) = _json("nan", str(record(script)), "--json", codes=(1,))["ranks"]
    origin, nan, intended = rank["origin"], rank["nan_origin"], rank["intended"]
    assert (origin["op"], origin["step"]) == ("aten::masked_fill.Scalar", 1)
    assert origin["call_site"]["line"] == line_of(script, "all")
    assert (nan["op"], nan["call_site"]["line"]) == (
        "aten::_softmax.default",
        line_of(script, "NaN"),
    )
    assert (intended["first"]["op"], intended["first"]["call_site"]["line"]) == (
        "aten::full.default",
        line_of(script, "mask"),
    )
    assert intended["ops"] < rank["ops"]


@pytest.mark.parametrize("command", ["tensor", "nan"])
def test_reading_captures_does_not_import_torch(gelu_captures, tmp_path: Path, command) -> None:
    a, b, _ = gelu_captures
    argv = ["tensor", str(a), str(b), "--op", "18"] if command == "tensor" else ["nan", str(a)]
    outcome = cli_without(["torch"], [argv], tmp_path)
    assert outcome["codes"][0] in (0, 1)
    assert outcome["attempts"] == [], _explain(outcome)
