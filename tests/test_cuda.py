"""GPU recording: fingerprints agree with the CPU bit for bit, recording changes nothing and
never synchronises, and GPU-only divergences are named. Skipped without a CUDA device."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import pytest

torch = pytest.importorskip("torch")

from conftest import line_of  # noqa: E402
from tolerant_runs import GPU_PAIRS, record_runs  # noqa: E402

from opguard import _C  # noqa: E402
from opguard.analysis import diff_runs  # noqa: E402
from opguard.analysis.contract import to_json  # noqa: E402
from opguard.analysis.tolerant.rule import Tolerance  # noqa: E402
from opguard.recorder.tensors import PendingFields, fingerprint_fields  # noqa: E402
from opguard.store import Run  # noqa: E402
from opguard.store.sketch import decode as decode_sketch  # noqa: E402

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(
        not (torch.cuda.is_available() and _C.cuda_status()[0]),
        reason="needs a CUDA device and OpGuard built with CUDA",
    ),
]

SCENARIOS = Path(__file__).parent / "cuda_scenarios"

DTYPES = [
    torch.bool,
    torch.uint8,
    torch.int8,
    torch.int16,
    torch.int32,
    torch.int64,
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.complex64,
    torch.complex128,
    torch.float8_e4m3fn,
    torch.float8_e5m2,
]


def _random(shape: tuple[int, ...], dtype: torch.dtype, generator: torch.Generator) -> torch.Tensor:
    raw = torch.randint(0, 256, (*shape, dtype.itemsize), dtype=torch.uint8, generator=generator)
    return raw.view(dtype).reshape(shape) if shape else raw.view(dtype).reshape(())


def _gpu_fields(t: torch.Tensor) -> dict:
    fields = fingerprint_fields(t)
    assert isinstance(fields, PendingFields)
    return fields.resolve()


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_gpu_fingerprint_equals_cpu(dtype: torch.dtype) -> None:
    g = torch.Generator().manual_seed(1)
    for shape in [(), (0,), (1,), (7,), (33, 5), (4, 3, 17), (1 << 20,), (257, 1031)]:
        cpu = _random(shape, dtype, g)
        gpu = cpu.cuda()
        views = [(cpu, gpu)]
        if cpu.dim() >= 2:
            views.append((cpu.transpose(0, 1), gpu.transpose(0, 1)))
            views.append((cpu[1:, ::2], gpu[1:, ::2]))
        if cpu.dim() == 1 and cpu.numel() > 3:
            views.append((cpu[1:], gpu[1:]))  # unaligned start
            views.append((cpu[3::3], gpu[3::3]))
        for c, d in views:
            expected = fingerprint_fields(c)
            got = _gpu_fields(d)
            assert got["h"] == expected["h"], (shape, c.stride())
            assert got["z"] == expected["z"]
            assert got["b"] == expected["b"]
            if "m" in expected:
                em, gm = expected["m"], got["m"]
                assert gm[4:] == em[4:]  # NaN and Inf counts exact
                for e, v in zip(em[:4], gm[:4], strict=True):
                    if e is None or math.isnan(e):  # no finite value, or a sum that overflowed
                        assert v is None or math.isnan(v)
                    else:
                        assert v == pytest.approx(e, rel=1e-5, abs=1e-30)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_permuted_rows_equal_cpu(dtype: torch.dtype) -> None:
    """Outer dimensions permuted, innermost contiguous (attention's outputs): the row kernels,
    for rows of one word, of 16-byte loads, longer than a warp reads at once, and rows whose
    last outer dimension ends every few rows."""
    g = torch.Generator().manual_seed(2)
    word = max(1, 8 // dtype.itemsize)  # elements in one 8-byte word
    for shape in [(2, 6, 5, 8), (4, 3, 5, 80), (2, 3, 4, 300), (3, 7, 2, 64), (4, 64, 12, 64)]:
        cpu = _random(shape, dtype, g)
        gpu = cpu.cuda()
        views = [
            (cpu.permute(0, 2, 1, 3), gpu.permute(0, 2, 1, 3)),
            (cpu[:, 1:3].transpose(0, 1), gpu[:, 1:3].transpose(0, 1)),
            (cpu[..., :word].transpose(1, 2), gpu[..., :word].transpose(1, 2)),
        ]
        for c, d in views:
            expected, got = fingerprint_fields(c), _gpu_fields(d)
            assert (got["h"], got["z"], got["b"]) == (expected["h"], expected["z"], expected["b"])
            if "m" in expected:
                assert got["m"][4:] == expected["m"][4:]


def test_expanded_and_large_tensor() -> None:
    base = torch.randn(1, 4096, device="cuda").expand(512, 4096)
    assert _gpu_fields(base)["h"] == fingerprint_fields(base.cpu())["h"]
    big = torch.randn(64 << 20, device="cuda")
    big[12345] = float("nan")
    got = _gpu_fields(big)
    expected = fingerprint_fields(big.cpu())
    assert got["h"] == expected["h"] and got["m"][4] == 1


SKETCHED = [
    torch.float16,
    torch.bfloat16,
    torch.float32,
    torch.float64,
    torch.float8_e4m3fn,
    torch.float8_e5m2,
]


def _normal(shape: tuple[int, ...], dtype: torch.dtype, generator: torch.Generator) -> torch.Tensor:
    """Finite values of ``dtype`` (random bits would hold NaNs)."""
    return (torch.randn(shape, generator=generator) * 3).to(dtype)


def _assert_same_sketch(got: dict, expected: dict) -> None:
    """The GPU's sketch is the CPU's up to the order of its float64 sums: norms equal as float32
    but for a rounding tie, buckets within one quantization step."""
    gpu, cpu = decode_sketch(got["w"]), decode_sketch(expected["w"])
    assert gpu is not None and cpu is not None
    assert gpu.norm == pytest.approx(cpu.norm, rel=1e-6)
    assert max(abs(a - b) for a, b in zip(gpu.buckets, cpu.buckets, strict=True)) <= cpu.step


@pytest.mark.parametrize("dtype", SKETCHED, ids=str)
def test_gpu_sketch_equals_the_cpus(dtype: torch.dtype) -> None:
    """Every kernel's sketch: contiguous (aligned or not), permuted rows (of 16-byte loads, of
    words, longer than a warp reads), gathered elements (transposed, sliced)."""
    g = torch.Generator().manual_seed(4)
    shapes = [(1,), (7,), (9,), (4099,), (1 << 20,), (33, 5), (257, 1031), (2, 3, 4, 300)]
    for shape in [*shapes, (4, 64, 12, 64), (2, 6, 5, 8)]:
        cpu = _normal(shape, dtype, g)
        gpu = cpu.cuda()
        views = [(cpu, gpu)]
        if cpu.dim() >= 2:
            views.append((cpu.transpose(0, 1), gpu.transpose(0, 1)))
            views.append((cpu[1:, ::2], gpu[1:, ::2]))
        if cpu.dim() == 4:
            views.append((cpu.permute(0, 2, 1, 3), gpu.permute(0, 2, 1, 3)))
        if cpu.dim() == 1 and cpu.numel() > 3:
            views.append((cpu[1:], gpu[1:]))  # unaligned start
            views.append((cpu[3::3], gpu[3::3]))
        for c, d in views:
            _assert_same_sketch(_gpu_fields(d), fingerprint_fields(c))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32, torch.float64], ids=str)
def test_a_lone_nan_and_infinity_give_the_cpus_stats_and_sketch(dtype: torch.dtype) -> None:
    """The kernels trust values to be finite and read a warp's values again, tested, when one
    is not: a NaN and an -inf among 4M finite values (contiguous, and as permuted rows) give the
    CPU's counts, stats and sketch of the finite part, whichever warps met them."""
    g = torch.Generator().manual_seed(5)
    cpu = _normal((64, 64, 16, 64), dtype, g)
    cpu.view(-1)[123457] = float("nan")
    cpu.view(-1)[4000001] = -float("inf")
    gpu = cpu.cuda()
    for c, d in [(cpu, gpu), (cpu.permute(0, 2, 1, 3), gpu.permute(0, 2, 1, 3))]:
        got, expected = _gpu_fields(d), fingerprint_fields(c)
        assert got["h"] == expected["h"]
        assert got["m"][4:] == expected["m"][4:] and expected["m"][4] == 1
        for e, v in zip(expected["m"][:4], got["m"][:4], strict=True):
            assert v == pytest.approx(e, rel=1e-5, abs=1e-30)
        _assert_same_sketch(got, expected)


def test_gpu_sketch_of_batched_launches_equals_the_cpus(tmp_path: Path) -> None:
    """Contiguous tensors of one dtype fingerprinted together share launches (a _foreach_ op's
    list; step-level entries carry no sketch): each input gets the CPU's sketch, a tensor with a
    NaN and an -inf too (of its finite part)."""
    import opguard
    from opguard.store.reader import Run

    g = torch.Generator().manual_seed(5)
    dtypes = [torch.float16, torch.bfloat16, torch.float32, torch.float64]
    tensors = [_normal(s, d, g).cuda() for d in dtypes for s in [(5,), (33, 7), (4099,), (70,)]]
    tensors[1][3, 4] = float("nan")
    tensors[2][7] = -float("inf")
    expected = [fingerprint_fields(t.cpu()) for t in tensors]
    with opguard.record(tmp_path / "run"):
        torch._foreach_zero_(tensors)
    (op,) = [op for op in Run(tmp_path / "run").rank(0).ops() if op.op.startswith("aten::_foreach")]
    assert len(op.inputs) == len(tensors)
    for read, cpu in zip(op.inputs, expected, strict=True):
        _assert_same_sketch({"w": read.sketch_bytes}, cpu)


def test_a_foreach_list_shares_launches_and_equals_the_cpu(tmp_path: Path) -> None:
    """A _foreach_ op's tensors are fingerprinted in shared launches (runs of contiguous
    tensors of one dtype), with the same results as the CPU's, whatever their layout."""
    import opguard
    from opguard.recorder import tensors
    from opguard.store.reader import Run

    g = torch.Generator().manual_seed(3)
    shapes = [(5,), (33, 7), (1 << 18,), (3,), (70,), (0,)]
    cpu = [_random(shape, torch.float32, g) for shape in shapes]
    cpu.insert(3, _random((8, 9), torch.float32, g).t())  # not contiguous: launched alone
    gpu = [t.cuda() for t in cpu]
    with opguard.record(tmp_path / "run"):
        kernels_before = tensors._gpu().kernel_launches
        torch._foreach_mul_(gpu, 2.0)
        kernels = tensors._gpu().kernel_launches - kernels_before
    (op,) = [
        op for op in Run(tmp_path / "run").rank(0).ops() if op.op == "aten::_foreach_mul_.Scalar"
    ]
    expected = [fingerprint_fields(t.cpu()) for t in gpu]
    assert [(t.hash, t.nbytes) for t in op.outputs] == [(e["h"], e["z"]) for e in expected]
    # 7 inputs, then 7 outputs: three launches each (the transposed tensor splits the run
    # of contiguous ones; the empty one is completed on the host)
    assert kernels == 6


def _run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, *args], cwd=cwd, capture_output=True, text=True, timeout=600
    )


def _record(
    script: str,
    run_dir: Path,
    *script_args: str,
    capture: str | None = None,
    verify_inputs: bool = False,
) -> str:
    result = _run(
        "-m",
        "opguard",
        "record",
        "-o",
        str(run_dir),
        "--overwrite",
        *(["--capture", capture] if capture else []),
        *(["--verify-inputs"] if verify_inputs else []),
        "--",
        str(SCENARIOS / script),
        *script_args,
        cwd=run_dir.parent,
    )
    assert result.returncode == 0, result.stderr
    return result.stdout


def _ops(run_dir: Path, span: str) -> list[dict]:
    """``opguard show RUN --ops SPAN --json``: rank 0's ops."""
    result = _run(
        "-m", "opguard", "show", str(run_dir), "--ops", span, "--json", cwd=run_dir.parent
    )
    return json.loads(result.stdout)["ranks"]["0"]


def _diff(a: Path, b: Path) -> dict:
    result = _run("-m", "opguard", "diff", str(a), str(b), "--json", cwd=a.parent)
    assert result.returncode in (0, 1), result.stderr
    return json.loads(result.stdout)


def test_gradient_accumulation_on_the_gpu_has_the_backward_call_site(tmp_path: Path) -> None:
    """A GPU's backward runs on an autograd thread without Python frames: the ops with no
    forward op (AccumulateGrad's writes into ``.grad``) take the ``backward()`` call's line from
    the training's thread, as on the CPU, not an unknown site."""
    import opguard
    from opguard.store import Run

    here = Path(__file__).resolve()
    with opguard.record(tmp_path / "run"):
        layer = torch.nn.Linear(4, 3).cuda()
        for _ in range(2):  # the second backward accumulates into .grad: add_
            layer(torch.randn(2, 4, device="cuda")).sum().backward()  # <- accumulating backward
    with Run(tmp_path / "run") as run:
        ops = list(run.rank(0).ops())
    accumulated = [o for o in ops if o.phase == "backward" and o.op == "aten::add_.Tensor"]
    assert accumulated
    assert {(o.call_site.file, o.call_site.line) for o in accumulated} == {
        (str(here), line_of(here, "accumulating backward"))
    }


def test_recorded_gpu_losses_are_bit_identical(tmp_path: Path) -> None:
    plain = _run(str(SCENARIOS / "train_small.py"), cwd=tmp_path)
    assert plain.returncode == 0, plain.stderr
    recorded = _record("train_small.py", tmp_path / "run")
    assert recorded.splitlines() == plain.stdout.splitlines()


def test_recording_never_synchronises(tmp_path: Path) -> None:
    result = _run(str(SCENARIOS / "no_sync.py"), str(tmp_path / "run"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "ops recorded" in result.stdout


def test_nondeterministic_index_add_is_an_origin(tmp_path: Path) -> None:
    _record("index_add.py", tmp_path / "a")
    _record("index_add.py", tmp_path / "b")
    report = _diff(tmp_path / "a", tmp_path / "b")
    assert report["verdict"] == "diverged"
    first = report["first_divergence"]
    assert first["kind"] == "origin"
    assert first["a"]["op"].startswith("aten::index_add")
    assert first["inputs_differ"] == [] and first["arguments_differ"] == []
    (cause,) = first["likely_causes"]
    assert cause["cause"].startswith(
        "same environment, `index_add_` on CUDA is documented nondeterministic (atomics"
    )


def test_tf32_setting_is_an_origin(tmp_path: Path) -> None:
    _record("matmul_tf32.py", tmp_path / "a", "off")
    _record("matmul_tf32.py", tmp_path / "b", "on")
    report = _diff(tmp_path / "a", tmp_path / "b")
    first = report["first_divergence"]
    assert report["verdict"] == "diverged"
    assert first["kind"] == "origin"  # same inputs, same arguments: the kernel differed
    assert first["a"]["op"] in ("aten::mm.default", "aten::addmm.default")
    assert first["inputs_differ"] == [] and first["arguments_differ"] == []
    # Run B turned TF32 on after recording started: the recorded settings say so.
    assert "TF32 in cuBLAS matmuls (off vs on)" in first["likely_causes"][0]["cause"]


def test_kernels_are_recorded_per_op(tmp_path: Path) -> None:
    _record("matmul_tf32.py", tmp_path / "a", "off")
    mm = [
        op
        for op in _ops(tmp_path / "a", "0:50")
        if op["op"] in ("aten::mm.default", "aten::addmm.default")
    ]
    assert mm and mm[0]["kernels"], "the matmul's kernels were not recorded"
    kernel = mm[0]["kernels"][0]
    assert kernel["k"] == "kernel" and kernel["n"] and kernel["t1"] >= kernel["t0"]
    _record("matmul_tf32.py", tmp_path / "b", "on")
    first = _diff(tmp_path / "a", tmp_path / "b")["first_divergence"]
    assert first["kernels_differ"], first["kernels"]
    assert "different kernels" in first["summary"]


@pytest.mark.skipif(
    torch.cuda.device_count() < 2 or not torch.distributed.is_nccl_available(),
    reason="needs two GPUs and NCCL",
)
def test_ddp_rank_local_tf32_names_the_origin_rank(tmp_path: Path) -> None:
    """Two ranks of DDP GPT-2 small on NCCL; in run B rank 1 alone enables TF32. Rank 1 is the
    origin (same inputs, a different GEMM kernel), rank 0 a receiver at DDP's all-reduce."""
    torchrun = ["--", str(Path(sys.executable).with_name("torchrun")), "--nproc-per-node", "2"]
    script = str(SCENARIOS / "ddp_gpt2.py")
    for name, extra in (("a", []), ("b", ["--tf32-rank", "1"])):
        result = _run(
            "-m", "opguard", "record", "-o", str(tmp_path / name), *torchrun, script, *extra,
            cwd=tmp_path,
        )  # fmt: skip
        assert result.returncode == 0, result.stdout + result.stderr
    report = _diff(tmp_path / "a", tmp_path / "b")
    assert report["verdict"] == "diverged"
    assert report["origin_ranks"] == [1]
    first = report["first_divergence"]
    assert first["rank"] == 1 and first["kind"] == "origin"
    assert first["a"]["op"] in ("aten::mm.default", "aten::addmm.default")
    rank_0, rank_1 = report["ranks"]
    assert rank_1["role"] == "origin"
    assert rank_0["role"] == "receiver"
    assert rank_0["collective"]["op"].startswith("c10d::allreduce")


def test_stream_race_shows_the_read_before_the_write(tmp_path: Path) -> None:
    """Run B reads on a side stream without waiting for the default stream's write: the read is
    an origin (same recorded inputs, other outputs), and the evidence is its kernel starting on
    another stream before the writer's kernel ended."""
    _record("stream_race.py", tmp_path / "a", "sync")
    _record("stream_race.py", tmp_path / "b", "race")
    first = _diff(tmp_path / "a", tmp_path / "b")["first_divergence"]
    assert first["kind"] == "origin"
    assert first["a"]["op"].startswith("aten::sum")
    assert first["stream_race"] and first["stream_race"].startswith("run B:")
    assert "aten::copy_" in first["stream_race"]


def test_stream_race_through_a_batched_matmul_is_named(tmp_path: Path) -> None:
    """A batched matmul's output (``mm`` seen through ``_unsafe_view``, which launches nothing)
    reduced on a side stream without ``wait_stream``: the side-stream ``sum`` is the origin,
    and its most likely cause is the race with the ``mm``, with the times."""
    _record("matmul_stream_race.py", tmp_path / "a", "sync")
    _record("matmul_stream_race.py", tmp_path / "b", "race")
    first = _diff(tmp_path / "a", tmp_path / "b")["first_divergence"]
    assert first["kind"] == "origin" and first["a"]["op"].startswith("aten::sum")
    race = first["likely_causes"][0]
    assert race["kind"] == "stream-race", first["likely_causes"]
    assert re.fullmatch(
        r"race: `sum` on stream \d+ started [\d.]+ µs before its input's writer `mm` on "
        r"stream \d+ finished",
        race["cause"],
    ), race["cause"]
    assert race["evidence"].startswith("run B: aten::mm.default #")
    assert "through aten::_unsafe_view.default" in race["evidence"]
    assert first["summary"].endswith(race["cause"])


def test_gpu_work_no_recorded_op_launched_is_named(tmp_path: Path) -> None:
    """A ctypes cuMemsetD32Async between two recorded ops changes a tensor in run B (run A's
    writes the value it already held). Verified inputs: the diff places the write between the
    last op that read the tensor unchanged and the first that read it changed, and names the
    memset; unverified: the read looks like an origin, and the hint names the memset."""
    for name, value in (("a", "same"), ("b", "other")):
        _record("unrecorded_memset.py", tmp_path / name, value, verify_inputs=True)
        _record("unrecorded_memset.py", tmp_path / f"{name}_unverified", value)
    ops = {op["index"]: op for op in _ops(tmp_path / "b", "0:100")}
    reader = next(i for i, op in ops.items() if op["op"] == "aten::mul.Tensor")
    first = _diff(tmp_path / "a", tmp_path / "b")["first_divergence"]
    assert (first["kind"], first["cause"]) == ("propagated", "unrecorded-write"), first
    (window,) = first["unrecorded_writes"]
    assert window["run"] == "B" and window["before"] == reader
    assert ops[window["after"]]["op"] == "aten::sum.default"  # the last unchanged read
    assert [(k["k"], k["i"]) for k in window["kernels"]] == [("memset", window["after"])]
    assert window["kernels"][0]["z"] == 4096 * 4
    assert ", kernels: memset" in first["summary"]
    # The memset followed the sum; it is no op's own GPU work.
    assert [k["k"] for k in ops[window["after"]]["unrecorded_after"]] == ["memset"]
    memset = window["kernels"][0]
    assert all(
        (k["k"], k.get("z"), k["t0"]) != ("memset", memset["z"], memset["t0"])
        for op in ops.values()
        for k in op.get("kernels", ())
    )
    unverified = _diff(tmp_path / "a_unverified", tmp_path / "b_unverified")["first_divergence"]
    assert unverified["cause"] == "origin"
    assert "GPU work OpGuard did not record (memset)" in unverified["hint"]


def test_recorders_own_gpu_work_is_never_unrecorded(tmp_path: Path) -> None:
    """A training loop recorded on the GPU launches nothing outside its ops: the recorder's
    fingerprint kernels and copies are its own, not user code's."""
    _record("train_small.py", tmp_path / "run")
    ops = _ops(tmp_path / "run", "0:100000")
    assert len(ops) > 100 and any(op.get("kernels") for op in ops)
    unrecorded = [(op["index"], op["unrecorded_after"]) for op in ops if "unrecorded_after" in op]
    assert unrecorded == []


def test_nondeterministic_kernel_replays_as_nondeterministic(tmp_path: Path) -> None:
    """A captured float32 index_add_ with many duplicate indices (atomics) gives different bits
    from replay to replay on every GPU, and the same bits on the CPU."""
    captured = tmp_path / "captured"
    _record("index_add.py", captured, capture="aten::index_add_")
    index = next(
        op["index"] for op in _ops(captured, "0:50") if op["op"].startswith("aten::index_add_")
    )
    replay = _run(
        "-m", "opguard", "replay", str(captured), "--op", str(index), "--times", "20", "--json",
        cwd=tmp_path,
    )  # fmt: skip
    assert replay.returncode == 1, replay.stderr  # not deterministic
    report = json.loads(replay.stdout)
    assert report["deterministic"] is False
    assert all(d["device"].startswith("cuda") for d in report["devices"])
    assert all(d["distinct"] > 1 for d in report["devices"])
    assert any("nondeterministic" in f for f in report["findings"])
    assert report["suspect_devices"] == []
    assert report["reference"]["outputs"][0]["replay"]["rel"] < 1e-4
    # The same op on the CPU is deterministic: the kernel, not the inputs, is the cause.
    cpu = _run(
        "-m", "opguard", "replay", str(captured), "--op", str(index), "--times", "3",
        "--device", "cpu", "--json", cwd=tmp_path,
    )  # fmt: skip
    assert json.loads(cpu.stdout)["deterministic"] is True


def test_gpu_gemm_replays_bit_for_bit(tmp_path: Path) -> None:
    """GEMMs captured from the GPU (a synchronous copy to the host) replay bit for bit on
    every GPU, none flagged; capturing changes no recorded fingerprint."""
    run_dir = tmp_path / "train"
    _record("train_small.py", run_dir, capture="aten::mm,aten::addmm")
    plain = tmp_path / "plain"
    _record("train_small.py", plain)
    assert _run("-m", "opguard", "diff", str(plain), str(run_dir), cwd=tmp_path).returncode == 0
    gemms = [
        op["index"]
        for op in _ops(run_dir, "0:400")
        if op["op"] in ("aten::mm.default", "aten::addmm.default")
    ]
    assert gemms
    for index in gemms[:4]:
        replay = _run(
            "-m", "opguard", "replay", str(run_dir), "--op", str(index), "--times", "3", "--json",
            cwd=tmp_path,
        )  # fmt: skip
        report = json.loads(replay.stdout)
        assert report["deterministic"] and report["matches_a"], report
        assert report["suspect_devices"] == []


def _attention_runs(tmp_path: Path, *names: str) -> dict[str, Path]:
    """``attention_adamw.py`` recorded under each ``optimizer[-ballast]`` name."""
    runs = {}
    for name in names:
        optimizer, _, ballast = name.partition("-")
        _record(
            "attention_adamw.py", tmp_path / name, optimizer, *(["--ballast"] if ballast else [])
        )
        runs[name] = tmp_path / name
    return runs


def test_unwritten_attention_scalars_are_absorbed(tmp_path: Path) -> None:
    """Memory-efficient attention returns its philox seed and offset unwritten when dropout is
    off; another allocation history leaves other bits there. The backward ignores them: the
    runs are identical, the scalars a note. A rerun is identical too."""
    runs = _attention_runs(tmp_path, "foreach", "foreach-ballast", "foreach-rerun")
    report = _diff(runs["foreach"], runs["foreach-ballast"])
    assert report["verdict"] == "identical", report["first_divergence"]
    rank = report["ranks"][0]
    assert rank["absorbed_count"] > 0
    assert all("efficient_attention" in a["op"] for a in rank["absorbed"]), rank["absorbed"]
    assert _diff(runs["foreach"], runs["foreach-rerun"])["verdict"] == "identical"


def test_fused_against_foreach_adamw_names_the_optimizer_step(tmp_path: Path) -> None:
    """The fused and foreach AdamW kernels round differently; the attention scalars that differ
    before them (other allocation histories) are absorbed, and the optimizer step is named."""
    runs = _attention_runs(tmp_path, "foreach", "fused")
    first = _diff(runs["foreach"], runs["fused"])["first_divergence"]
    assert first is not None and first["step"] == 0
    named = first["a"] or first["b"]
    assert named["phase"] == "optimizer", first
    script = SCENARIOS / "attention_adamw.py"
    assert named["call_site"]["line"] == line_of(script, "opt.step"), first


def test_step_records_on_the_gpu_are_the_cpus_fingerprints_without_a_sync(tmp_path: Path) -> None:
    """``--steps-only`` on the GPU under CUDA's sync debug mode: the gradients, parameters and
    AdamW states fingerprinted on the GPU hash as their CPU copies do; the CUDA generator's
    state is recorded; no op."""
    from opguard.store import Run

    save = tmp_path / "saved.pt"
    result = _run(
        str(SCENARIOS / "steps_gpu.py"), str(tmp_path / "run"), "steps", str(save), cwd=tmp_path
    )
    assert result.returncode == 0, result.stderr
    saved = torch.load(save, weights_only=False)
    with Run(tmp_path / "run") as run:
        trace = run.rank(0)
        assert len(trace) == 0 and "step_failure" not in trace.info
        last = list(trace.step_states())[-1].entries
    grads = [e.tensor.hash for e in last if e.kind == "grad"]
    params = [e.tensor.hash for e in last if e.kind == "param"]
    assert grads == [fingerprint_fields(g)["h"] for g in saved["grads"]]
    assert params == [fingerprint_fields(p)["h"] for p in saved["params"]]
    states = {(e.name, e.slot): e.tensor.hash for e in last if e.kind == "state"}
    assert len(states) == 3 * len(params)
    assert ("cuda:0", "") in {(e.name, e.slot) for e in last if e.kind == "rng"}
    assert [e.name for e in last if e.kind == "buffer"] == [
        "1.running_mean",
        "1.running_var",
        "1.num_batches_tracked",
    ]


def test_a_window_records_ops_and_their_kernels_inside_it_only(tmp_path: Path) -> None:
    """Ops of step 1 only, with their kernels; outside the window CUPTI is off, so no GPU
    work is reported after the window's last op (as work no recorded op launched)."""
    from opguard.store import Run

    result = _run(
        str(SCENARIOS / "steps_gpu.py"),
        str(tmp_path / "run"),
        "window",
        str(tmp_path / "saved.pt"),
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    with Run(tmp_path / "run") as run:
        trace = run.rank(0)
        ops = list(trace.ops())
        assert {op.step for op in ops} == {1}
        assert any(op.kernels for op in ops)
        assert not any(op.unclaimed_kernels for op in ops)
        assert [s.step for s in trace.step_states()] == [0, 1, 2]


def test_hunt_finds_a_late_gpt2_difference_and_its_op(tmp_path: Path) -> None:
    """200 GPT-2 small steps, run B's loss scaled by 1.0001 at step 150: ``opguard hunt``
    names step 150 from the step-level records, records that step again op by op, and names
    the scaling op and its line."""
    pytest.importorskip("transformers")
    script = SCENARIOS / "gpt2_long.py"
    result = _run(
        *("-m", "opguard", "hunt", "-o", str(tmp_path / "hunt"), "--json"),
        *("--a", str(script), "--b", f"{script} --scale-at 150"),
        cwd=tmp_path,
    )
    assert result.returncode == 1, result.stderr
    answer = json.loads(result.stdout)
    assert (answer["step"], answer["rank"], answer["reproduced"]) == (150, 0, True)
    assert answer["step_level"]["first_divergence"]["cause"] == "loss"
    first = answer["op_level"]["first_divergence"]
    assert first["step"] == 150 and first["a"]["op"] == "aten::mul.Tensor"
    assert first["a"]["call_site"]["line"] == line_of(script, "scale")


@pytest.fixture(scope="module")
def held_out_runs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The runs of issue 38's held-out GPU pairs (tests/tolerant_runs.py), recorded once."""
    pytest.importorskip("transformers")
    root = tmp_path_factory.mktemp("held_out")
    held_out = [pair for pair in GPU_PAIRS.values() if pair.held_out]
    record_runs(root, sorted({run for pair in held_out for run in (pair.a, pair.b)}))
    return root


@pytest.mark.parametrize("name", [name for name, pair in GPU_PAIRS.items() if pair.held_out])
def test_held_out_gpu_pairs_get_the_right_tolerant_answer(held_out_runs: Path, name: str) -> None:
    """The half of the GPU calibration pairs no bound was fitted on: rounding alone (fused
    AdamW, flash attention, TF32 against bf16 autocast) is within rounding, and a real change
    behind it (an lr, an RMSNorm eps, a loss scale at step 1) is named at its op and step."""
    pair = GPU_PAIRS[name]
    with Run(held_out_runs / pair.a) as run_a, Run(held_out_runs / pair.b) as run_b:
        out = to_json(diff_runs(run_a, run_b, tolerance=Tolerance()))
    right, said = pair.check(out)
    assert right, said
