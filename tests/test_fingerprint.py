"""The native tensor fingerprint (``opguard._C`` through ``fingerprint_fields``) against a slow,
obviously-correct reference written here from the definition in ``csrc/fingerprint.h``.

The fingerprint of a tensor is defined over its logical byte stream (the raw bytes of its elements
in row-major logical order, i.e. the bytes of ``t.contiguous()``), cut into little-endian 64-bit
words, the last one zero-padded:

    hash = sum_j fmix64(word_j ^ (j * 0x9E3779B97F4A7C15 + 0x632BE59BD9B4E019))  mod 2**64

plus min/max/mean/absmax over the finite values (complex: over both components) and the NaN/Inf
counts, and the raw bytes of the first ``HEAD_ELEMENTS`` elements.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

from opguard import _C
from opguard.dtypes import lookup
from opguard.recorder.tensors import HEAD_ELEMENTS, content_hash, fingerprint_fields
from opguard.store.sketch import decode as decode_sketch

pytestmark = pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")

# --------------------------------------------------------------------------------------------
# The reference
# --------------------------------------------------------------------------------------------

MASK64 = (1 << 64) - 1
INDEX_KEY = 0x9E3779B97F4A7C15
INDEX_SALT = 0x632BE59BD9B4E019
FMIX_C1 = 0xFF51AFD7ED558CCD
FMIX_C2 = 0xC4CEB9FE1A85EC53


def fmix64(x: int) -> int:
    """Murmur3's 64-bit finaliser on Python ints."""
    x ^= x >> 33
    x = (x * FMIX_C1) & MASK64
    x ^= x >> 33
    x = (x * FMIX_C2) & MASK64
    x ^= x >> 33
    return x


def ref_hash(data: bytes) -> int:
    """The definition, word by word, in plain Python (slow: used on small inputs and to check
    the vectorised version below)."""
    total = 0
    for j, start in enumerate(range(0, len(data), 8)):
        word = int.from_bytes(data[start : start + 8].ljust(8, b"\0"), "little")
        key = (j * INDEX_KEY + INDEX_SALT) & MASK64
        total = (total + fmix64(word ^ key)) & MASK64
    return total


def ref_hash_np(data: bytes) -> int:
    """Same as :func:`ref_hash`, vectorised with NumPy's wrapping uint64 arithmetic."""
    if not data:
        return 0
    padded = data + b"\0" * (-len(data) % 8)
    x = np.frombuffer(padded, dtype="<u8").astype(np.uint64)
    j = np.arange(x.size, dtype=np.uint64)
    with np.errstate(over="ignore"):
        x = x ^ (j * np.uint64(INDEX_KEY) + np.uint64(INDEX_SALT))
        x ^= x >> np.uint64(33)
        x *= np.uint64(FMIX_C1)
        x ^= x >> np.uint64(33)
        x *= np.uint64(FMIX_C2)
        x ^= x >> np.uint64(33)
        return int(x.sum(dtype=np.uint64))


def logical_bytes(t: torch.Tensor) -> bytes:
    """The raw bytes of ``t``'s elements in row-major logical order (of its contiguous copy)."""
    c = t.contiguous()
    if c.numel() == 0:
        return b""
    # Contiguous up to size-1 dimensions: element i lies at storage offset + i.
    flat = c.as_strided((c.numel(),), (1,), c.storage_offset())
    return flat.view(torch.uint8).numpy().tobytes()


# --------------------------------------------------------------------------------------------
# Dtypes
# --------------------------------------------------------------------------------------------

INT_DTYPES = ["bool", "uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32", "int64"]
REAL_FLOAT_DTYPES = [
    "float16",
    "bfloat16",
    "float32",
    "float64",
    "float8_e4m3fn",
    "float8_e4m3fnuz",
    "float8_e5m2",
    "float8_e5m2fnuz",
    "float8_e8m0fnu",
]
COMPLEX_DTYPES = ["complex32", "complex64", "complex128"]
FLOAT_DTYPES = REAL_FLOAT_DTYPES + COMPLEX_DTYPES
ALL_DTYPES = INT_DTYPES + FLOAT_DTYPES
# Dtypes OpGuard hashes without stats (bit containers, sub-byte and packed types).
OPAQUE_DTYPES = [
    "bits8",
    "bits16",
    "bits1x8",
    "bits2x4",
    "bits4x2",
    "float4_e2m1fn_x2",
    "uint1",
    "uint2",
    "uint3",
    "uint4",
    "uint5",
    "uint6",
    "uint7",
    "int1",
    "int2",
    "int3",
    "int4",
    "int5",
    "int6",
    "int7",
]
# An integer dtype of each item size, to copy opaque dtypes whose copy kernel torch lacks.
_CARRIER = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def get_dtype(name: str) -> torch.dtype:
    """``torch.<name>``, skipping (with the reason) only where this torch really lacks it."""
    dtype = getattr(torch, name, None)
    if not isinstance(dtype, torch.dtype):
        pytest.skip(f"torch {torch.__version__} has no torch.{name}")
    try:
        torch.zeros(2, 3 * dtype.itemsize, dtype=torch.uint8).view(dtype).t().contiguous()
    except (RuntimeError, NotImplementedError, TypeError) as exc:
        if name not in OPAQUE_DTYPES:
            pytest.skip(f"torch {torch.__version__} cannot create/copy {name} tensors: {exc}")
    return dtype


def is_complex(dtype: torch.dtype) -> bool:
    return dtype in (torch.complex32, torch.complex64, torch.complex128)


def is_float(dtype: torch.dtype) -> bool:
    return dtype.is_floating_point or is_complex(dtype)


def random_tensor(shape: tuple[int, ...], dtype: torch.dtype, seed: int, mode: str) -> torch.Tensor:
    """A contiguous tensor. ``bits``: uniformly random bit patterns (every NaN payload, infinity,
    subnormal); ``values``: finite values of random magnitude with NaN/±Inf/±0/subnormals
    injected (float dtypes; integer dtypes always get random bits)."""
    rng = np.random.default_rng(seed)
    numel = math.prod(shape)
    if numel == 0:
        return torch.empty(shape, dtype=dtype)
    if dtype is torch.bool:
        return (
            torch.from_numpy(rng.integers(0, 2, numel, dtype=np.uint8))
            .view(torch.bool)
            .reshape(shape)
        )
    if mode == "bits" or not is_float(dtype):
        raw = rng.integers(0, 256, numel * dtype.itemsize, dtype=np.uint8)
        return torch.from_numpy(raw).view(dtype).reshape(shape)
    comps = 2 if is_complex(dtype) else 1
    values = rng.standard_normal(numel * comps) * 10.0 ** rng.uniform(-6, 6)
    specials = np.array([np.nan, np.inf, -np.inf, 0.0, -0.0, 1e-42, -5e-320, 1.0])
    inject = rng.random(values.size) < rng.choice([0.0, 0.05, 0.5])
    values[inject] = rng.choice(specials, int(inject.sum()))
    t = torch.from_numpy(values)
    if comps == 2:
        t = torch.view_as_complex(t.reshape(-1, 2))
        return t.to(dtype).reshape(shape)
    return t.to(dtype).reshape(shape)


# --------------------------------------------------------------------------------------------
# Stats reference
# --------------------------------------------------------------------------------------------


def decoded_components(t: torch.Tensor) -> np.ndarray:
    """All value components of ``t`` (complex: real and imaginary) as float64, via torch/NumPy
    conversions (independent of OpGuard's decoders)."""
    c = t.contiguous().reshape(-1)
    if is_complex(t.dtype):
        c = torch.view_as_real(c).reshape(-1)
    if c.dtype is torch.bool or not c.dtype.is_floating_point:
        return c.numpy().astype(np.float64)
    return c.to(torch.float64).numpy()


def exact_mean(finite: np.ndarray) -> float:
    """Correctly rounded mean of finite doubles (scaled so that the sum cannot overflow)."""
    try:
        return math.fsum(finite.tolist()) / finite.size
    except OverflowError:
        return math.fsum((finite * 2.0**-64).tolist()) / finite.size * 2.0**64


def ref_stats(t: torch.Tensor) -> tuple[list, float]:
    """``[min, max, mean, absmax, nan, inf]`` and the mean of |value| (for the tolerance)."""
    v = decoded_components(t)
    nan = int(np.isnan(v).sum())
    inf = int(np.isinf(v).sum())
    finite = v[np.isfinite(v)]
    if finite.size == 0:
        return [None, None, None, None, nan, inf], 0.0
    absval = np.abs(finite)
    stats = [
        float(finite.min()),
        float(finite.max()),
        exact_mean(finite),
        float(absval.max()),
        nan,
        inf,
    ]
    return stats, exact_mean(absval)


def naive_sum_may_overflow(t: torch.Tensor) -> bool:
    """Whether a double-precision running sum of the finite values can overflow (a known
    limitation of the native mean: see ``test_mean_of_huge_float64_values_is_finite``)."""
    v = decoded_components(t)
    with np.errstate(over="ignore"):
        return not np.isfinite(np.abs(v[np.isfinite(v)]).sum())


def assert_mean_close(got: float, want: float, mean_abs: float) -> None:
    # The sum of n doubles has error <= n*eps*sum|x|; n <= 2**15 here, so 1e-9 relative to
    # mean|x| is a wide but still meaningful bound (tight for float64-accumulated data).
    tol = 1e-9 * mean_abs
    assert abs(got - want) <= tol or got == want, (got, want, tol)


def assert_stats(got: list, want: list, mean_abs: float, *, check_mean: bool = True) -> None:
    assert len(got) == 6
    assert got[4] == want[4], f"nan count {got[4]} != {want[4]}"
    assert got[5] == want[5], f"inf count {got[5]} != {want[5]}"
    if want[0] is None:
        assert got[:4] == [None, None, None, None]
        return
    assert got[0] == want[0], f"min {got[0]!r} != {want[0]!r}"
    assert got[1] == want[1], f"max {got[1]!r} != {want[1]!r}"
    assert got[3] == want[3], f"absmax {got[3]!r} != {want[3]!r}"
    if check_mean:
        assert_mean_close(got[2], want[2], mean_abs)


def check_against_reference(t: torch.Tensor) -> dict:
    """Every field of ``fingerprint_fields(t)`` against the reference; returns the fields."""
    fp = fingerprint_fields(t)
    data = logical_bytes(t)
    head = min(HEAD_ELEMENTS, t.numel()) * t.element_size()
    assert fp["z"] == len(data) == t.numel() * t.element_size()
    assert fp["h"] == ref_hash_np(data), "hash differs from the reference"
    assert fp["b"] == data[:head], "head bytes differ"
    if t.dtype in (getattr(torch, n) for n in ALL_DTYPES):
        assert "m" in fp
        want, mean_abs = ref_stats(t)
        assert_stats(fp["m"], want, mean_abs, check_mean=not naive_sum_may_overflow(t))
    else:
        assert "m" not in fp
    return fp


def assert_same_fingerprint(a: dict, b: dict) -> None:
    """Equal fingerprints; the mean may differ in its last bits between layouts (the summation
    order follows the memory runs), everything else must be identical."""
    assert a["h"] == b["h"] and a["z"] == b["z"] and a["b"] == b["b"]
    assert ("m" in a) == ("m" in b)
    if "m" in a:
        ma, mb = a["m"], b["m"]
        assert ma[0] == mb[0] and ma[1] == mb[1] and ma[3] == mb[3] and ma[4:] == mb[4:]
        if ma[2] is None or mb[2] is None or not (math.isfinite(ma[2]) and math.isfinite(mb[2])):
            return
        assert abs(ma[2] - mb[2]) <= 1e-12 * max(abs(ma[3]), 1e-300), (ma[2], mb[2])


# --------------------------------------------------------------------------------------------
# The reference itself
# --------------------------------------------------------------------------------------------


def test_reference_known_values() -> None:
    assert ref_hash(b"") == 0
    assert ref_hash(b"\0" * 8) == fmix64(INDEX_SALT)
    # The last word is zero-padded: a trailing zero byte does not change the words.
    assert ref_hash(b"\x01\x02\x03") == ref_hash(b"\x01\x02\x03\0\0")
    assert ref_hash(b"\x01") == fmix64(1 ^ INDEX_SALT)
    two = fmix64(0x0807060504030201 ^ INDEX_SALT) + fmix64(
        0x09 ^ ((INDEX_KEY + INDEX_SALT) & MASK64)
    )
    assert ref_hash(bytes(range(1, 10))) == two & MASK64
    # fmix64 is Murmur3's finaliser: fmix64(0) == 0, and a known value.
    assert fmix64(0) == 0
    assert fmix64(1) == 0xB456BCFC34C2CB2C


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300))
def test_vectorised_reference_matches_plain_reference(data: bytes) -> None:
    assert ref_hash_np(data) == ref_hash(data)


@settings(max_examples=200, deadline=None)
@given(st.binary(max_size=300))
def test_hash_buffer_matches_reference(data: bytes) -> None:
    assert _C.hash_buffer(data) == ref_hash(data)
    t = (
        torch.frombuffer(bytearray(data), dtype=torch.uint8)
        if data
        else torch.empty(0, dtype=torch.uint8)
    )
    assert fingerprint_fields(t)["h"] == ref_hash(data)


# --------------------------------------------------------------------------------------------
# Property tests: random dtypes, shapes, views
# --------------------------------------------------------------------------------------------

_MAX_VIEW_NUMEL = 16384


VIEW_OPS = [
    "slice",
    "transpose",
    "expand",
    "narrow",
    "permute",
    "unfold",
    "select",
    "diagonal",
    "offset",
]


def _span(draw, n: int) -> tuple[int, int]:
    """A sub-range [start, stop) of range(n), empty only now and then."""
    if n == 0 or draw(st.integers(0, 9)) == 3:
        start = draw(st.integers(0, n))
        return start, start
    start = draw(st.integers(0, n - 1))
    return start, draw(st.integers(start + 1, n))


def _views(draw, t: torch.Tensor, steps: list[str]) -> torch.Tensor:
    """Applies up to three random view operations to ``t``."""
    ops = draw(
        st.lists(
            st.sampled_from(VIEW_OPS),
            min_size=1,
            max_size=3,
        )
    )
    for op in ops:
        nd = t.dim()
        if op == "transpose" and nd >= 2:
            i, j = draw(st.lists(st.integers(0, nd - 1), min_size=2, max_size=2, unique=True))
            t = t.transpose(i, j)
        elif op == "permute" and nd >= 2:
            perm = draw(st.permutations(list(range(nd))))
            t = t.permute(*perm)
        elif op == "slice" and nd >= 1:
            d = draw(st.integers(0, nd - 1))
            start, stop = _span(draw, t.shape[d])
            step = draw(st.integers(1, 4))
            t = t[(slice(None),) * d + (slice(start, stop, step),)]
        elif op == "narrow" and nd >= 1:
            d = draw(st.integers(0, nd - 1))
            start, stop = _span(draw, t.shape[d])
            t = t.narrow(d, start, stop - start)
        elif op == "expand" and nd <= 4:
            pos = draw(st.integers(0, nd))
            k = draw(st.integers(0, 5))
            u = t.unsqueeze(pos)
            shape = list(u.shape)
            shape[pos] = k
            if math.prod(shape) <= _MAX_VIEW_NUMEL:
                t = u.expand(*shape)  # stride 0 along pos
            else:
                continue
        elif op == "select" and nd >= 1:
            d = draw(st.integers(0, nd - 1))
            if t.shape[d] == 0:
                continue
            t = t.select(d, draw(st.integers(0, t.shape[d] - 1)))
        elif op == "unfold" and nd >= 1:
            d = draw(st.integers(0, nd - 1))
            n = t.shape[d]
            size = draw(st.integers(1, min(n, 5))) if n and draw(st.integers(0, 7)) != 3 else 0
            step = draw(st.integers(1, 3))
            u = t.unfold(d, size, step)  # overlapping windows
            if u.numel() > _MAX_VIEW_NUMEL:
                continue
            t = u
        elif op == "diagonal" and nd >= 2:
            i, j = draw(st.lists(st.integers(0, nd - 1), min_size=2, max_size=2, unique=True))
            t = t.diagonal(draw(st.integers(-2, 2)), i, j)
        elif op == "offset" and t.numel() > 0:
            # A view starting inside the storage (storage_offset > 0) with the base's strides.
            flat = t.reshape(-1) if t.is_contiguous() else None
            if flat is None or flat.numel() < 2:
                continue
            t = flat[1:]
        else:
            continue
        steps.append(
            f"{op} -> shape {tuple(t.shape)} stride {t.stride()} offset {t.storage_offset()}"
        )
    return t


@st.composite
def tensors_and_views(draw, dtype: torch.dtype):
    ndim = draw(st.sampled_from([0, 1, 1, 2, 2, 2, 3, 3, 4]))
    limit = {0: 1, 1: 4096, 2: 64, 3: 16, 4: 8}[ndim]
    shape = list(draw(st.lists(st.integers(1, limit), min_size=ndim, max_size=ndim)))
    if ndim and draw(st.integers(0, 7)) == 3:
        shape[draw(st.integers(0, ndim - 1))] = 0  # zero-size
    shape = tuple(shape)
    seed = draw(st.integers(0, 2**32 - 1))
    mode = draw(st.sampled_from(["bits", "values"]))
    base = random_tensor(shape, dtype, seed, mode)
    steps: list[str] = [f"base {mode} shape {shape} seed {seed}"]
    view = _views(draw, base, steps)
    return base, view, steps


@pytest.mark.parametrize("name", ALL_DTYPES)
def test_views_match_reference_and_contiguous_copy(name: str) -> None:
    dtype = get_dtype(name)

    @settings(
        max_examples=100,
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(tensors_and_views(dtype))
    def check(case) -> None:
        base, view, steps = case
        for s in steps:
            note(s)
        fp_base = check_against_reference(base)
        fp_view = check_against_reference(view)
        contiguous = view.contiguous()
        assert contiguous.is_contiguous()
        assert_same_fingerprint(fp_view, fingerprint_fields(contiguous))
        if view.is_contiguous() and view.shape == base.shape and view.data_ptr() == base.data_ptr():
            # The same memory: identical, stats included (repr: a NaN mean equals itself).
            assert repr(fp_view) == repr(fp_base)

    check()


@pytest.mark.parametrize("name", OPAQUE_DTYPES)
def test_opaque_dtypes_hash_raw_bytes(name: str) -> None:
    """Dtypes without stats are hashed over their raw bytes and have no ``m``."""
    dtype = get_dtype(name)
    carrier = _CARRIER[dtype.itemsize]
    rng = np.random.default_rng(7)
    raw = torch.from_numpy(rng.integers(0, 256, 5 * 7 * dtype.itemsize, dtype=np.uint8))
    base = raw.view(dtype).reshape(5, 7)
    for view in (base, base.t(), base[1:, ::3], base[2].unsqueeze(0).expand(3, 7), base[0, 0]):
        fp = fingerprint_fields(view)
        data = logical_bytes(view.view(carrier))
        assert fp["h"] == ref_hash(data) and fp["z"] == len(data)
        assert fp["b"] == data[: min(HEAD_ELEMENTS, view.numel()) * dtype.itemsize]
        assert "m" not in fp


# --------------------------------------------------------------------------------------------
# Stats
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", FLOAT_DTYPES)
@settings(max_examples=40, deadline=None, database=None)
@given(
    numel=st.integers(1, 3000),
    seed=st.integers(0, 2**32 - 1),
    scale=st.sampled_from([1e-30, 1e-3, 1.0, 1e4, 1e30, 1e300]),
    nan_at=st.lists(st.integers(0, 2999), max_size=5),
    inf_at=st.lists(st.tuples(st.integers(0, 2999), st.booleans()), max_size=5),
    transposed=st.booleans(),
)
def test_stats_with_injected_nan_inf(name, numel, seed, scale, nan_at, inf_at, transposed) -> None:
    dtype = get_dtype(name)
    comps = 2 if is_complex(dtype) else 1
    values = np.random.default_rng(seed).standard_normal(numel * comps) * scale
    for i in nan_at:
        values[i % values.size] = np.nan
    for i, neg in inf_at:
        values[i % values.size] = -np.inf if neg else np.inf  # NaN or saturated without Inf
    t = torch.from_numpy(values)
    if comps == 2:
        t = torch.view_as_complex(t.reshape(-1, 2))
    t = t.to(dtype)
    if transposed and numel % 3 == 0:
        t = t.reshape(3, numel // 3).t()
    fp = fingerprint_fields(t)
    want, mean_abs = ref_stats(t)
    assert_stats(fp["m"], want, mean_abs, check_mean=not naive_sum_may_overflow(t))


@pytest.mark.parametrize("name", INT_DTYPES)
def test_integer_stats_extremes(name: str) -> None:
    dtype = get_dtype(name)
    if dtype is torch.bool:
        t = torch.tensor([True, False, True, True])
        assert fingerprint_fields(t)["m"] == [0.0, 1.0, 0.75, 1.0, 0, 0]
        return
    info = torch.iinfo(dtype)
    t = torch.tensor([info.min, info.max, 0, 1, info.max - 1], dtype=dtype)
    want, mean_abs = ref_stats(t)
    assert_stats(fingerprint_fields(t)["m"], want, mean_abs)
    assert fingerprint_fields(t)["m"][0] == float(info.min)
    assert fingerprint_fields(t)["m"][1] == float(info.max)


@pytest.mark.parametrize(
    "name",
    [
        "float8_e4m3fn",
        "float8_e4m3fnuz",
        "float8_e5m2",
        "float8_e5m2fnuz",
        "float8_e8m0fnu",
        "float16",
        "bfloat16",
    ],
)
def test_every_bit_pattern_decodes_like_torch(name: str) -> None:
    """Each single-element tensor of every bit pattern: the native decoder (seen through the
    stats and the sketch's norm) agrees with torch's conversion to float64."""
    dtype = get_dtype(name)
    n = 1 << (8 * dtype.itemsize)
    carrier = torch.uint8 if dtype.itemsize == 1 else torch.int16
    patterns = torch.arange(n, dtype=torch.int64).to(carrier)
    values = patterns.view(dtype).to(torch.float64).tolist()
    data_ptr = patterns.data_ptr()
    kind = int(lookup(name, dtype.itemsize).kind)
    for i, v in enumerate(values):
        _, _, _, m, w = _C.fingerprint(
            data_ptr + i * dtype.itemsize, dtype.itemsize, [], [], kind, 1
        )
        if math.isnan(v):
            assert m == (None, None, None, None, 1, 0), (hex(i), v, m)
            assert w is None
        elif math.isinf(v):
            assert m == (None, None, None, None, 0, 1), (hex(i), v, m)
            assert w is None
        else:
            assert m == (v, v, v, abs(v), 0, 0), (hex(i), v, m)
            sketch = decode_sketch(w) if w is not None else None
            assert sketch is not None and sketch.norm == abs(v), (hex(i), v, sketch)
            assert math.copysign(1.0, m[0]) == math.copysign(1.0, v), (hex(i), "sign of zero")


def test_complex_stats_cover_both_components() -> None:
    # Components 1, 5, -3, nan, inf, -2.
    t = torch.view_as_complex(
        torch.tensor([[1.0, 5.0], [-3.0, float("nan")], [float("inf"), -2.0]], dtype=torch.float32)
    )
    for d in (torch.complex32, torch.complex64, torch.complex128):
        m = fingerprint_fields(t.to(d))["m"]
        assert m == [-3.0, 5.0, 0.25, 5.0, 1, 1]


# --------------------------------------------------------------------------------------------
# Sensitivity: a changed or moved element changes the hash
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ALL_DTYPES)
def test_single_changed_element_changes_hash(name: str) -> None:
    dtype = get_dtype(name)
    base = random_tensor((37,), dtype, 1, "bits")
    if dtype is torch.bool:
        base = torch.zeros(37, dtype=torch.bool)
    h0 = fingerprint_fields(base)["h"]
    seen = {h0}
    for k in range(37):
        changed = base.clone()
        raw = changed.view(torch.uint8).reshape(37, dtype.itemsize)
        if dtype is torch.bool:
            raw[k, 0] = 1
        else:
            raw[k, dtype.itemsize - 1] ^= 0x01  # flip one bit of element k
        h = fingerprint_fields(changed)["h"]
        assert h != h0, f"changing element {k} left the hash unchanged"
        assert h == ref_hash(logical_bytes(changed))
        seen.add(h)
        # The same change seen through a non-contiguous view of a 2-D layout.
        grid = torch.zeros(37, 2 * dtype.itemsize, dtype=torch.uint8)
        grid[:, : dtype.itemsize] = raw
        column = grid.view(dtype)[:, 0]
        assert column.stride() == (2,)
        assert fingerprint_fields(column)["h"] == h
    assert len(seen) == 38  # every single change gives a different hash


@pytest.mark.parametrize("name", ALL_DTYPES)
def test_swapping_two_unequal_elements_changes_hash(name: str) -> None:
    dtype = get_dtype(name)
    n = 24
    raw = torch.zeros(n, dtype.itemsize, dtype=torch.uint8)
    raw[:, 0] = torch.arange(1, n + 1, dtype=torch.uint8)  # distinct, valid for every dtype
    if dtype is torch.bool:
        raw[:, 0] = torch.tensor([1, 0] * (n // 2), dtype=torch.uint8)
    base = raw.reshape(-1).view(dtype)
    h0 = fingerprint_fields(base)["h"]
    assert h0 == _C.hash_buffer(logical_bytes(base))
    for i, j in [(0, 1), (0, n - 1), (3, 4), (7, 8), (2, 17)]:
        if torch.equal(raw[i], raw[j]):
            continue  # equal elements (bool pattern): nothing would move
        perm = list(range(n))
        perm[i], perm[j] = j, i
        swapped = raw[perm].reshape(-1).view(dtype)
        h = fingerprint_fields(swapped)["h"]
        assert h != h0, f"swapping elements {i} and {j} left the hash unchanged"
        assert h == ref_hash(logical_bytes(swapped))


def test_permutation_sensitivity_where_xor_hash_is_blind() -> None:
    """Whole 8-byte words exchanged: an XOR/sum of element hashes cannot see it, this can."""
    t = torch.tensor([1.5, -2.25, 3.0, 4.0], dtype=torch.float64)
    swapped = t[[1, 0, 2, 3]]
    assert fingerprint_fields(t)["h"] != fingerprint_fields(swapped)["h"]
    if hasattr(torch, "hash_tensor"):
        assert torch.hash_tensor(t).item() == torch.hash_tensor(swapped).item()
    # A transpose of a square matrix with distinct entries changes the hash, not the stats.
    m = torch.arange(16, dtype=torch.float32).reshape(4, 4)
    a, b = fingerprint_fields(m), fingerprint_fields(m.t())
    assert a["h"] != b["h"] and a["m"] == b["m"]


# --------------------------------------------------------------------------------------------
# Edge cases
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ALL_DTYPES)
@pytest.mark.parametrize("shape", [(0,), (3, 0), (0, 4, 2), (2, 0, 0, 1)])
def test_empty_tensor(name: str, shape: tuple[int, ...]) -> None:
    dtype = get_dtype(name)
    t = torch.empty(shape, dtype=dtype)
    for view in (t, t.transpose(0, -1), t.unsqueeze(0).expand(3, *shape)):
        fp = fingerprint_fields(view)
        assert fp["h"] == 0 and fp["z"] == 0 and fp["b"] == b""
        assert fp["m"] == [None, None, None, None, 0, 0]


@pytest.mark.parametrize("name", ALL_DTYPES)
def test_zero_dim_tensor(name: str) -> None:
    dtype = get_dtype(name)
    t = random_tensor((), dtype, 3, "bits")
    assert t.dim() == 0
    fp = check_against_reference(t)
    data = logical_bytes(t)
    assert fp["z"] == dtype.itemsize and fp["b"] == data and fp["h"] == ref_hash(data)
    # Expanding a scalar (all strides 0) repeats its bytes.
    e = t.expand(3, 5)
    assert e.stride() == (0, 0)
    fe = check_against_reference(e)
    assert fe["h"] == ref_hash(data * 15) and fe["z"] == 15 * dtype.itemsize


def test_zero_dim_float_values() -> None:
    fp = fingerprint_fields(torch.tensor(3.5))
    assert fp["m"] == [3.5, 3.5, 3.5, 3.5, 0, 0]
    assert fp["b"] == np.float32(3.5).tobytes() and fp["z"] == 4
    assert fingerprint_fields(torch.tensor(float("nan")))["m"] == [None, None, None, None, 1, 0]


@pytest.mark.parametrize(
    ("name", "shape", "view"),
    [
        # Sizes past the 16 KiB chunk and staging buffers, odd byte counts (carried words).
        ("uint8", (16384 * 2 + 5,), lambda t: t),
        ("uint8", (301, 259), lambda t: t.t()),
        ("uint8", (4001, 7), lambda t: t[:, 1:4]),  # 3-byte runs: words straddle runs
        ("float64", (300, 257), lambda t: t.t()),
        ("complex128", (129, 130), lambda t: t.t()),
        ("bfloat16", (1000, 33), lambda t: t[::3, 1::2]),
        ("int16", (70, 70, 3), lambda t: t.permute(2, 0, 1)),
        ("float32", (1,), lambda t: t.expand(50000)),
        ("float16", (3, 1, 5), lambda t: t.expand(3, 4000, 5)),
    ],
)
def test_large_views_cross_chunk_boundaries(name, shape, view) -> None:
    dtype = get_dtype(name)
    t = view(random_tensor(shape, dtype, 11, "bits"))
    fp = check_against_reference(t)
    assert_same_fingerprint(fp, fingerprint_fields(t.contiguous()))


def test_content_hash_and_hash_buffer_agree_with_fingerprint() -> None:
    state = torch.get_rng_state()
    data = logical_bytes(state)
    assert content_hash(state) == _C.hash_buffer(data) == fingerprint_fields(state)["h"]
    assert content_hash(state) == ref_hash_np(data)
    f = torch.randn(33, dtype=torch.float64)
    assert content_hash(f) == fingerprint_fields(f)["h"]


def test_storage_offset_is_respected() -> None:
    base = torch.arange(100, dtype=torch.int32)
    a = base[10:20]
    b = torch.arange(10, 20, dtype=torch.int32)
    assert a.storage_offset() == 10
    assert fingerprint_fields(a) == fingerprint_fields(b)


# --------------------------------------------------------------------------------------------
# Lazily applied conj/neg bits, empty buffers, and a known limitation (strict xfail)
# --------------------------------------------------------------------------------------------


def test_conjugate_view_is_fingerprinted_by_value() -> None:
    x = torch.tensor([1 + 2j, 3 - 4j], dtype=torch.complex64)
    c = x.conj()  # a view with is_conj(): same bytes as x, different values
    assert c.is_conj()
    assert fingerprint_fields(c)["h"] == ref_hash(logical_bytes(c.resolve_conj()))
    assert fingerprint_fields(c)["h"] != fingerprint_fields(x)["h"]


def test_negative_view_is_fingerprinted_by_value() -> None:
    x = torch.tensor([1 + 2j, 3 - 4j], dtype=torch.complex64)
    n = x.conj().imag  # values [-2, 4], stored as [2, -4] with is_neg()
    assert n.is_neg()
    assert fingerprint_fields(n)["m"] == [-2.0, 4.0, 1.0, 4.0, 0, 0]


@pytest.mark.xfail(
    strict=True, reason="known limitation: the float64 running sum overflows past ~1.8e308"
)
def test_mean_of_huge_float64_values_is_finite() -> None:
    t = torch.tensor([1e308, 1e308, 1.5e308], dtype=torch.float64)
    m = fingerprint_fields(t)["m"]
    assert m[2] == pytest.approx(exact_mean(t.numpy()), rel=1e-15)


def test_content_hash_of_empty_tensor() -> None:
    assert content_hash(torch.empty(0, dtype=torch.uint8)) == 0
