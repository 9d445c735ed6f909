"""The sketch the recorder stores beside each fingerprint (field ``w``, ``opguard/store/sketch.py``):
the native one against the numpy reference (tests/sketch_reference.py), where it is stored and
where not, old traces without it, and how well two runs' sketches estimate their relative
distance.

Recording with the sketch still leaves training bit for bit unchanged: tests/test_record.py
(``test_record_in_code_with_optimizer``) and tests/test_unchanged.py record with it.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from sketch_reference import raw_sketch

import opguard
from opguard import _C
from opguard.analysis import diff_runs
from opguard.recorder.tensors import fingerprint_fields
from opguard.store import Run
from opguard.store.errors import DamagedRecord
from opguard.store.records import TensorRecord
from opguard.store.sketch import STORED_BYTES, Sketch, decode
from opguard.store.states import expand_step

FLOAT_DTYPES = [
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.float8_e4m3fn,
    torch.float8_e4m3fnuz,
    torch.float8_e5m2,
    torch.float8_e5m2fnuz,
]
SIZES = [1, 7, 9, 4096 + 3]
CROSS_PAIR = [
    Path(__file__).parent / "data" / "cross_version" / f"torch-{v}" for v in ("2.11", "2.13")
]


def values(n: int, dtype: torch.dtype, seed: int) -> torch.Tensor:
    """n random values representable in ``dtype`` (no NaN: the float8 kinds saturate)."""
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, generator=g) * 3).clamp(-200, 200).to(dtype)


# Each view of a tensor of n elements made from `values`: the elements, in logical order, are
# what the reference sketches.
VIEWS: dict[str, Callable[[torch.Tensor, int], torch.Tensor]] = {
    "contiguous": lambda base, n: base[:n],
    "transposed": lambda base, n: base[: 3 * n].view(n, 3).t(),
    "sliced": lambda base, n: base[1 : 1 + 2 * n : 2],
    "expanded": lambda base, n: base[:n].expand(3, n),
    "sliced rows": lambda base, n: base[: 12 * n].view(n, 12)[:, 1:11],  # runs of 10
}


def assert_matches_reference(field: bytes | None, t: torch.Tensor) -> None:
    """``field`` is the stored sketch of ``t``: norm equal as float32, buckets within one step."""
    assert field is not None and len(field) == STORED_BYTES
    got = decode(field)
    assert got is not None
    norm, buckets = raw_sketch(t.to(torch.float64).numpy())
    assert got.norm == np.float32(norm)
    assert np.max(np.abs(np.array(got.buckets) - buckets)) <= got.step


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_native_sketch_matches_the_reference(dtype: torch.dtype) -> None:
    for n in SIZES:
        base = values(12 * n + 2, dtype, seed=n)
        for name, make in VIEWS.items():
            view = make(base, n)
            fields = fingerprint_fields(view)
            assert isinstance(fields, dict)
            assert_matches_reference(fields.get("w"), view), (n, name)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_non_finite_values_add_nothing_to_the_sketch(dtype: torch.dtype) -> None:
    """A tensor with -inf entries (an attention mask's; NaN in the float8 kinds without an
    infinity) has the reference's sketch of its finite part; one with no finite value has none."""
    has_inf = torch.tensor(-math.inf).to(dtype).float().isinf().item()  # e4m3fn saturates it
    mask = -math.inf if has_inf else math.nan
    for n in SIZES:
        floats = values(12 * n + 2, torch.float32, seed=n)
        floats[2::5] = mask
        base = floats.to(dtype)
        for name, make in VIEWS.items():
            view = make(base, n)
            fields = fingerprint_fields(view)
            assert isinstance(fields, dict)
            assert_matches_reference(fields.get("w"), view), (n, name)
    for fill in (mask, math.nan):
        fields = fingerprint_fields(torch.full((9,), fill).to(dtype))
        assert isinstance(fields, dict) and "w" not in fields


def record(run: Path, program: Callable[[], object]) -> Run:
    with opguard.record(run):
        program()
    return Run(run)


def test_recorded_op_entries_carry_the_reference_sketch(tmp_path: Path) -> None:
    """Ops' inputs and outputs (a strided clone of each view) carry the sketch of their values."""
    views = {
        (str(dtype), name): make(values(12 * 4099 + 2, dtype, seed=1), 4099)
        for dtype in (torch.float32, torch.bfloat16, torch.float16)
        for name, make in VIEWS.items()
    }
    clones: list[torch.Tensor] = []
    trace = record(tmp_path / "run", lambda: clones.extend(v.clone() for v in views.values()))
    ops = [op for op in trace.rank(0).ops() if op.op == "aten::clone.default"]
    assert len(ops) == len(views)
    for op, view, clone in zip(ops, views.values(), clones, strict=True):
        assert_matches_reference(op.inputs[0].sketch_bytes, view)
        assert_matches_reference(op.outputs[0].sketch_bytes, clone)


def test_training_entries_carry_sketches_of_floats_with_a_finite_value(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = torch.nn.Linear(16, 8)

    def train() -> None:
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        for _ in range(2):
            opt.zero_grad()
            model(torch.randn(4, 16)).square().mean().backward()
            opt.step()
        torch.arange(10).sum()  # integers: no sketch
        torch.zeros(3).div(0.0).sum()  # all NaN: no finite value, no sketch
        torch.ones(3, 3).masked_fill(torch.ones(3, 3).triu(1).bool(), -math.inf).softmax(-1)

    trace = record(tmp_path / "run", train).rank(0)
    ops = list(trace.ops())
    addmm = next(op for op in ops if op.op == "aten::addmm.default")
    read = [t for t in (*addmm.inputs, *addmm.outputs) if not t.is_view]  # weight.t(): a view
    assert len(read) == 3 and all(isinstance(t.sketch, Sketch) for t in read)
    arange = next(op for op in ops if op.op.startswith("aten::arange"))
    assert arange.outputs[0].sketch is None and arange.outputs[0].hash is not None
    nan = next(op for op in ops if op.op == "aten::div.Tensor").outputs[0]
    assert nan.stats is not None and nan.stats[4] == 3 and nan.sketch is None
    masked = next(op for op in ops if op.op == "aten::masked_fill.Scalar").outputs[0]
    assert masked.stats is not None and masked.stats[5] == 3
    assert masked.sketch is not None and masked.sketch.norm == np.float32(math.sqrt(6))
    # Step-level records keep the sketches of what the tolerant step-level diff judges (the
    # loss, gradients, parameters), not of optimizer states nor RNG states (bytes).
    states = list(trace.step_states())
    sketched = {e.kind for s in states for e in s.entries if e.tensor.sketch_bytes is not None}
    assert sketched == {"loss", "grad", "param"}
    assert {e.kind for s in states for e in s.entries} == {*sketched, "state", "rng"}
    assert all(e.tensor.hash is not None for s in states for e in s.entries)
    weight = next(e for e in states[-1].entries if e.label == "param weight")
    assert_matches_reference(weight.tensor.sketch_bytes, model.weight.detach())


def test_the_native_scanners_read_records_with_sketches(tmp_path: Path) -> None:
    """The diff's native readers (csrc/opscan.cpp) skip ``w``: no record falls back to Python."""

    def program() -> None:
        weight = torch.nn.Parameter(torch.randn(64, 64))
        opt = torch.optim.SGD([weight], lr=0.1)
        (weight @ weight).relu().sum().backward()
        opt.step()

    trace = record(tmp_path / "run", program).rank(0)
    chunk = next(iter(trace.raw_chunks()))
    assert sum(t.sketch is not None for op in trace.ops() for t in op.outputs) >= 3
    assert list(_C.OpScanner().scan(chunk)[3]) == []  # no fallback
    (_, raw), *_ = trace.raw_steps()
    assert _C.step_contents(expand_step(raw)) is not None


def test_views_share_their_base_sketch_only_in_its_order(tmp_path: Path) -> None:
    def program() -> None:
        y = torch.randn(64, 64) * 2
        torch.neg(y.view(-1))  # the base's values in its order: its sketch
        torch.neg(y.t())  # another order: none (the view is not read)

    ops = list(record(tmp_path / "run", program).rank(0).ops())
    mul = next(op for op in ops if op.op == "aten::mul.Tensor")
    flat, transposed = (op for op in ops if op.op == "aten::neg.default")
    assert mul.outputs[0].sketch_bytes is not None
    assert flat.inputs[0].is_view and flat.inputs[0].sketch_bytes == mul.outputs[0].sketch_bytes
    assert transposed.inputs[0].is_view and transposed.inputs[0].sketch is None
    assert transposed.outputs[0].sketch is not None


def test_an_old_trace_without_sketches_opens_and_diffs() -> None:
    run_a, run_b = (Run(path) for path in CROSS_PAIR)
    tensors = [t for op in run_a.rank(0).ops() for t in (*op.inputs, *op.outputs)]
    assert tensors and all(t.sketch is None and "norm" not in t.to_json() for t in tensors)
    assert all(e.tensor.sketch is None for s in run_a.rank(0).step_states() for e in s.entries)
    assert diff_runs(run_a, run_b).first is not None


def test_a_record_with_a_damaged_sketch_is_refused_as_damaged() -> None:
    with pytest.raises(DamagedRecord, match="field 'w'"):
        TensorRecord.decode({"d": "float32", "s": [1], "w": 5})


def test_sketches_estimate_the_relative_distance_of_two_runs() -> None:
    """For >= 85% of 200 random pairs of >= 4096 elements (differences dense or in a few
    elements, 1e-1 to 1e-5 of the values), sqrt(sum (bA - bB)^2) / normA is within 30% of the
    true relative L2 distance."""
    rng = np.random.default_rng(0)
    within = 0
    for trial in range(200):
        n = int(rng.integers(4096, 70000))
        a = rng.standard_normal(n).astype(np.float32)
        scale = (1e-1, 1e-3, 1e-5)[trial % 3]
        change = np.zeros(n, np.float32)
        if trial // 3 % 2 == 0:
            change = (rng.standard_normal(n) * scale).astype(np.float32)
        else:
            k = int(rng.integers(1, 200))
            where = rng.choice(n, k, replace=False)
            change[where] = rng.standard_normal(k) * scale * math.sqrt(n / k)
        b = a + change
        sketch_a, sketch_b = (decode(fingerprint_fields(torch.from_numpy(x))["w"]) for x in (a, b))
        assert sketch_a is not None and sketch_b is not None
        estimate = math.dist(sketch_a.buckets, sketch_b.buckets) / sketch_a.norm
        true = np.linalg.norm(b.astype(np.float64) - a) / np.linalg.norm(a.astype(np.float64))
        within += abs(estimate / true - 1) <= 0.3
    assert within >= 170
