"""``opguard diff --tolerant``: distances from sketches, the rounding rule, the walk's verdicts,
the CLI and the JSON, on synthetic traces whose values come from numpy (so each test knows the
true distances)."""

from __future__ import annotations

import hashlib
import json
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import cli_in_process
from sketch_reference import stored_sketch
from traces import TraceBuilder, tensor

from opguard.analysis import diff_runs
from opguard.analysis.contract import to_json
from opguard.analysis.tolerant.distance import sketch_distance
from opguard.analysis.tolerant.rounding import TF32, op_unit
from opguard.analysis.tolerant.rule import (
    A_DIVIDING,
    A_FACTOR,
    R_FACTOR,
    Tolerance,
    parse_tolerance,
)
from opguard.analysis.words.text import sparkline
from opguard.store import Run, sketch
from opguard.store.environment import Environment
from opguard.tools import BY_NAME, ToolError

N = 4096
U32 = 2.0**-24


def fingerprint(values: np.ndarray) -> int:
    return int.from_bytes(hashlib.blake2b(values.tobytes(), digest_size=8).digest(), "little")


def entry(
    slot: str,
    values: np.ndarray,
    producer: int | None = None,
    *,
    sketched: bool = True,
    dtype: str | None = None,
) -> dict[str, Any]:
    """A tensor entry holding ``values`` (their fingerprint, and their sketch unless not);
    ``dtype``: the name stored, where numpy has no such type (bfloat16)."""
    extra = {"w": stored_sketch(values)} if sketched else {}
    dtype = dtype or {np.float32: "float32", np.float64: "float64"}[values.dtype.type]
    return tensor(
        slot,
        fingerprint(values),
        producer,
        dtype=dtype,
        shape=values.shape,
        nbytes=values.nbytes,
        **extra,
    )


def rounded(values: np.ndarray, rng: np.random.Generator, ulps: float = 1.0) -> np.ndarray:
    """``values`` as another float32 implementation might round them: each element moved by
    up to ``ulps`` units in the last place."""
    noise = rng.uniform(-ulps, ulps, values.shape) * np.spacing(values.astype(np.float32))
    return (values.astype(np.float64) + noise).astype(np.float32)


@dataclass
class Step:
    """One op of a synthetic chain: its name, how it computes its output from its input (in
    float64, then rounded to float32), and what run B does differently."""

    name: str
    compute: Callable[[np.ndarray], np.ndarray]
    args: list[list[Any]] = field(default_factory=list)
    args_b: list[list[Any]] | None = None
    amplify_b: float = 1.0  # run B's error at this op, multiplied


def chain_pair(
    tmp: Path,
    steps: Sequence[Step],
    *,
    leaf_b: Callable[[np.ndarray], np.ndarray] | None = None,
    sketched: bool = True,
    unsketched: Sequence[int] = (),
    repeat: int = 1,
    environments: tuple[dict[str, Any], dict[str, Any]] = ({}, {}),
) -> tuple[Path, Path]:
    """Two runs of ``steps`` on one leaf of N floats, ``repeat`` times (a training step each):
    run B rounds every op's output differently (one ULP) and reads the leaf through
    ``leaf_b``; ``environments``: what each run's meta.json records of its environment.
    ``unsketched``: the ops (by position in ``steps``) whose output has no sketch, as written
    and as read (a tensor with no finite value)."""
    rng = np.random.default_rng(7)
    leaf = rng.standard_normal(N).astype(np.float32)
    inputs = {"a": leaf, "b": leaf if leaf_b is None else leaf_b(leaf).astype(np.float32)}
    paths = (tmp / "a", tmp / "b")
    builders = {
        side: TraceBuilder(path, meta={"environment": env} if env else None)
        for side, path, env in zip("ab", paths, environments, strict=True)
    }
    for step in range(repeat):
        producer: int | None = None
        for position, op in enumerate(steps):
            sketch_in = sketched and position - 1 not in unsketched
            sketch_out = sketched and position not in unsketched
            exact = {side: op.compute(inputs[side].astype(np.float64)) for side in "ab"}
            out_a = exact["a"].astype(np.float32)
            clean_b = rounded(exact["b"], rng)
            error = clean_b.astype(np.float64) - exact["b"]
            out_b = (exact["b"] + op.amplify_b * error).astype(np.float32)
            for side, out in (("a", out_a), ("b", out_b)):
                args = op.args if side == "a" or op.args_b is None else op.args_b
                builders[side].op(
                    op.name,
                    [entry("self", inputs[side], producer, sketched=sketch_in)],
                    [entry("0", out, sketched=sketch_out)],
                    step=step,
                    **({"a": args} if args else {}),
                )
            producer = builders["a"].index - 1
            inputs = {"a": out_a, "b": out_b}
    for builder in builders.values():
        builder.close()
    return paths


def mlp_steps(**changes: Any) -> list[Step]:
    """A small network's ops on a vector: scale, gelu, normalise, an SGD-like update."""
    steps = [
        Step("aten::mul.Tensor", lambda x: x * 1.7),
        Step(
            "aten::gelu.default",
            lambda x: x * 0.5 * (1 + np.tanh(0.79788456 * (x + 0.044715 * x**3))),
        ),
        Step("aten::native_layer_norm.default", lambda x: (x - x.mean()) / np.sqrt(x.var() + 1e-5)),
        Step("aten::tanh.default", np.tanh),
        Step("aten::add.Tensor", lambda x: x + 0.9 * x, args=[["alpha", 0.9]]),
    ]
    for index, change in changes.items():
        k = int(index.removeprefix("op"))
        for key, value in change.items():
            setattr(steps[k], key, value)
    return steps


AUTO = Tolerance()


def diff(paths: tuple[Path, Path], tolerance: Tolerance | None = AUTO) -> Any:
    with Run(paths[0]) as a, Run(paths[1]) as b:
        result = diff_runs(a, b, tolerance=tolerance)
        return result, to_json(result)


# -- the distance -------------------------------------------------------------------------


@pytest.mark.parametrize("relative", [1e-7, 1e-4, 0.3])
def test_the_estimate_holds_the_true_distance_in_its_interval(relative: float) -> None:
    """Over 200 random pairs of 4,096 elements, the 90% interval holds the true relative L2
    distance about 90% of the time, and the estimate is within 30% of it for most."""
    rng = np.random.default_rng(1)
    inside = close = 0
    trials = 200
    for _ in range(trials):
        a = rng.standard_normal(N)
        b = a + relative * np.linalg.norm(a) / math.sqrt(N) * rng.standard_normal(N)
        truth = np.linalg.norm(a - b) / np.linalg.norm(a)
        d = sketch_distance(*(sketch.decode(stored_sketch(v)) for v in (a, b)))
        assert d is not None and d.resolved
        inside += d.low <= truth <= d.high
        close += abs(d.estimate - truth) <= 0.3 * truth
    assert 0.8 * trials <= inside <= 0.97 * trials
    assert close >= 0.75 * trials


def test_a_difference_in_one_element_is_measured_exactly() -> None:
    a = np.random.default_rng(2).standard_normal(N)
    b = a.copy()
    b[100] += 0.01
    d = sketch_distance(*(sketch.decode(stored_sketch(v)) for v in (a, b)))
    assert d is not None
    assert d.estimate == pytest.approx(0.01 / np.linalg.norm(a), rel=1e-4)


def test_distances_below_the_quantization_read_as_the_floor() -> None:
    a = np.random.default_rng(3).standard_normal(N)
    b = a * (1 + 1e-12)
    d = sketch_distance(*(sketch.decode(stored_sketch(v)) for v in (a, b)))
    assert d is not None and not d.resolved
    assert d.estimate == d.floor < 1e-7
    assert d.text().startswith("≤")


def test_a_value_non_finite_in_one_run_only_is_infinitely_far() -> None:
    """Sketches sum finite values; a NaN or Inf only one run has is no rounding."""
    from opguard.analysis.tolerant.distance import tensor_distance
    from opguard.store.records import TensorRecord

    values = np.random.default_rng(4).standard_normal(N).astype(np.float32)
    masked = values.copy()
    masked[:8] = -np.inf

    def record(v: np.ndarray, inf: int) -> TensorRecord:
        finite = v[np.isfinite(v)]
        stats = [float(finite.min()), float(finite.max()), float(finite.mean()), 0.0, 0, inf]
        return TensorRecord.decode(
            {
                **entry("0", v, sketched=False),
                "w": stored_sketch(np.where(np.isfinite(v), v, 0)),
                "m": stats,
            }
        )

    nudged = (masked * np.float32(1 + 1e-6)).astype(np.float32)
    near = tensor_distance(record(masked, 8), record(nudged, 8))
    assert near is not None and 3e-7 < near.estimate < 3e-6  # the finite parts compared
    far = tensor_distance(record(values, 0), record(masked, 8))
    assert far is not None and far.estimate == math.inf


# -- the rounding unit --------------------------------------------------------------------


def test_an_op_dividing_by_a_tensor_may_amplify_more() -> None:
    """Adam's update divides by sqrt(v): elements with tiny gradients amplify rounding."""
    from opguard.analysis.tolerant.families import divides

    assert divides("aten::_foreach_addcdiv_.ScalarList") and divides("aten::_fused_adamw_.default")
    assert divides("aten::div.Tensor") and not divides("aten::mul.Tensor")
    rule = Tolerance()
    assert rule.limit(1e-6, 2.0**-24, dividing=True) > 50 * rule.limit(1e-6, 2.0**-24)
    assert Tolerance(rel=1e-3).limit(1e-6, None, dividing=True) == 1e-3


def test_tf32_coarsens_float32_matmuls_on_cuda_when_either_run_allowed_it(tmp_path: Path) -> None:
    with TraceBuilder(tmp_path / "r") as run:
        x = tensor("self", 1, dtype="float32", device="cuda:0")
        run.op("aten::mm.default", [x], [tensor("0", 2, device="cuda:0")])
        run.op("aten::gelu.default", [x], [tensor("0", 3, device="cuda:0")])
    with Run(tmp_path / "r") as r:
        mm, gelu = r.rank(0).op(0), r.rank(0).op(1)
    off, on = (
        Environment({"cuda_matmul_tf32": False}, True),
        Environment({"cuda_matmul_tf32": True}, True),
    )
    assert op_unit(mm, mm, (off, off)) == U32
    assert op_unit(mm, mm, (off, on)) == TF32
    assert op_unit(gelu, gelu, (on, on)) == U32


def test_an_op_in_bfloat16_in_one_run_rounds_like_bfloat16(tmp_path: Path) -> None:
    with TraceBuilder(tmp_path / "r") as run:
        run.op("aten::mm.default", [tensor("self", 1)], [tensor("0", 2)])
        run.op(
            "aten::mm.default",
            [tensor("self", 1, dtype="bfloat16")],
            [tensor("0", 3, dtype="bfloat16")],
        )
    with Run(tmp_path / "r") as r:
        fp32, bf16 = r.rank(0).op(0), r.rank(0).op(1)
    env = Environment({}, False)
    assert op_unit(fp32, bf16, (env, env)) == 2.0**-8


# -- the walk -----------------------------------------------------------------------------


def test_a_chain_that_differs_by_float32_rounding_is_within_rounding(tmp_path: Path) -> None:
    result, out = diff(chain_pair(tmp_path, mlp_steps(), repeat=3))
    assert result.verdict == "within-rounding" and out["first_divergence"] is None
    kept = {key: out["tolerance"][key] for key in ("mode", "rel", "A", "R", "A_dividing")}
    assert kept == {
        "mode": "auto",
        "rel": None,
        "A": A_FACTOR,
        "R": R_FACTOR,
        "A_dividing": A_DIVIDING,
    }
    assert out["tolerance"]["rule"] == "families" and out["tolerance"]["noise"] is None
    assert [d["step"] for d in out["drift"]] == [0, 1, 2]
    assert all(0 < d["max_rel_distance"] < 1e-5 for d in out["drift"])
    assert out["ranks"][0]["rounding"]["explained"] == 15
    # bit for bit, the same runs diverge at the first op
    assert diff(chain_pair(tmp_path / "again", mlp_steps()), None)[0].verdict == "diverged"


def test_an_op_that_multiplies_its_error_by_1e4_is_the_divergence(tmp_path: Path) -> None:
    result, out = diff(chain_pair(tmp_path, mlp_steps(op3={"amplify_b": 1e4})))
    first = out["first_divergence"]
    assert result.verdict == "diverged"
    assert first["a"]["op"] == "aten::tanh.default" and first["kind"] == "origin"
    distance = first["distance"]
    assert distance["reason"] == "amplified"
    assert distance["output"] > distance["budget"]
    assert distance["amplification"] > 100
    assert distance["interval"][0] <= distance["output"] <= distance["interval"][1]


def test_what_only_changes_rounding_is_no_likely_cause_of_more(tmp_path: Path) -> None:
    """An op that multiplies its error by 1e4, in runs with other thread counts: threads change
    how an op rounds, which the tolerant diff has already allowed for, so they are no likely
    cause of a difference beyond rounding; another torch build (another implementation) is."""
    steps = mlp_steps(op3={"amplify_b": 1e4})
    threads = chain_pair(
        tmp_path / "threads", steps, environments=({"threads": 2}, {"threads": 16})
    )
    first = diff(threads)[1]["first_divergence"]
    assert (first["kind"], first["likely_causes"]) == ("origin", [])
    builds = ({"torch": "2.11.0"}, {"torch": "2.13.0"})
    first = diff(chain_pair(tmp_path / "builds", steps, environments=builds))[1]["first_divergence"]
    assert [c["kind"] for c in first["likely_causes"]] == ["environment"]
    assert "torch builds (2.11.0 vs 2.13.0)" in first["likely_causes"][0]["cause"]
    bitwise = diff(threads, None)[1]["first_divergence"]  # bit for bit, threads are a cause
    assert "intra-op threads" in bitwise["likely_causes"][0]["cause"]


def test_a_changed_momentum_is_an_argument_change(tmp_path: Path) -> None:
    steps = mlp_steps(op4={"args_b": [["alpha", 0.8]]})
    out = diff(chain_pair(tmp_path, steps))[1]
    first = out["first_divergence"]
    assert (first["kind"], first["cause"]) == ("argument", "argument")
    assert first["a"]["op"] == "aten::add.Tensor"
    assert "alpha" in first["summary"]


def test_an_argument_that_differs_by_rounding_is_not_a_divergence(tmp_path: Path) -> None:
    steps = mlp_steps(op4={"args_b": [["alpha", float(np.float32(0.9)) * (1 + 3e-8)]]})
    assert diff(chain_pair(tmp_path, steps))[0].verdict == "within-rounding"


def test_a_leaf_beyond_rounding_is_named(tmp_path: Path) -> None:
    out = diff(chain_pair(tmp_path, mlp_steps(), leaf_b=lambda x: x * (1 + 1e-3)))[1]
    first = out["first_divergence"]
    assert (first["kind"], first["cause"]) == ("propagated", "leaf")
    assert first["a"]["index"] == 0 and first["distance"]["slot"] == "self"
    assert first["distance"]["tensor"]["estimate"] == pytest.approx(1e-3, rel=0.5)


def test_a_leaf_within_rounding_is_not(tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    paths = chain_pair(tmp_path, mlp_steps(), leaf_b=lambda x: rounded(x, rng))
    assert diff(paths)[0].verdict == "within-rounding"


def bfloat16(values: np.ndarray) -> np.ndarray:
    """float32 values rounded to bfloat16 (to nearest even), held as float32."""
    bits = values.astype(np.float32).view(np.uint32).astype(np.uint64)
    rounded_bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return rounded_bits.astype(np.uint32).view(np.float32)


def autocast_pair(tmp: Path, cast_b: Callable[[np.ndarray], np.ndarray]) -> tuple[Path, Path]:
    """Run A: a matmul-like op on a float32 leaf; run B: the leaf first cast by an op of run B
    only (``cast_b`` computes it, stored as bfloat16), the op then reading the cast."""
    x = np.random.default_rng(4).standard_normal(N).astype(np.float32)
    with TraceBuilder(tmp / "a") as run:
        run.op("aten::mm.default", [entry("self", x)], [entry("0", x * 3)])
    with TraceBuilder(tmp / "b") as run:
        cast = cast_b(x)
        run.op("aten::_to_copy.default", [entry("self", x)], [entry("0", cast, dtype="bfloat16")])
        y = bfloat16(cast * 3)
        run.op(
            "aten::mm.default",
            [entry("self", cast, 0, dtype="bfloat16")],
            [entry("0", y, dtype="bfloat16")],
        )
    return tmp / "a", tmp / "b"


def test_a_cast_in_one_run_only_is_within_bfloat16_rounding(tmp_path: Path) -> None:
    result, out = diff(autocast_pair(tmp_path, bfloat16))
    assert result.verdict == "within-rounding", out["first_divergence"]
    assert out["unaligned_b"] == 1


def test_a_change_made_by_an_op_of_one_run_only_names_that_op(tmp_path: Path) -> None:
    out = diff(autocast_pair(tmp_path, lambda x: bfloat16(x * 1.5)))[1]
    first = out["first_divergence"]
    assert (first["kind"], first["cause"]) == ("structure", "inserted")
    assert first["b"]["op"] == "aten::_to_copy.default" and first["a"] is None
    assert first["distance"]["reason"] == "structure" and first["distance"]["slot"] == "self"


def test_a_fixed_bound_judges_every_distance_against_it(tmp_path: Path) -> None:
    paths = chain_pair(tmp_path, mlp_steps(op3={"amplify_b": 1e4}))
    assert diff(paths, Tolerance(rel=0.1))[0].verdict == "within-rounding"
    out = diff(paths, Tolerance(rel=1e-6))[1]
    assert out["first_divergence"]["a"]["op"] == "aten::tanh.default"
    assert out["tolerance"]["mode"] == "fixed"


def test_without_sketches_nothing_is_named_and_what_was_not_judged_is_listed(
    tmp_path: Path,
) -> None:
    """Unknown is never a verdict: with no distance anywhere, no op is named DIVERGED; each
    output is judged by what reads it, which is unmeasured too, so the verdict is incomplete
    (never one of equality), and the report lists what was not judged and why."""
    result, out = diff(chain_pair(tmp_path, mlp_steps(), sketched=False))
    assert (result.verdict, result.exit_status) == ("incomplete", 3)
    assert out["first_divergence"] is None
    rounding = out["ranks"][0]["rounding"]
    assert rounding["not_judged"] == rounding["judged_by_nothing"] == len(mlp_steps())
    first = rounding["not_judged_examples"][0]
    assert (first["a"]["index"], first["role"], first["judged_by"]) == (0, "output", None)
    assert "no sketch in run A and B" in first["why"]
    assert "judged by nothing" in out["scope"]


def test_an_unmeasured_output_is_judged_by_what_reads_it(tmp_path: Path) -> None:
    """An output with no distance (no sketch in either run) takes what its op's bound allows
    from its inputs; the op reading it is judged with it taken so: within rounding, the
    unmeasured tensor listed with the op that judged it."""
    result, out = diff(chain_pair(tmp_path, mlp_steps(), unsketched=[1]))
    assert result.verdict == "within-rounding", out["first_divergence"]
    rounding = out["ranks"][0]["rounding"]
    assert (rounding["not_judged"], rounding["judged_by_nothing"]) == (1, 0)
    (note,) = rounding["not_judged_examples"]
    assert (note["a"]["op"], note["role"]) == ("aten::gelu.default", "output")
    assert note["judged_by"]["a"]["op"] == "aten::native_layer_norm.default"
    assert 0 < note["allowed"] < 1e-5


def test_a_real_change_behind_an_unmeasured_output_is_named_where_it_is_read(
    tmp_path: Path,
) -> None:
    """The op that reads an unmeasured output judges it: a difference 1e4 times rounding made
    there is beyond what rounding allows the pair of ops, and named (not passed on as if
    measured), at the first op whose outputs show it."""
    out = diff(chain_pair(tmp_path, mlp_steps(op1={"amplify_b": 1e4}), unsketched=[1]))[1]
    assert out["verdict"] == "diverged"
    assert out["first_divergence"]["a"]["op"] == "aten::native_layer_norm.default"


def test_an_unmeasured_difference_that_reaches_nothing_is_absorbed(tmp_path: Path) -> None:
    """An output with no distance whose difference no reader sees (the reader's outputs are
    equal: garbage a kernel never uses) is absorbed, as bit for bit: not judged by nothing,
    so not an incomplete verdict."""
    x = np.random.default_rng(3).standard_normal(N).astype(np.float32)
    zeros = np.zeros(N, dtype=np.float32)
    for side, scale in (("a", 1.0), ("b", 1.5)):
        with TraceBuilder(tmp_path / side) as run:
            run.op("aten::exp.default", [entry("self", x)], [entry("0", x * scale, sketched=False)])
            run.op(
                "aten::mul.Tensor",
                [entry("self", x * scale, 0, sketched=False)],
                [entry("0", zeros)],
            )
    result, out = diff((tmp_path / "a", tmp_path / "b"))
    assert result.verdict == "within-rounding", out["scope"]
    rounding = out["ranks"][0]["rounding"]
    assert (rounding["not_judged"], rounding["judged_by_nothing"]) == (1, 0)
    assert rounding["not_judged_examples"][0]["reached_nothing"] is True
    assert out["ranks"][0]["absorbed_count"] == 1


def test_identical_runs_are_identical_under_tolerant(tmp_path: Path) -> None:
    paths = chain_pair(tmp_path, [Step("aten::mul.Tensor", lambda x: x)])
    b = paths[1]
    result, out = diff((paths[0], paths[0]))
    assert result.verdict == "identical" and b.exists()
    assert out["drift"] == [{"step": 0, "max_rel_distance": 0.0}]


def test_sparkline_marks_the_divergence_step() -> None:
    line = sparkline([(0, 1e-7), (1, 1e-6), (2, 0.0), (3, 1e-2), (4, None)], marked=3)
    assert line == "▁▂·[█]?"


# -- the CLI ------------------------------------------------------------------------------


def test_cli_within_rounding_exits_0_and_says_so(tmp_path: Path) -> None:
    a, b = chain_pair(tmp_path, mlp_steps(), repeat=2)
    code, out, err = cli_in_process("diff", str(a), str(b), "--tolerant")
    assert code == 0, err
    assert out.startswith("WITHIN-ROUNDING")
    assert "drift" in out


def test_cli_diverged_reports_the_distances(tmp_path: Path) -> None:
    a, b = chain_pair(tmp_path, mlp_steps(op3={"amplify_b": 1e4}))
    code, out, err = cli_in_process("diff", str(a), str(b), "--tolerant")
    assert code == 1, err
    assert "amplification" in out and "aten::tanh.default" in out
    code, out, _ = cli_in_process("diff", str(a), str(b), "--tolerant=1e-6", "--json")
    answer = json.loads(out)
    assert code == 1 and answer["verdict"] == "diverged" and answer["tolerance"]["rel"] == 1e-6
    code, out, _ = cli_in_process("diff", str(a), str(b), "--tolerant", "--json", "--brief")
    assert code == 1 and json.loads(out)["first_divergence"]["distance"]["reason"] == "amplified"


@pytest.mark.parametrize("value", ["0", "-1", "nan", "inf", "x", ""])
def test_bad_tolerant_values_are_refused(tmp_path: Path, value: str) -> None:
    a, b = chain_pair(tmp_path, [Step("aten::mul.Tensor", lambda x: x)])
    code, _, err = cli_in_process("diff", str(a), str(b), f"--tolerant={value}")
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and "--tolerant" in err
    with pytest.raises(ValueError):
        parse_tolerance(value)


@pytest.mark.parametrize("command", ["diff", "explain"])
def test_tolerant_before_the_runs_takes_no_value_from_them(tmp_path: Path, command: str) -> None:
    """``--tolerant`` takes an optional value (``--tolerant[=REL]``): written before the runs,
    a run directory after it is a run, not a value (it read RUN_A as REL, then missed RUN_B)."""
    a, b = chain_pair(tmp_path, mlp_steps())
    for argv in ([command, "--tolerant", str(a), str(b)], [command, str(a), "--tolerant", str(b)]):
        code, out, err = cli_in_process(*argv)
        assert code == 0 and not err, (argv, err)
        assert "WITHIN-ROUNDING" in out or "within rounding" in out, out


def test_every_command_with_tolerant_reads_a_run_after_it_as_a_run() -> None:
    from opguard.cli import build_parser, parse_command_line

    parser = build_parser()
    for command in ("diff", "tui", "explain"):
        args, _ = parse_command_line(parser, [command, "--tolerant", "runs/a", "runs/b"])
        assert (args.tolerant, args.run_a, args.run_b) == ("auto", "runs/a", "runs/b"), command
        args, _ = parse_command_line(parser, [command, "runs/a", "runs/b", "--tolerant", "1e-3"])
        assert args.tolerant == "1e-3", command


def test_a_number_before_the_runs_is_read_as_the_tolerance_and_the_error_says_so(
    tmp_path: Path,
) -> None:
    a, _ = chain_pair(tmp_path, mlp_steps())
    code, _, err = cli_in_process("diff", "--tolerant", "1e-3", str(a))
    assert code == 2 and len(err.splitlines()) == 1, err
    assert "RUN_B" in err and "--tolerant took '1e-3' as its value" in err, err


# -- the tools and the agent's evidence ---------------------------------------------------


def test_the_diff_tool_takes_tolerant(tmp_path: Path) -> None:
    a, b = chain_pair(tmp_path, mlp_steps(), repeat=2)
    diff_tool = BY_NAME["diff"]
    answer = diff_tool.call({"run_a": str(a), "run_b": str(b), "tolerant": "auto"})
    assert answer["verdict"] == "within-rounding" and answer["tolerance"]["mode"] == "auto"
    assert diff_tool.call({"run_a": str(a), "run_b": str(b)})["verdict"] == "diverged"
    with pytest.raises(ToolError, match="--tolerant"):
        diff_tool.call({"run_a": str(a), "run_b": str(b), "tolerant": "0"})


def test_the_evidence_carries_the_distances_and_the_reading(tmp_path: Path) -> None:
    a, b = chain_pair(tmp_path, mlp_steps(op3={"amplify_b": 1e4}))
    answer = BY_NAME["explain"].call({"run_a": str(a), "run_b": str(b), "tolerant": "auto"})
    text = answer["evidence_text"]
    assert "not rounding (amplified)" in text and "amplification" in text
    reading = text.split("## reading (rules)")[1]
    assert reading.startswith("\n- not rounding") and "equal inputs" not in reading


def test_recorded_runs_without_sketches_are_judged_by_nothing_and_say_why() -> None:
    """The cross-version fixture was recorded before sketches: under --tolerant no op is named
    (bit for bit its first difference is), and the verdict is incomplete, saying why."""
    fixture = Path(__file__).parent / "data" / "cross_version"
    paths = (fixture / "torch-2.11", fixture / "torch-2.13")
    bitwise, tolerant = diff(paths, None)[1], diff(paths)[1]
    assert bitwise["verdict"] == "diverged"
    assert (tolerant["verdict"], tolerant["first_divergence"]) == ("incomplete", None)
    rounding = tolerant["ranks"][0]["rounding"]
    assert 0 < rounding["judged_by_nothing"] <= rounding["not_judged"]
    first = rounding["not_judged_examples"][0]
    assert first["a"]["index"] == bitwise["first_divergence"]["a"]["index"]
    assert "no sketch" in first["why"]


# -- the terminal debugger ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("changes", "said"),
    [({}, "within rounding"), ({"op3": {"amplify_b": 1e4}}, "step 0: more than rounding")],
)
async def test_the_tui_draws_the_drift_under_tolerant(
    tmp_path: Path, changes: dict[str, Any], said: str
) -> None:
    """``opguard tui --tolerant``: the drift line (per step, log scale) says whether rounding
    explains the runs' difference, and where it first does not; without --tolerant it is not
    drawn."""
    from opguard.tui.app import OpguardApp
    from opguard.tui.session import Session
    from opguard.tui.widgets.pictures import Bars

    paths = chain_pair(tmp_path, mlp_steps(**changes), repeat=3)
    for tolerance in (AUTO, None):
        app = OpguardApp(Session.open(*paths, tolerance))
        async with app.run_test(size=(160, 48)) as pilot:
            drift = app.query_one("#drift", Bars)
            for _ in range(200):  # the comparison runs in a child process
                await pilot.pause(0.1)
                if drift.display or (tolerance is None and app.main.rows.summaries):
                    break
            if tolerance is None:
                assert not drift.display
                continue
            assert drift.display and said in drift.note
            assert len(drift.values) == 3 and all(v is not None for v in drift.values)


def test_tui_refuses_a_bad_tolerant_value_in_one_line(tmp_path: Path) -> None:
    paths = chain_pair(tmp_path, mlp_steps())
    code, _, err = cli_in_process("tui", str(paths[0]), str(paths[1]), "--tolerant=-1")
    assert code == 2 and err.count("\n") == 1 and "--tolerant" in err
