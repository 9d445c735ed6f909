"""Why an origin happened: the likely causes of a difference, ranked with their evidence
(``first_divergence.likely_causes``), from the environment each run recorded, the kernels each
op ran, PyTorch's nondeterministic ops and stream races.

The traces here are written by tests/traces.py (the real :class:`TraceWriter`), shaped
like the recorder's; kernel lists are handed over through ``poll_kernels`` as CUPTI's drain
does (a GPU is needed only to record them, see ``tests/test_cuda.py``). Both runs:
``randn`` (op 0) → an op that makes its output from op 0's (op 1) → the op whose outputs differ
from equal inputs (op 2).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

import pytest
from conftest import cli_in_process, run_cli
from traces import chain_run, kernel

from opguard.agent.evidence import build_evidence
from opguard.agent.metadata import differing_metadata
from opguard.agent.tools import TraceTools
from opguard.analysis import diff_runs
from opguard.analysis.divergence.gpu_work import memory_writer
from opguard.store import Run
from opguard.store.environment import environment_of

GENERIC = "(nondeterministic kernel, race, different kernel or hardware fault)"

# What a recording made here on one machine holds (store.environment), before any change.
ENVIRONMENT: dict[str, Any] = {
    "torch": "2.13.0+cpu",
    "torch_git": "cf30153c4c131c8164ee7798e5022d810682e2cb",
    "cuda": None,
    "cpu": "Intel(R) Xeon(R) Processor",
    "cpu_capability": "AVX512",
    "threads": 2,
    "deterministic_algorithms": "off",
    "float32_matmul_precision": "highest",
    "gpus": [],
    "env": {"OMP_NUM_THREADS": None, "ATEN_CPU_CAPABILITY": None},
}


def _kernel(name: str, stream: int, start: int, end: int) -> dict[str, Any]:
    return kernel(name, start, stream=stream, duration=end - start)


def write_run(
    path: Path,
    ops: list[tuple[str, int | None, int]],
    *,
    environment: dict[str, Any] | None = None,
    meta: dict[str, Any] | None = None,
    device: str = "cpu",
    kernels: dict[int, list[dict[str, Any]]] | None = None,
    args: dict[int, list[list[Any]]] | None = None,
    site_file: str | None = None,
) -> None:
    """One run of ``ops``: (name, producer of its input or None, output fingerprint), each
    reading the output of its producer with the fingerprint that producer wrote."""
    chain_run(
        path,
        ops,
        args=args,
        device=device,
        meta={**({"environment": environment} if environment is not None else {}), **(meta or {})},
        kernels=[kernels] if kernels else [],
        site=(site_file, 5, "main", "y = step(x)") if site_file else None,
    )


def _cpu_pair(root: Path, env_a: dict[str, Any], env_b: dict[str, Any]) -> tuple[Path, Path]:
    """CPU runs whose ``gelu`` (op 2) differs from equal inputs, in environments a and b."""
    for name, env, out in (("a", env_a, 30), ("b", env_b, 31)):
        ops = [("aten::randn.default", None, 10), ("aten::mm.default", 0, 20)]
        write_run(root / name, [*ops, ("aten::gelu.default", 1, out)], environment=env)
    return root / "a", root / "b"


def _first(a: Path, b: Path) -> dict[str, Any]:
    code, out, err = cli_in_process("diff", str(a), str(b), "--json")
    assert code == 1, err
    first: dict[str, Any] = json.loads(out)["first_divergence"]
    return first


# -- the environment --------------------------------------------------------------------------------


def test_different_builds_and_cpu_capability_rank_first(tmp_path: Path) -> None:
    """The same script on two machines with two torch builds: the origin's likely cause is the
    environment, named with both values, and no unrecorded-write hint misleads."""
    other = {**ENVIRONMENT, "torch": "2.11.0+cu128", "torch_git": "0123456789abcdef"}
    other["cpu_capability"] = "AVX2"
    first = _first(*_cpu_pair(tmp_path, other, ENVIRONMENT))
    assert (first["kind"], first["a"]["op"]) == ("origin", "aten::gelu.default")
    top, *rest = first["likely_causes"]
    assert top == {
        "kind": "environment",
        "cause": "different torch builds (2.11.0+cu128 vs 2.13.0+cpu) and CPU capability "
        "(AVX2 vs AVX512): the op's implementation differs",
        "evidence": "recorded environments: torch: 2.11.0+cu128 (A) vs 2.13.0+cpu (B); "
        "cpu_capability: AVX2 (A) vs AVX512 (B)",
    }
    assert rest == []  # a CPU op in two environments: no guess about unrecorded writes
    assert first["hint"] is None
    assert first["summary"].endswith(f": {top['cause']}") and GENERIC not in first["summary"]


def test_settings_only_and_what_the_op_cannot_feel(tmp_path: Path) -> None:
    """Fields of another device (TF32 in cuBLAS for a CPU op) are no cause; a setting of the
    op's own device is, worded as a setting; a field one run did not record is unknown."""
    gpu_only = {**ENVIRONMENT, "cuda_matmul_tf32": True, "cuda": "12.8"}
    threads = {**ENVIRONMENT, "threads": 16, "env": {"OMP_NUM_THREADS": "16"}}
    first = _first(*_cpu_pair(tmp_path / "gpu", gpu_only, ENVIRONMENT))
    assert [c["kind"] for c in first["likely_causes"]] == ["unverified-input"]
    first = _first(*_cpu_pair(tmp_path / "threads", threads, ENVIRONMENT))
    assert first["likely_causes"][0]["cause"] == (
        "different intra-op threads (16 vs 2) and OMP_NUM_THREADS (16 vs unset): the op may run "
        "another algorithm, precision or split of its work"
    )
    unknown = {k: v for k, v in ENVIRONMENT.items() if k not in ("cpu_capability", "env")}
    first = _first(
        *_cpu_pair(tmp_path / "unknown", unknown, {**ENVIRONMENT, "cpu_capability": "AVX2"})
    )
    assert [c["kind"] for c in first["likely_causes"]] == ["unverified-input"]


def test_unrecorded_write_hint_only_without_another_explanation(tmp_path: Path) -> None:
    """Same environment, a CPU op that is not nondeterministic: nothing recorded explains the
    difference, so the unrecorded write is the guess, last and alone, and the hint says how to
    check it; the summary keeps the generic wording (nothing is known)."""
    first = _first(*_cpu_pair(tmp_path, ENVIRONMENT, ENVIRONMENT))
    (guess,) = first["likely_causes"]
    assert guess["kind"] == "unverified-input" and "nothing else" in guess["cause"]
    assert "--verify-inputs" in first["hint"]
    assert first["summary"].endswith(GENERIC)


def test_traces_without_a_recorded_environment(tmp_path: Path) -> None:
    """Traces from before the environment was recorded keep opening; what their meta.json
    held (torch, devices, variables that were set) still counts, the rest is unknown."""
    legacy = {"torch": "2.11.0", "cuda": None, "devices": ["cpu: x86_64"], "env": {}}
    for name, meta, out in (("a", legacy, 30), ("b", {**legacy, "torch": "2.13.0"}, 31)):
        ops = [("aten::randn.default", None, 10), ("aten::mm.default", 0, 20)]
        write_run(tmp_path / name, [*ops, ("aten::gelu.default", 1, out)], meta=meta)
    first = _first(tmp_path / "a", tmp_path / "b")
    assert first["likely_causes"][0]["cause"] == (
        "different torch builds (2.11.0 vs 2.13.0): the op's implementation differs"
    )
    env = environment_of({**legacy, "devices": ["cpu: x86_64", "cuda:0: NVIDIA H200"]})
    assert not env.recorded
    assert env.fields == {"torch": "2.11.0", "cuda": None, "gpus": ["NVIDIA H200"]}
    # A variable an old trace did not list is unknown; a new trace lists the unset ones.
    old = environment_of({"env": {"OMP_NUM_THREADS": "4"}})
    new = environment_of({"environment": {"env": {"OMP_NUM_THREADS": None}}})
    assert old.fields == {"env.OMP_NUM_THREADS": "4"}
    assert new.fields == {"env.OMP_NUM_THREADS": None} and new.recorded
    # The rank's own view wins over the run's meta.json.
    rank = environment_of({"environment": {"cpu": "x"}}, {"environment": {"cpu": "y"}})
    assert rank.fields["cpu"] == "y"


def test_a_package_that_called_the_op(tmp_path: Path) -> None:
    """Another version of the package whose code called the op is named; a package the op's
    stack does not reach is not."""
    site = tmp_path / "site-packages"
    packages = {"mylib": {"version": "1.0", "paths": [str(site / "mylib")]}}
    packages["other"] = {"version": "1.0", "paths": [str(site / "other")]}
    for name, version, out in (("a", "1.0", 30), ("b", "2.0", 31)):
        env = {**ENVIRONMENT, "packages": {**packages, "mylib": {**packages["mylib"]}}}
        env["packages"]["mylib"]["version"] = version
        env["packages"]["other"] = {**packages["other"], "version": version}
        ops = [("aten::randn.default", None, 10), ("aten::mm.default", 0, 20)]
        write_run(
            tmp_path / name,
            [*ops, ("aten::gelu.default", 1, out)],
            environment=env,
            site_file=str(site / "mylib" / "layers.py"),
        )
    first = _first(tmp_path / "a", tmp_path / "b")
    assert first["likely_causes"][0]["cause"] == (
        "different mylib versions (1.0 vs 2.0): the op's implementation differs"
    )


# -- the op and its kernels -------------------------------------------------------------------------


def _gpu_pair(
    root: Path,
    name: str,
    kernels_b: list[dict[str, Any]],
    *,
    env_a: dict[str, Any] = ENVIRONMENT,
    env_b: dict[str, Any] = ENVIRONMENT,
    args: list[list[Any]] | None = None,
) -> tuple[Path, Path]:
    """GPU runs whose op 2, ``name``, differs from equal inputs; run A's op 2 ran
    ``index_add_kernel``, run B's ``kernels_b``."""
    own = [_kernel("void at::native::indexFuncLargeIndex<float>(float*, int)", 7, 3000, 3500)]
    for run, env, out, ran in (("a", env_a, 30, own), ("b", env_b, 31, kernels_b)):
        kernels = {
            0: [_kernel("void at::native::normal_kernel<float>(float*)", 7, 1000, 1500)],
            1: [_kernel("void at::native::vectorized_elementwise_kernel<4>(int)", 7, 2000, 2500)],
            2: ran,
        }
        ops = [("aten::randn.default", None, 10), ("aten::mul.Tensor", 0, 20), (name, 1, out)]
        write_run(
            root / run,
            ops,
            environment=env,
            device="cuda:0",
            kernels=kernels,
            args={2: args} if args else None,
        )
    return root / "a", root / "b"


INDEX_ADD_KERNEL = [
    _kernel("void at::native::indexFuncLargeIndex<float>(float*, int)", 7, 3000, 3600)
]


def test_documented_nondeterministic_op_on_cuda(tmp_path: Path) -> None:
    first = _first(*_gpu_pair(tmp_path / "plain", "aten::index_add_.default", INDEX_ADD_KERNEL))
    (cause,) = first["likely_causes"]
    assert cause["kind"] == "nondeterministic-op"
    assert cause["cause"] == (
        "same environment, `index_add_` on CUDA is documented nondeterministic (atomics: the "
        "order of its additions varies): `torch.use_deterministic_algorithms(True)` would make "
        "it deterministic"
    )
    assert first["summary"].endswith(cause["cause"]) and first["hint"] is None
    # Deterministic algorithms on in both runs: the op ran its deterministic algorithm.
    on = {**ENVIRONMENT, "deterministic_algorithms": "on"}
    pair = _gpu_pair(
        tmp_path / "on", "aten::index_add_.default", INDEX_ADD_KERNEL, env_a=on, env_b=on
    )
    assert _first(*pair)["likely_causes"] == []
    # An op the documentation lists for some calls only: put_ with accumulate=False.
    pair = _gpu_pair(
        tmp_path / "put", "aten::put_.default", INDEX_ADD_KERNEL, args=[["accumulate", False]]
    )
    assert "would refuse it" in _first(*pair)["likely_causes"][0]["cause"]
    pair = _gpu_pair(
        tmp_path / "put_acc", "aten::put_.default", INDEX_ADD_KERNEL, args=[["accumulate", True]]
    )
    assert "`put_` on CUDA" in _first(*pair)["likely_causes"][0]["cause"]
    # Not in the table: no cause, and no guess either (GPU ops are not the CPU's guess).
    assert (
        _first(*_gpu_pair(tmp_path / "mm", "aten::mm.default", INDEX_ADD_KERNEL))["likely_causes"]
        == []
    )


def test_the_nondeterministic_table_names_real_ops() -> None:
    """Every op of the table is an ATen op of this torch (a misspelt name would never match),
    and its conditions select the calls the documentation names."""
    import torch

    from opguard.analysis.divergence.causes import NONDETERMINISTIC, documented_nondeterministic
    from opguard.store import OpRecord, TensorRecord
    from opguard.store.records import UNKNOWN_SITE

    for entry in NONDETERMINISTIC:
        for name in entry.ops:
            assert hasattr(torch.ops.aten, name.removeprefix("aten::")), name

    def call(name: str, device: str, **args: Any) -> OpRecord:
        tensor = TensorRecord("self", "float32", (4,), (1,), device, 1, 16, b"", None, None, 0)
        return OpRecord(
            0, name, 0, "forward", UNKNOWN_SITE, -1, None, tuple(args.items()), (tensor,), (), None
        )

    found = documented_nondeterministic
    assert found(call("aten::index_put_.default", "cpu", accumulate=True)) is not None
    assert found(call("aten::index_put_.default", "cuda:0", accumulate=True)) is None
    assert found(call("aten::index_put_.default", "cuda:0", accumulate=False)) is not None
    assert found(call("aten::scatter_reduce.two", "cuda:0", reduce="amax")) is None
    prod = found(call("aten::scatter_reduce.two", "cuda:0", reduce="prod"))
    assert prod is not None and prod.mode == "refuse it"
    assert found(call("aten::median.default", "cuda:0")) is None
    assert found(call("aten::median.dim", "cuda:0")) is not None
    assert found(call("aten::index_add_.default", "cpu")) is None


def test_same_environment_different_kernels(tmp_path: Path) -> None:
    other = [_kernel("void cutlass::Kernel<cutlass_80_tensorop_s1688gemm>(Params)", 7, 3000, 3400)]
    first = _first(*_gpu_pair(tmp_path, "aten::index_add_.default", other))
    kinds = [c["kind"] for c in first["likely_causes"]]
    assert kinds == ["different-kernels", "nondeterministic-op"]
    assert first["likely_causes"][0]["cause"] == (
        "same environment, different kernels chosen: at::native::indexFuncLargeIndex (A) vs "
        "cutlass::Kernel (B)"
    )
    assert "different kernels" in first["summary"]


def test_report_header_and_evidence_show_the_causes(tmp_path: Path) -> None:
    other = [_kernel("void cutlass::Kernel<cutlass_80_tensorop_s1688gemm>(Params)", 7, 3000, 3400)]
    a, b = _gpu_pair(tmp_path, "aten::index_add_.default", other)
    code, out, _ = cli_in_process("diff", str(a), str(b))
    report = " ".join(out.split())
    assert (
        code == 1 and "likely causes (most likely first): 1. same environment, different" in report
    )
    assert "2. same environment, `index_add_` on CUDA is documented nondeterministic" in report
    assert "evidence: the op's kernels differ" in report
    with Run(a) as run_a, Run(b) as run_b:
        result = diff_runs(run_a, run_b)
        evidence = build_evidence(result, run_a, run_b)
    assert (
        "## likely causes (most likely first)\n1. same environment, different kernels"
        in evidence.text
    )
    assert evidence.data["first_divergence"]["likely_causes"][1]["kind"] == "nondeterministic-op"
    reading = evidence.data["reading"]
    assert reading[0].startswith(
        "equal inputs and arguments, different outputs; most likely same environment, different kernels chosen"
    )
    assert reading[1].startswith("also possible: same environment, `index_add_`")


async def test_tui_header_shows_the_other_likely_causes(tmp_path: Path) -> None:
    from test_tui import SIZE, _settle

    from opguard.tui.app import OpguardApp
    from opguard.tui.session import Session

    other = [_kernel("void cutlass::Kernel<cutlass_80_tensorop_s1688gemm>(Params)", 7, 3000, 3400)]
    app = OpguardApp(Session.open(*_gpu_pair(tmp_path, "aten::index_add_.default", other)))
    async with app.run_test(size=SIZE) as pilot:
        await _settle(pilot)
        header = " ".join(str(app.query_one("#run-header").render()).split())
    assert "different kernels chosen" in header  # the summary's, the most likely
    assert "likely: same environment, `index_add_` on CUDA is documented" in header


# -- stream races ------------------------------------------------------------------------------------


def _race_pair(root: Path) -> tuple[Path, Path]:
    """``mm`` (op 1) writes on stream 7 from 2.0 to 9.0 µs; ``_unsafe_view`` (op 2) of it
    launches nothing; ``sum`` (op 3) reads the view on stream 13: after the write in run A,
    from 5.0 µs in run B (a batched matmul's output reduced on a side stream, no wait)."""
    mm = [_kernel("sm90_xmma_gemm_f32f32_tf32f32_f32_nn_n", 7, 2000, 9000)]
    for run, start, out in (("a", 9500, 40), ("b", 5000, 41)):
        kernels = {
            0: [_kernel("void at::native::normal_kernel<float>(float*)", 7, 1000, 1500)],
            1: mm,
            3: [_kernel("void at::native::reduce_kernel<512, 1>(Reduce)", 13, start, start + 800)],
        }
        ops = [
            ("aten::randn.default", None, 10),
            ("aten::mm.default", 0, 20),
            ("aten::_unsafe_view.default", 1, 20),
            ("aten::sum.default", 2, out),
        ]
        write_run(root / run, ops, environment=ENVIRONMENT, device="cuda:0", kernels=kernels)
    return root / "a", root / "b"


def test_a_race_through_a_view_is_named(tmp_path: Path) -> None:
    first = _first(*_race_pair(tmp_path))
    assert (first["kind"], first["a"]["op"]) == ("origin", "aten::sum.default")
    sentence = "race: `sum` on stream 13 started 4.0 µs before its input's writer `mm` on stream 7 finished"
    assert first["stream_race"].startswith(f"run B: {sentence} (")
    race, *_ = first["likely_causes"]
    assert race["kind"] == "stream-race" and race["cause"] == sentence
    assert race["evidence"] == (
        "run B: aten::mm.default #1 wrote with sm90_xmma_gemm_f32f32_tf32f32_f32_nn_n on stream 7 "
        "from 0.0 to 7.0 µs; aten::sum.default #3 read with at::native::reduce_kernel on stream "
        "13 from 3.0 µs; the input reached it through aten::_unsafe_view.default #2, which "
        "launched no GPU work"
    )
    assert first["summary"].endswith(f": {sentence}")
    # The report lists the race once, as the first cause with its times.
    code, out, _ = cli_in_process("diff", str(tmp_path / "a"), str(tmp_path / "b"))
    report = " ".join(out.split())
    assert code == 1 and f"1. {sentence} evidence: run B: aten::mm.default #1 wrote" in report
    assert "stream race:" not in report


CLOCK = 1796308553021419468  # CUPTI's clock: nanoseconds since an epoch, as recorded


def test_the_evidence_reads_kernels_as_the_report_does(tmp_path: Path) -> None:
    """The race pair on CUPTI's clock, the reading kernel with its grid and block and a
    memset after it: the evidence the model reads, and the kernels tool it may call, give each
    launch as the report words it (name, grid, block, bytes, stream), with its start and end
    in µs from the step's first GPU work, never the store's keys and clock."""
    for run, start, out in (("a", 9500, 40), ("b", 5000, 41)):
        reduce = _kernel("reduce_kernel", 13, CLOCK + start, CLOCK + start + 800)
        reduce.update(g=[262144, 1, 1], b=[128, 1, 1])
        memset = kernel("memset", CLOCK + start + 900, stream=13, duration=100, kind="memset", z=4)
        kernels = {
            0: [_kernel("normal_kernel", 7, CLOCK + 1000, CLOCK + 1500)],
            1: [_kernel("gemm", 7, CLOCK + 2000, CLOCK + 9000)],
            3: [reduce, memset],
        }
        ops = [
            ("aten::randn.default", None, 10),
            ("aten::mm.default", 0, 20),
            ("aten::_unsafe_view.default", 1, 20),
            ("aten::sum.default", 2, out),
        ]
        write_run(tmp_path / run, ops, environment=ENVIRONMENT, device="cuda:0", kernels=kernels)
    with Run(tmp_path / "a") as run_a, Run(tmp_path / "b") as run_b:
        text = build_evidence(diff_runs(run_a, run_b), run_a, run_b).text
        tools = TraceTools(run_a, run_b, 0)
        answer = tools.call("kernels", {"run": "b", "index": 3})
    said = "kernels, µs from the start of step 0's GPU work:"
    a_kernels = [
        f"  {said}",
        "    reduce_kernel grid [262144, 1, 1] block [128, 1, 1] stream 13 8.5–9.3 µs",
        "    memset 4 bytes stream 13 9.4–9.5 µs",
    ]
    assert "\n".join(a_kernels) in text, text
    assert "stream 13 4.0–4.8 µs" in text and "stream 13 4.9–5.0 µs" in text, text
    assert not re.search(r"\b(t0|t1|k|s|d|g|b|z)=", text), text
    assert answer == (
        f"{said}\n"
        "  reduce_kernel grid [262144, 1, 1] block [128, 1, 1] stream 13 4.0–4.8 µs\n"
        "  memset 4 bytes stream 13 4.9–5.0 µs"
    )


def test_memory_writer_follows_kernel_less_ops(tmp_path: Path) -> None:
    a, _ = _race_pair(tmp_path)
    with Run(a) as run:
        trace = run.rank(0)
        writer, through = memory_writer(trace, (2, 0))
        assert (writer.op, [op.op for op in through]) == (
            "aten::mm.default",
            ["aten::_unsafe_view.default"],
        )
        writer, through = memory_writer(trace, (1, 0))
        assert (writer.index, through) == (1, [])


def test_metadata_flattens_the_recorded_environment() -> None:
    a = {"torch": "2.13.0", "environment": {"torch": "2.13.0", "cpu_capability": "AVX512"}}
    b = {"torch": "2.13.0", "environment": {"torch": "2.13.0", "cpu_capability": "AVX2"}}
    a["environment"]["packages"] = {"numpy": {"version": "2.4.6", "paths": ["/x/numpy"]}}
    b["environment"]["packages"] = {"numpy": {"version": "2.3.0", "paths": ["/y/numpy"]}}
    found = {m.key: (m.a, m.b, m.environmental) for m in differing_metadata(a, b)}
    assert found == {
        "environment.cpu_capability": ("AVX512", "AVX2", True),
        "packages.numpy": ("2.4.6", "2.3.0", True),
    }


# -- the same script recorded with two torch builds, on two machines ---------------------------------

CROSS_VERSION = Path(__file__).parent / "data" / "cross_version"
CROSS_PAIR = (CROSS_VERSION / "torch-2.11", CROSS_VERSION / "torch-2.13")


@pytest.mark.skipif(
    not all((run / "meta.json").exists() for run in CROSS_PAIR),
    reason="the cross-version traces are recorded on two machines (tests/data/cross_version/mlp.py)",
)
def test_cross_version_pair_is_explained_by_the_builds(tmp_path: Path) -> None:
    """tests/data/cross_version/mlp.py recorded with torch 2.11 (on the GPU machine, run on its
    CPU) and with torch 2.13 (CI's): the origin's most likely cause is the two builds (and the
    CPUs' capability when it differs), and no unrecorded-write hint leads."""
    a, b = (
        Path(shutil.copytree(run, tmp_path / run.name)) for run in CROSS_PAIR
    )  # LMDB writes a lock
    first = _first(a, b)
    assert first["kind"] == "origin", first["summary"]
    top = first["likely_causes"][0]
    assert top["kind"] == "environment", first["likely_causes"]
    assert re.match(r"different torch builds \(2\.11\S* vs 2\.13\S*\)", top["cause"]), top
    capability = [
        json.loads((run / "meta.json").read_text())["environment"]["cpu_capability"]
        for run in CROSS_PAIR
    ]
    if capability[0] != capability[1]:
        assert f"CPU capability ({capability[0]} vs {capability[1]})" in top["cause"]
    assert first["hint"] is None
    assert "unverified-input" not in [c["kind"] for c in first["likely_causes"]]


def test_cpu_capability_is_named_for_a_real_recording(tmp_path: Path) -> None:
    """The fixture's script recorded twice on this machine, once with the CPU capability
    forced down to DEFAULT (no SIMD): the origin is named with that difference, recorded."""
    import torch

    capability = torch.backends.cpu.get_cpu_capability()
    if capability == "DEFAULT":
        pytest.skip("this CPU has no capability above DEFAULT")
    script = str(CROSS_VERSION / "mlp.py")
    for name, env in (("a", {}), ("b", {"ATEN_CPU_CAPABILITY": "default"})):
        result = run_cli("record", "-o", str(tmp_path / name), "--", script, cwd=tmp_path, env=env)
        assert result.returncode == 0, result.stderr
    first = _first(tmp_path / "a", tmp_path / "b")
    assert first["kind"] == "origin"
    (cause,) = first["likely_causes"]
    assert cause["cause"] == (
        f"different CPU capability ({capability} vs DEFAULT) and ATEN_CPU_CAPABILITY (unset vs "
        "default): the op's implementation differs"
    )
    assert first["hint"] is None


# -- recording the environment ---------------------------------------------------------------------


def test_recording_keeps_the_environment(write_script: Any, record: Any) -> None:
    """What the recorder keeps, in meta.json and each rank's trace: torch's build, the CPU's
    capability, and the settings as the script left them (it changes them after recording
    started), plus the packages its call sites live in."""
    import numpy
    import torch

    script = write_script(
        "train.py",
        """
        import numpy
        import torch

        torch.set_num_threads(1)
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.set_float32_matmul_precision("high")
        x = torch.from_numpy(numpy.ones(4, dtype=numpy.float32))
        print(float((x * 2).sum()))
        """,
    )
    run_dir = record(script)
    with Run(run_dir) as run:
        recorded = run.meta["environment"]
        assert run.rank(0).info["environment"] == recorded
        assert run.rank(0).environment.recorded
    assert (
        recorded["torch"] == torch.__version__
        and recorded["torch_git"] == torch.version.git_version
    )
    assert recorded["cpu_capability"] == torch.backends.cpu.get_cpu_capability()
    assert recorded["cpu"] and recorded["cuda"] == torch.version.cuda
    assert recorded["threads"] == 1
    assert recorded["deterministic_algorithms"] == "warn only"
    assert recorded["float32_matmul_precision"] == "high"
    assert recorded["env"]["ATEN_CPU_CAPABILITY"] is None  # known to be unset
    assert recorded["packages"]["numpy"]["version"] == numpy.__version__


def test_packages_of_call_site_files() -> None:
    """A file under site-packages belongs to the distribution of its top-level package; files
    elsewhere (the user's scripts) to none."""
    import numpy

    from opguard.recorder.environment import packages

    inside = str(Path(numpy.__file__).parent / "linalg" / "_linalg.py")
    found = packages([inside, "/home/user/train.py"])
    assert found["numpy"]["version"] == numpy.__version__
    assert str(Path(numpy.__file__).parent) in found["numpy"]["paths"]
    assert "train" not in found
