"""Issue 38 section 4: long runs under ``--tolerant``. Step-level records are judged against the
envelope rounding produces over steps (opguard/analysis/tolerant/envelope.py), the first step
beyond it is named, and ``opguard hunt --tolerant`` names the op there.

Generated cases first (no torch): trajectories of step-level records whose differences grow as
rounding's do, at rates from none to faster than the analytic envelope allows, with and
without a control run, and real changes (a jump at step N, an RNG state) behind them. Then
recorded runs of tests/long_runs/rounding_train.py on the CPU: a pair that differs by rounding
alone every step (its batches taken through ``(x * 3) / 3``) is WITHIN-ROUNDING, with and
without a control recorded with ``--steps-only --perturb-rounding``; the same pair with the
learning rate changed from step 8 is named at step 8; ``opguard hunt --tolerant`` on it names
the optimizer's op and the line; a training that blows up (lr 0.5) amplifies rounding faster
than the analytic envelope allows, and a control run measures that.
"""

from __future__ import annotations

import json
import math
import os
import shlex
import zlib
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import cli_in_process, line_of, run_cli
from sketch_reference import stored_sketch
from test_docs import assert_specified
from traces import TraceBuilder

from opguard.analysis import diff_runs
from opguard.analysis.contract import SCHEMA as DIFF_SCHEMA
from opguard.analysis.contract import to_json
from opguard.analysis.tolerant.envelope import GROWTH, RATE, STEP_ROUNDINGS, STEP_SAFETY
from opguard.analysis.tolerant.rule import Tolerance
from opguard.hunt import SCHEMA as HUNT_SCHEMA
from opguard.store import Run

SCRIPT = Path(__file__).resolve().parent / "long_runs" / "rounding_train.py"
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
AT = 8  # run B's learning rate changes from step 8 on
U = 2.0**-24  # float32's unit roundoff

# -- generated step-level records -------------------------------------------------------------

# (kind, name, shape) of the generated state: the loss, a weight's gradient, the weight, a
# bias of four elements; then an optimizer state (no sketch) and the CPU generator's state.
JUDGED = (
    ("loss", "loss", ()),
    ("grad", "w", (32, 16)),
    ("param", "w", (32, 16)),
    ("param", "b", (4,)),
)
STEPS = 10


def _values(step: int, shape: tuple[int, ...], seed: int) -> np.ndarray:
    """Run A's values of an entry at a step (float64, about 0.1 each; the loss about 1),
    moving a little from step to step as training does."""
    generator = np.random.default_rng([seed, len(shape), math.prod(shape)])
    start, move = generator.standard_normal(shape), generator.standard_normal(shape)
    return 0.1 * (start + 0.01 * step * move) + (1.0 if not shape else 0.0)


def _moved(values: np.ndarray, relative: float, key: list[int]) -> np.ndarray:
    """``values`` moved by ``relative`` times their norm, in a random direction (``key``)."""
    if relative == 0.0:
        return values
    direction = np.random.default_rng(key).standard_normal(values.shape)
    norm = float(np.linalg.norm(direction)) or 1.0
    return values + relative * float(np.linalg.norm(values)) * direction / norm


def _fields(values: np.ndarray) -> dict[str, Any]:
    """A float32 state entry as the recorder stores it, with its sketch."""
    stored = np.asarray(values, dtype=np.float32)
    raw = stored.tobytes()
    return {
        "d": "float32",
        "s": list(stored.shape),
        "h": zlib.crc32(raw),
        "z": len(raw),
        "w": stored_sketch(stored.astype(np.float64)),
        "f": 0,
    }


def _write(
    path: Path,
    moved: Mapping[int, float],
    *,
    seed: int,
    state_moved: float = 0.0,
    rng_from: int | None = None,
    sketches: bool = True,
    jumps: Mapping[tuple[int, str], float] | None = None,
) -> Path:
    """A run whose judged entries sit ``moved[step]`` (relative) from run A's at each step
    (``jumps``: (step, ``kind name``) moved by that instead), its optimizer state
    ``state_moved`` away, and its RNG state other from step ``rng_from`` on."""
    with TraceBuilder(path) as builder:
        ids = {name: builder.state_name(name) for name in ("loss", "w", "b", "cpu")}
        for step in range(STEPS):
            entries = []
            for n, (kind, name, shape) in enumerate(JUDGED):
                relative = (jumps or {}).get((step, f"{kind} {name}"), moved.get(step, 0.0))
                values = _moved(_values(step, shape, 0), relative, [seed, step, n])
                fields = _fields(values)
                if not sketches:
                    del fields["w"]
                entries.append((kind, ids[name], "0" if kind == "loss" else "", fields))
            exp_avg = _values(step, (32, 16), 1) * (1 + state_moved)
            state = {k: v for k, v in _fields(exp_avg).items() if k != "w"}
            entries.append(("state", ids["w"], "exp_avg", state))
            generator = bytes([step, int(rng_from is not None and step >= rng_from)] * 8)
            entries.append(
                (
                    "rng",
                    ids["cpu"],
                    "",
                    {"d": "uint8", "s": [16], "h": zlib.crc32(generator), "z": 16, "f": 0},
                )
            )
            builder.step_record(step, entries)
    return path


def _series(start: float, growth: float, saturation: float = 1e-2) -> dict[int, float]:
    """A distance growing ``growth``-fold a step from ``start`` until it saturates."""
    return {step: min(start * growth**step, saturation) for step in range(STEPS)}


def _judge(a: Path, b: Path, control: Path | None = None) -> dict[str, Any]:
    tolerance = Tolerance(noise=str(control) if control is not None else None)
    with Run(a) as run_a, Run(b) as run_b:
        return to_json(diff_runs(run_a, run_b, tolerance=tolerance))


@pytest.fixture(scope="module")
def generated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("generated")
    _write(root / "a", {}, seed=0)
    return root


@pytest.mark.parametrize("growth", [1.0, 2.0, RATE])
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_drift_growing_within_the_analytic_rate_is_within_rounding(
    generated: Path, growth: float, seed: int
) -> None:
    """Differences that start at a few roundings and grow up to RATE-fold a step, every entry
    in its own direction, as rounding's do over steps."""
    b = _write(generated / f"b-{growth}-{seed}", _series(8 * U, growth), seed=seed)
    result = _judge(generated / "a", b)
    assert result["verdict"] == "within-rounding", result["first_divergence"]
    assert result["ranks"][0]["step_level"]["rounding"]["explained"] == 4 * STEPS


@pytest.mark.parametrize("jump", [100.0, 1e4])
@pytest.mark.parametrize("entry", ["param w", "param b", "loss loss", "grad w"])
def test_a_jump_beyond_the_growth_names_its_step_and_entry(
    generated: Path, jump: float, entry: str
) -> None:
    """A real change at step 6 in one entry: past GROWTH-fold what the state drifted to."""
    drift = _series(8 * U, 1.5)
    b = _write(
        generated / f"jump-{entry}-{jump}",
        drift,
        seed=1,
        jumps={(6, entry): jump * GROWTH * drift[5]},
    )
    result = _judge(generated / "a", b)
    first = result["first_divergence"]
    assert (result["verdict"], first["kind"], first["step"]) == ("diverged", "state", 6)
    beyond = first["beyond"]["first"][0]
    label = entry.removesuffix(" loss")
    assert (beyond["entry"], beyond["reason"], beyond["bound"]) == (label, "distance", "analytic")
    assert beyond["distance"]["estimate"] > beyond["envelope"]
    assert result["step_level"]["first_differing_step"] == 6


def test_the_first_differing_step_is_allowed_one_steps_rounding(generated: Path) -> None:
    """The state before it was equal bit for bit: STEP_ROUNDINGS units, no more."""
    within = _write(generated / "onset-within", {3: 0.5 * STEP_ROUNDINGS * U}, seed=1)
    assert _judge(generated / "a", within)["verdict"] == "within-rounding"
    beyond = _write(generated / "onset-beyond", {3: 8 * STEP_ROUNDINGS * U}, seed=1)
    first = _judge(generated / "a", beyond)["first_divergence"]
    assert (first["step"], first["beyond"]["first"][0]["before"]) == (3, 0.0)


@pytest.mark.parametrize("ratio", [0.25, 1.0, 4.0])
def test_a_control_run_measures_growth_faster_than_the_analytic_rate(
    generated: Path, ratio: float
) -> None:
    """An instability amplifies rounding 40-fold a step: beyond the analytic envelope at once,
    within a control run's (the same growth, another draw of rounding a few times apart)."""
    fast = _series(8 * U, 40.0)
    control = _write(generated / f"control-{ratio}", fast, seed=7)
    b = _write(generated / f"fast-{ratio}", {s: d * ratio for s, d in fast.items()}, seed=8)
    analytic = _judge(generated / "a", b)
    assert analytic["verdict"] == "diverged"
    assert analytic["first_divergence"]["beyond"]["first"][0]["bound"] == "analytic"
    measured = _judge(generated / "a", b, control)
    assert measured["verdict"] == "within-rounding", measured["first_divergence"]
    rounding = measured["ranks"][0]["step_level"]["rounding"]
    assert rounding["by_control"] == rounding["explained"] == 4 * STEPS
    assert measured["step_level"]["envelope"]["safety"] == STEP_SAFETY


def test_a_change_beyond_the_control_runs_envelope_is_named(generated: Path) -> None:
    fast = _series(8 * U, 40.0)
    control = _write(generated / "control-jump", fast, seed=7)
    jump = {(4, "param w"): 10 * STEP_SAFETY * fast[4]}
    b = _write(generated / "fast-jump", fast, seed=8, jumps=jump)
    first = _judge(generated / "a", b, control)["first_divergence"]
    beyond = first["beyond"]["first"][0]
    assert (first["step"], beyond["entry"], beyond["bound"]) == (4, "param w", "measured")
    assert beyond["measured"] > 0


def test_an_rng_state_that_differs_is_a_real_change(generated: Path) -> None:
    b = _write(generated / "rng", _series(8 * U, 1.5), seed=1, rng_from=5)
    first = _judge(generated / "a", b)["first_divergence"]
    beyond = first["beyond"]["first"][0]
    assert (first["step"], first["cause"], beyond["entry"], beyond["reason"]) == (
        5,
        "rng",
        "rng cpu",
        "discrete",
    )


def test_optimizer_states_are_not_judged_and_said(generated: Path) -> None:
    """They keep no sketch: vouched for by the parameters they update, counted in a note."""
    b = _write(generated / "state", _series(8 * U, 1.5), seed=1, state_moved=0.5)
    result = _judge(generated / "a", b)
    assert result["verdict"] == "within-rounding"
    assert result["ranks"][0]["step_level"]["rounding"]["not_judged"] == STEPS
    assert any("optimizer-state entries not judged" in note for note in result["notes"])


def test_records_without_sketches_give_the_bitwise_answer(generated: Path) -> None:
    """Recorded before step-level records kept sketches: the distance is unknown, never guessed."""
    a = _write(generated / "a-old", {}, seed=0, sketches=False)
    b = _write(generated / "b-old", _series(8 * U, 1.5), seed=1, sketches=False)
    first = _judge(a, b)["first_divergence"]
    assert (first["step"], first["beyond"]["first"][0]["reason"]) == (0, "unknown")


# -- recorded runs --------------------------------------------------------------------------


def _record(root: Path, name: str, options: list[str], script: list[str]) -> None:
    args = ("record", "-o", name, "--steps-only", *options, "--", str(SCRIPT), *script)
    done = run_cli(*args, cwd=root, env=ENV, timeout=600)
    assert done.returncode == 0, (name, done.stderr)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Run A; run B, rounded otherwise; run B with the learning rate changed from step 8; a
    control of run A (``--perturb-rounding``); and the same three at lr 0.5, a training that
    blows up. All with ``--steps-only``, two at a time."""
    root = tmp_path_factory.mktemp("step_tolerant")
    blowing = ["--lr", "0.5", "--steps", "20"]
    jobs = {
        "a": ([], []),
        "b": ([], ["--rounded"]),
        "b-lr": ([], ["--rounded", "--lr-from", str(AT)]),
        "control": (["--perturb-rounding", "2"], []),
        "a-fast": ([], blowing),
        "b-fast": ([], ["--rounded", *blowing]),
        "control-fast": (["--perturb-rounding", "2"], blowing),
    }
    with ThreadPoolExecutor(2) as pool:
        for future in [pool.submit(_record, root, name, *job) for name, job in jobs.items()]:
            future.result()
    return root


def _diff(root: Path, a: str, b: str, *options: str) -> tuple[int, dict[str, Any]]:
    code, out, err = cli_in_process("diff", str(root / a), str(root / b), "--json", *options)
    assert code in (0, 1), err
    return code, json.loads(out)


def test_a_control_run_records_with_steps_only(recorded: Path) -> None:
    """``--perturb-rounding`` with ``--steps-only``: no op, step-level records with sketches
    of the loss, gradients and parameters, drifting from run A's by rounding from step 0."""
    with Run(recorded / "control") as run:
        trace = run.rank(0)
        assert len(trace) == 0 and trace.step_count() == 12
        entries = trace.step_state(0).entries  # type: ignore[union-attr]
        sketched = {e.kind for e in entries if e.tensor.sketch is not None}
        assert sketched == {"loss", "grad", "param"}
    code, bitwise = _diff(recorded, "a", "control")
    assert code == 1 and bitwise["first_divergence"]["step"] == 0


def test_a_pair_differing_by_rounding_is_within_rounding(recorded: Path) -> None:
    """Bit for bit the runs part at step 0; under --tolerant every step is within the
    envelope, analytic or measured, and the drift says how far apart they grew."""
    code, bitwise = _diff(recorded, "a", "b")
    assert code == 1 and bitwise["first_divergence"]["step"] == 0
    for options in ((), ("--noise", str(recorded / "control"))):
        code, result = _diff(recorded, "a", "b", "--tolerant", *options)
        assert (code, result["verdict"]) == (0, "within-rounding"), result["first_divergence"]
        level = result["ranks"][0]["step_level"]
        assert level["compared"] == 12 and level["first_differing_step"] is None
        assert level["rounding"]["explained"] > 0
        assert level["rounding"]["control"] is bool(options)
        drift = [d["max_rel_distance"] for d in result["drift"]]
        assert len(drift) == 12 and 0 < max(drift) < 1e-5
    code, out, _ = cli_in_process("diff", str(recorded / "a"), str(recorded / "b"), "--tolerant")
    assert code == 0 and out.startswith("WITHIN-ROUNDING")
    assert "12 steps compared, within the rounding envelope" in out


@pytest.mark.parametrize("control", [False, True])
def test_a_learning_rate_changed_at_step_8_is_named_there(recorded: Path, control: bool) -> None:
    options = ("--noise", str(recorded / "control")) if control else ()
    code, result = _diff(recorded, "a", "b-lr", "--tolerant", *options)
    first = result["first_divergence"]
    assert (code, first["kind"], first["step"], first["cause"]) == (1, "state", AT, "optimizer")
    beyond = first["beyond"]
    assert set(beyond["by_kind"]) == {"param"}  # its gradients are still within rounding
    assert beyond["first"][0]["bound"] == ("measured" if control else "analytic")
    assert first["state"]["kind"] == "param"
    assert_specified(DIFF_SCHEMA, result)
    code, out, _ = cli_in_process(
        "diff", str(recorded / "a"), str(recorded / "b-lr"), "--tolerant", *options
    )
    assert code == 1
    assert f"First step beyond the rounding envelope — rank 0, step {AT}" in out
    assert "gradients within rounding, parameters differ beyond rounding" in out


def test_a_training_that_blows_up_needs_a_control_run(recorded: Path) -> None:
    """At lr 0.5 the loss grows to thousands: rounding is amplified faster than GROWTH a
    step, which the analytic envelope names; a control run measures it."""
    code, analytic = _diff(recorded, "a-fast", "b-fast", "--tolerant")
    assert (code, analytic["first_divergence"]["beyond"]["first"][0]["bound"]) == (1, "analytic")
    control = str(recorded / "control-fast")
    code, measured = _diff(recorded, "a-fast", "b-fast", "--tolerant", "--noise", control)
    assert (code, measured["verdict"]) == (0, "within-rounding"), measured["first_divergence"]


def test_hunt_tolerant_names_the_op_and_its_line(recorded: Path) -> None:
    """The first pass names step 8; the second records it op by op in both runs and the
    tolerant diff there names the optimizer's update, read with another learning rate, at
    the script's ``opt.step()``: the drifted state entering step 8 is the step level's."""
    b = shlex.join([str(SCRIPT), "--rounded", "--lr-from", str(AT)])
    hunt = ["hunt", "-o", "hunt", "--a", str(SCRIPT), "--b", b, "--tolerant", "--json"]
    control = ["--noise", str(recorded / "control")]
    done = run_cli(*hunt, *control, cwd=recorded, env=ENV, timeout=600)
    assert done.returncode == 1, done.stderr
    result = json.loads(done.stdout)
    assert (result["verdict"], result["step"], result["reproduced"]) == ("diverged", AT, True)
    assert "first go beyond the rounding envelope at param" in result["found_by"]
    first = result["op_level"]["first_divergence"]
    assert (first["step"], first["kind"], first["a"]["op"]) == (AT, "argument", "aten::add_.Tensor")
    assert first["a"]["phase"] == "optimizer"
    assert first["a"]["call_site"]["line"] == line_of(SCRIPT, "opt.step")
    (alpha,) = first["arguments_differ"]
    assert (alpha["name"], alpha["a"], alpha["b"]) == ("alpha", -0.05, pytest.approx(-0.075))
    assert result["tolerance"]["noise"]["control"] == control[1]
    assert_specified(HUNT_SCHEMA, result, elsewhere={"step_level", "op_level", "tolerance"})
    assert_specified(DIFF_SCHEMA, result["step_level"], result["op_level"])
