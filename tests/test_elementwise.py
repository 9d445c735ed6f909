"""The pieces of zooming in, without recording: capture SPECs and sizes, the element-wise
comparison and its characterisation on tensors built to show one pattern each, and the layouts
a replay gives its inputs."""

from __future__ import annotations

import msgpack
import numpy as np
import pytest

from opguard.analysis.elementwise import compare
from opguard.capture_spec import CaptureSpec, SpecError, parse_size
from opguard.store.captures import OUTPUT, CapturedTensor, capture_key, encode, parse_key


def captured(values: np.ndarray, dtype: str | None = None) -> CapturedTensor:
    """A captured output as the trace stores it (encoded, packed, read back)."""
    name = dtype or str(values.dtype)
    stored = msgpack.unpackb(
        msgpack.packb(encode("0", name, list(values.shape), np.ascontiguousarray(values)))
    )
    return CapturedTensor.decode(capture_key(7, OUTPUT, 0), stored)


def bf16(values: np.ndarray) -> np.ndarray:
    """float32 values truncated to bfloat16 bits (uint16)."""
    return (values.astype(np.float32).view(np.uint32) >> 16).astype(np.uint16)


RNG = np.random.default_rng(0)


def test_capture_keys_sort_by_op_then_inputs_then_position() -> None:
    keys = [capture_key(i, d, p) for i in (3, 256) for d in ("x", "y") for p in (0, 1, 300)]
    assert keys == sorted(keys)
    assert parse_key(capture_key(812, "y", 2)) == (812, "y", 2)


def test_spec_items() -> None:
    spec = CaptureSpec.parse("812, 800-805,aten::addmm.default,aten::mm,train.py:42")
    assert (
        spec.matches(812, "aten::relu.default")
        and spec.matches(800, "x")
        and spec.matches(805, "x")
    )
    assert not spec.matches(806, "aten::relu.default")
    assert spec.matches(1, "aten::addmm.default") and not spec.matches(1, "aten::addmm.out")
    assert spec.matches(1, "aten::mm.default") and spec.matches(1, "aten::mm.out")
    assert spec.matches(1, "aten::relu.default", lambda: ("/home/u/train.py", 42))
    assert not spec.matches(1, "aten::relu.default", lambda: ("/home/u/mytrain.py", 42))
    assert not spec.matches(1, "aten::relu.default", lambda: ("/home/u/train.py", 43))
    assert CaptureSpec.of_indices([5, 3, 4, 9, 11, 12]).text == "3-5,9,11-12"
    for bad in ("", "relu", "9-3", "a:b"):
        with pytest.raises(SpecError):
            CaptureSpec.parse(bad)


def test_sizes() -> None:
    assert parse_size("256MiB") == 256 << 20
    assert parse_size("1GiB") == 1 << 30
    assert parse_size("500MB") == 500_000_000
    assert parse_size("1e9") == 10**9
    assert parse_size("4096") == 4096
    with pytest.raises(SpecError):
        parse_size("lots")


def test_identical_tensors() -> None:
    x = RNG.standard_normal((4, 5)).astype(np.float32)
    d = compare(captured(x), captured(x.copy()))
    assert (d.differing, d.verdict) == (0, "identical")


def test_scattered_few_ulp_differences_are_reduction_order() -> None:
    x = RNG.standard_normal((64, 32)).astype(np.float32)
    y = x.copy()
    flat = y.reshape(-1).view(np.uint32)
    picked = RNG.choice(flat.size, 40, replace=False)
    flat[picked] += RNG.integers(1, 4, 40).astype(np.uint32)
    d = compare(captured(x), captured(y))
    assert d.differing == 40 and 1 <= d.ulp_max <= 3
    assert d.verdict.startswith("scattered few-ULP differences")
    first = d.first[0]
    assert first.a_bits != first.b_bits and first.ulp is not None and first.ulp <= 3
    assert sum(d.spread[0].bins) == 40


def test_whole_rows_differ() -> None:
    x = RNG.standard_normal((16, 8)).astype(np.float32)
    y = x.copy()
    y[5] = RNG.standard_normal(8)
    y[11] = RNG.standard_normal(8)
    d = compare(captured(x), captured(y))
    assert d.verdict.startswith("whole rows differ (2 of 16)")
    assert d.spread[0].touched == 2 and d.spread[0].whole == 2


def test_constant_factor() -> None:
    x = RNG.uniform(0.5, 2.0, (10, 10)).astype(np.float32)
    d = compare(captured(x), captured((x * 0.5).astype(np.float32)))
    assert d.verdict.startswith("every element scaled by ~0.5")


def test_different_mask_and_bool_masks() -> None:
    x = RNG.standard_normal((12, 16)).astype(np.float32)
    keep_a, keep_b = RNG.random(x.shape) > 0.25, RNG.random(x.shape) > 0.25
    d = compare(captured(x * keep_a), captured(x * keep_b))
    assert d.verdict.startswith("different mask")
    d = compare(captured(keep_a, "bool"), captured(keep_b, "bool"))
    assert d.verdict.startswith("different mask")


def test_bfloat16_values_and_ulps() -> None:
    x = RNG.standard_normal(100).astype(np.float32)
    a = bf16(x)
    b = a.copy()
    b[3] += 2  # two bfloat16 ULPs
    d = compare(captured(a, "bfloat16"), captured(b, "bfloat16"))
    assert d.differing == 1 and d.ulp_max == 2
    assert d.first[0].a == pytest.approx(float(x[3]), rel=1e-2)
    assert d.first[0].a_bits == f"0x{int(a[3]):04x}"


def test_ulps_cross_zero_and_nan_in_one_run() -> None:
    a = np.array([1e-45, 1.0, 2.0], dtype=np.float32)  # the smallest subnormal
    b = np.array([-1e-45, 1.0, np.nan], dtype=np.float32)
    d = compare(captured(a), captured(b))
    assert d.nonfinite_mismatch == 1
    assert d.first[0].ulp == 3  # +min, +0, -0, -min: three steps apart
    assert d.verdict.startswith("NaN/Inf in one run only")


def test_shape_mismatch_is_said() -> None:
    d = compare(captured(np.zeros((2, 3), np.float32)), captured(np.zeros((3, 2), np.float32)))
    assert "not comparable" in d.verdict


torch = pytest.importorskip("torch")


@pytest.mark.parametrize(
    "make",
    [
        lambda t: t.t(),  # a transposed weight
        lambda t: t[:, ::2],  # gaps
        lambda t: t[:1].expand(6, 4),  # broadcast
        lambda t: t.reshape(4, 6).permute(1, 0)[1:],  # a permuted slice
    ],
    ids=["transposed", "gaps", "broadcast", "permuted-slice"],
)
def test_replay_inputs_keep_their_layout(make) -> None:
    from opguard.recorder.replay import _with_layout

    original = make(torch.arange(24.0).reshape(6, 4))
    laid = _with_layout(original.contiguous(), tuple(original.stride()))
    assert torch.equal(laid, original)
    assert laid.stride() == original.stride()
