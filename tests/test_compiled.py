"""torch.compile while recording, and code the dispatcher does not see.

``tests/scenarios/compiled_model.py`` trains a tiny compiled model on the CPU (Inductor's C++
backend); each recording changes one thing (see ``scenario_runs.SCRIPT_ARGS``). Recordings are
shared with the rest of the session and made in parallel; the models are tiny because Inductor
compiles each variant from scratch.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import subprocess
import sys
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import torch
import warm
from conftest import opguard_cmd, run_cli
from rich.console import Console
from scenario_runs import COMPILED, Recordings, session_recordings
from test_scenarios import diff, diverged, identical, line_of
from torch._dynamo.utils import counters

import opguard
from opguard.agent.evidence import build_evidence
from opguard.analysis import diff_runs
from opguard.analysis.browse.rows import OpLine, Row, Status
from opguard.recorder import compiled as compiled_module
from opguard.recorder.compiled import (
    INDUCTOR_CONFIG,
    CompileSettings,
    kernel_launches,
    kernel_sources,
    user_origins,
)
from opguard.store import OpRecord, Run
from opguard.tui.detail import Selection, display_path, render

pytestmark = pytest.mark.slow  # long in all: started first (conftest.py)


@pytest.fixture(scope="session")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Recordings:
    return session_recordings(tmp_path_factory)


def ops_of(run: Path) -> list[OpRecord]:
    with Run(run) as opened:
        return list(opened.rank(0).ops())


def printed(run: Path) -> list[str]:
    """What the recorded script printed: its losses and the sum of its trained weights."""
    return (run.parent / f"{run.name}.stdout").read_text().splitlines()


# -- recording ------------------------------------------------------------------------------------


def test_recording_a_compiled_model_keeps_its_numbers(runs: Recordings) -> None:
    """Recording used to make Dynamo run compiled code eagerly (a user dispatch mode was
    active), so a recorded run computed something else than the script alone. Now the recorded
    losses are the unrecorded compiled ones, bit for bit, and differ from the eager ones."""
    compiled, eager = runs("compiled", "eager")
    alone = warm.run([sys.executable, str(COMPILED)], timeout=300)
    assert alone.returncode == 0, alone.stderr
    plain = alone.stdout.splitlines()
    assert len(plain) == 3
    assert printed(compiled) == plain
    assert printed(eager) != plain


def test_compiled_regions_and_their_kernels_are_recorded(runs: Recordings) -> None:
    (compiled,) = runs("compiled")
    ops = ops_of(compiled)
    regions = [op for op in ops if op.op.startswith("compiled::")]
    kernels = [op for op in ops if op.op.startswith("inductor::cpp_fused_")]
    assert {op.op for op in regions} == {"compiled::forward", "compiled::backward"}
    assert len(regions) == 4  # forward and backward, two steps
    forward = regions[0]
    assert forward.phase == "forward"
    assert Path(forward.call_site.file).resolve() == COMPILED.resolve()
    assert forward.call_site.function == "forward"
    arguments = dict(forward.args)
    assert len(arguments["graph"]) == 16
    assert arguments["ops"].split(", ")[:3] == ["permute", "addmm", "var_mean"]
    assert "relu" in arguments["ops"] and "opguard_tests::scale" in arguments["ops"]
    assert {op.phase for op in regions[1::2]} == {"backward"}
    # A kernel comes before its region, reads its inputs and writes its outputs.
    first = kernels[0]
    assert first.index < forward.index
    assert first.phase == "forward"
    assert any(t.slot.startswith("in_ptr") for t in first.inputs)
    assert first.outputs and all(
        t.slot.startswith(("out_ptr", "in_out_ptr")) for t in first.outputs
    )
    assert all(t.hash is not None for t in first.outputs)
    assert "code" in dict(first.args)
    # The region's outputs are the last kernel's results: consumers link to the region.
    consumer = ops[forward.index + 1]
    assert consumer.inputs[0].producer == (forward.index, 0)


@pytest.mark.parametrize("recording", ["compiled", "compiled_verified"])
def test_memory_a_kernel_writes_before_reading_is_not_compared_as_its_input(
    runs: Recordings, recording: str
) -> None:
    """Inductor names a buffer ``in_out_ptr`` when one part of a fused kernel computes it and a
    later part updates it in place (the layer norm's mean here), in memory the wrapper has just
    allocated outside the dispatcher. Its bytes before the kernel are whatever the allocator's
    last user left, different between runs for no reason in either, and were fingerprinted as
    the kernel's input: a false difference of inputs. Now they are marked uninitialized, with
    --verify-inputs too, while an ``in_out_ptr`` a recorded op wrote first (the backward's GEMM
    result) is read."""
    (compiled,) = runs(recording)
    ops = ops_of(compiled)
    forward = next(op for op in ops if op.op.startswith("inductor::cpp_fused_native_layer_norm"))
    fresh = [t for t in forward.inputs if t.slot.startswith("in_out_ptr")]
    assert len(fresh) == 2
    assert all(t.is_uninitialized and t.producer is None for t in fresh)
    assert all(t.hash is not None for t in forward.inputs if t.slot.startswith("in_ptr"))
    assert all(t.hash is not None for t in forward.outputs)
    backward = next(op for op in ops if op.op.startswith("inductor::cpp_fused_mul_native"))
    (written,) = [t for t in backward.inputs if t.slot == "in_out_ptr0"]
    assert not written.is_uninitialized and written.hash is not None
    assert written.producer is not None and ops[written.producer[0]].op == "aten::mm.out"


def test_eager_switch_turns_compilation_off(runs: Recordings) -> None:
    compiled, eager = runs("compiled", "eager")
    assert not any(op.op.startswith(("compiled::", "inductor::")) for op in ops_of(eager))
    meta = {
        name: json.loads((run / "meta.json").read_text())
        for name, run in (("c", compiled), ("e", eager))
    }
    assert meta["c"]["torch_compile"] == "enabled"
    assert meta["e"]["torch_compile"] == "disabled"
    assert "--eager" in meta["e"]["command"]


def test_kernel_sources_reads_inductor_wrapper_modules() -> None:
    """Parameter roles of C++ kernels come from their signature in the wrapper's source."""
    wrapper = '''
cpp_fused_mul_0 = async_compile.cpp_pybinding(['const float*', 'float*', 'const int64_t'], r"""
extern "C"  void  kernel(const float* in_ptr0,
                       float* out_ptr0,
                       const int64_t ks0)
{}
""")
triton_poi_fused_1 = async_compile.triton('triton_poi_fused_1', """def k(in_out_ptr0): pass""")
other = something(1, 2)
'''
    found = kernel_sources(wrapper)
    assert found["cpp_fused_mul_0"][0] == ("in_ptr0", "out_ptr0", "ks0")
    assert found["triton_poi_fused_1"] == ((), "def k(in_out_ptr0): pass")
    assert "other" not in found


# -- the diff -------------------------------------------------------------------------------------


def test_same_compiled_code_twice_is_identical(runs: Recordings) -> None:
    """Kernel names carry no hashes: two runs of the same code align kernel by kernel."""
    a, b = runs("compiled", "compiled_rerun")
    code, result = diff(a, b)
    identical(code, result)
    assert result["unaligned_a"] == result["unaligned_b"] == 0
    assert result["torch_compile"] == {"a": "enabled", "b": "enabled"}


def test_changed_activation_inside_the_compiled_region(runs: Recordings) -> None:
    """ReLU → GELU inside the compiled region: the diff names the generated kernel that
    changed, not the next op it sees."""
    a, b = runs("compiled", "compiled_gelu")
    first = diverged(*diff(a, b))
    assert (first["kind"], first["cause"]) == ("structure", "replaced")
    assert first["a"]["op"].startswith("inductor::cpp_fused_") and "relu" in first["a"]["op"]
    assert first["b"]["op"].startswith("inductor::cpp_fused_") and "gelu" in first["b"]["op"]
    assert first["a"]["phase"] == "forward"
    assert first["known_difference"] is None
    # The region around it is where the user called the model.
    assert first["a"]["call_site"]["function"] == "forward"


def _origin_lines(ref: dict[str, Any]) -> list[tuple[str, int, str]]:
    return [
        (str(Path(o["file"]).resolve()), o["line"], o["function"]) for o in ref.get("origins", [])
    ]


def test_changed_kernel_is_named_with_the_lines_it_was_made_from(runs: Recordings) -> None:
    """The kernel's call site is where the compiled model was called; its origins name the
    line of the model where the activation is written, in the JSON and the report."""
    a, b = runs("compiled", "compiled_gelu")
    first = diverged(*diff(a, b))
    activation = (str(COMPILED.resolve()), line_of(COMPILED, "activation"), "forward")
    assert "gelu" in first["b"]["op"] and "relu" in first["a"]["op"]
    for side in ("a", "b"):
        assert activation in _origin_lines(first[side]), first[side]
        assert first[side]["call_site"]["line"] != activation[1]  # call_site stays the caller
    (shown,) = [o for o in first["b"]["origins"] if o["line"] == activation[1]]
    assert shown["source"] == "h = getattr(F, args.activation)(h)  # <- activation"
    report = run_cli("diff", str(a), str(b))
    assert report.returncode == 1
    assert f"from: {COMPILED.resolve()}:{activation[1]} in forward" in report.stdout
    assert f"{activation[1]} │ h = getattr(F, args.activation)(h)" in report.stdout


def test_kernel_origins_in_the_detail_pane_and_the_evidence(runs: Recordings) -> None:
    a, b = runs("compiled", "compiled_gelu")
    line = line_of(COMPILED, "activation")
    with Run(a) as ra, Run(b) as rb:
        result = diff_runs(ra, rb)
        first = result.first
        assert first is not None and first.a is not None and first.b is not None
        row = Row(
            OpLine(first.a.index, first.a.op, first.a.call_site, 1),
            OpLine(first.b.index, first.b.op, first.b.call_site, 1),
            Status.DIFFERING,
        )
        traces = (ra.rank(0), rb.rank(0))
        console = Console(width=160, record=True, file=open(os.devnull, "w"))  # noqa: SIM115
        console.print(render(Selection.load(row, traces)))
        pane = console.export_text()
        evidence = build_evidence(result, ra, rb).text
    shown = display_path(str(COMPILED.resolve()))  # relative to the directory pytest runs in
    assert f"A and B from {shown}:{line} in forward" in pane, pane
    assert f"from compiled_model.py:{line} (forward): h = getattr(F, args.activation)(h)" in (
        evidence
    )


def test_every_recorded_kernel_names_its_origins(runs: Recordings) -> None:
    """Forward and backward kernels alike: the user's lines of the model, never torch's."""
    (compiled,) = runs("compiled")
    kernels = [op for op in ops_of(compiled) if op.op.startswith("inductor::")]
    assert kernels and all(op.origins for op in kernels)
    files = {Path(site.file).resolve() for op in kernels for site in op.origins}
    assert files == {COMPILED.resolve()}
    backward = [op for op in kernels if op.phase == "backward"]
    assert backward and all(
        site.function == "forward" for op in backward for site in op.origins
    )  # a backward kernel comes from the forward lines it differentiates


def test_kernel_launches_reads_the_provenance_comments() -> None:
    """Inductor names each launch's provenance key in a comment before it; one kernel can be
    launched from several places (C++ by call, Triton by ``.run``)."""
    wrapper = """
cpp_fused_gelu_0 = async_compile.cpp_pybinding(['float*'], r'''...''')
def call(self, args):
        # [Provenance debug handles] extern_kernels.addmm:1
        extern_kernels.addmm(a, b, c, out=buf0)
        # [Provenance debug handles] cpp_fused_gelu_0:2
        cpp_fused_gelu_0(buf0, buf1)
        # [Provenance debug handles] triton_poi_fused_1:3
        buf2 = empty()
        triton_poi_fused_1.run(buf1, buf2, 16, stream=stream0)
        # [Provenance debug handles] cpp_fused_gelu_0:4
        cpp_fused_gelu_0(buf2, buf3)
        not_cpp_fused_gelu_0(buf3)
"""
    launches = kernel_launches(wrapper)
    assert launches["cpp_fused_gelu_0"] == {7: "cpp_fused_gelu_0:2", 12: "cpp_fused_gelu_0:4"}
    assert launches["triton_poi_fused_1"] == {10: "triton_poi_fused_1:3"}
    assert kernel_launches(wrapper.replace("Provenance", "Other")) == {}


def test_user_origins_are_the_innermost_user_frames() -> None:
    """Of each stack trace, the innermost frame in user code: a frame in torch (an
    ``nn.GELU`` module's forward) is not the user's line."""
    traces = {
        "cpp_fused_gelu_0:2": [
            '  File "/w/model.py", line 40, in forward\n    h = self.block(x)\n'
            '  File "/w/model.py", line 12, in forward\n    return self.act(h)\n'
            '  File "/torch/nn/modules/activation.py", line 734, in forward\n'
            "    return F.gelu(input)\n",
            '  File "/w/model.py", line 12, in forward\n    return self.act(h)\n',
            '  File "/torch/nn/functional.py", line 9, in f\n    torch code\n',
        ]
    }
    origins = user_origins(traces, lambda path: not path.startswith("/torch/"))
    assert origins == {"cpp_fused_gelu_0:2": (("/w/model.py", 12, "forward"),)}


def test_settings_keep_kernel_origins_unless_the_user_chose(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Recording turns Inductor's provenance tracking on where it is off, leaves a level the
    user set alone, and on a torch without the setting sets nothing."""
    config = torch._inductor.config
    for before, during in ((0, 2), (1, 1)):
        monkeypatch.setattr(config.trace, "provenance_tracking_level", before)
        settings = CompileSettings(eager=False)
        settings.apply()
        assert config.trace.provenance_tracking_level == during
        settings.restore()
        assert config.trace.provenance_tracking_level == before
    older = ModuleType(INDUCTOR_CONFIG)
    older.wrap_inductor_compiled_regions = False  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, INDUCTOR_CONFIG, older)
    settings = CompileSettings(eager=False)
    settings.apply()
    assert vars(older).get("wrap_inductor_compiled_regions") is True
    assert not hasattr(older, compiled_module.PROVENANCE)
    settings.restore()


def _sine(x: torch.Tensor) -> torch.Tensor:
    return x.sin() + 1


def test_without_provenance_kernels_are_recorded_without_origins(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A torch whose Inductor keeps no provenance: kernels are recorded as before, without
    origins, and recording reports no failure."""
    monkeypatch.setattr(compiled_module, "PROVENANCE", "trace.no_such_setting")
    torch._dynamo.reset()
    compiled = torch.compile(_sine)
    x = torch.randn(8)
    with opguard.record(tmp_path / "run"):
        recorded = compiled(x)
    assert torch.equal(recorded, compiled(x))
    kernels = [op for op in ops_of(tmp_path / "run") if op.op.startswith("inductor::")]
    assert kernels and not any(op.origins for op in kernels)
    with Run(tmp_path / "run") as run:
        assert run.rank(0).failure is None


def test_custom_op_whose_implementation_changed_is_named(runs: Recordings) -> None:
    """``opguard_tests::scale`` (a torch.library op, opaque to Inductor, called from inside the
    compiled region) computes x * 0.1 in one run and x / 10 in the other."""
    a, b = runs("compiled", "compiled_divide")
    first = diverged(*diff(a, b))
    assert (first["kind"], first["cause"]) == ("origin", "origin")
    assert first["a"]["op"] == first["b"]["op"] == "opguard_tests::scale.default"
    assert first["inputs_differ"] == [] and first["arguments_differ"] == []


def test_compiled_against_eager_is_a_known_difference(runs: Recordings) -> None:
    a, b = runs("compiled", "eager")
    code, result = diff(a, b)
    first = diverged(code, result)
    assert result["torch_compile"] == {"a": "enabled", "b": "disabled"}
    assert "run A ran this code compiled" in first["known_difference"]
    assert first["a"]["op"].startswith("compiled::")
    report = run_cli("diff", str(a), str(b))
    assert report.returncode == 1
    assert "known difference: expected" in report.stdout
    assert "run B was recorded with torch.compile turned off (--eager)" in report.stdout


# -- writes the dispatcher does not see ------------------------------------------------------------


def test_unrecorded_write_is_placed_between_two_ops(runs: Recordings) -> None:
    """A NumPy view writes into the model's input: with --verify-inputs the diff says the input
    changed after it was written and between which two ops of run B."""
    a, b = runs("eager_verified", "eager_numpy_verified")
    first = diverged(*diff(a, b))
    assert (first["kind"], first["cause"]) == ("propagated", "unrecorded-write")
    (window,) = first["unrecorded_writes"]
    ops = {op.index: op for op in ops_of(b)}
    producer, after, before = (ops[window[k]] for k in ("producer", "after", "before"))
    assert window["run"] == "B"
    assert producer.op == "aten::mul.Tensor"
    assert producer.call_site.line == line_of(COMPILED, "input")
    assert after.op == "aten::detach.default"  # x.numpy() detaches, then NumPy writes
    assert before.op == "aten::addmm.default" and before.index == first["b"]["index"]
    assert f"between op {after.index} and op {before.index}" in first["summary"]


def test_unverified_unrecorded_write_gets_a_hint(runs: Recordings) -> None:
    """Without --verify-inputs the recorder trusts the producer's fingerprint, so the write
    looks like an op that changed its outputs by itself: the diff says how to find out."""
    a, b = runs("eager", "eager_numpy")
    first: dict[str, Any] = diverged(*diff(a, b))
    assert first["cause"] == "origin"
    assert "--verify-inputs" in first["hint"]


# -- on the GPU: Triton kernels ----------------------------------------------------------------------


def _gpu() -> bool:
    import torch

    from opguard import _C

    return torch.cuda.is_available() and bool(_C.cuda_status()[0])


@pytest.mark.cuda
@pytest.mark.skipif(not _gpu(), reason="needs a CUDA GPU and OpGuard built with CUDA")
def test_triton_kernels_recorded_with_their_gpu_launches(tmp_path: Path) -> None:
    names = ("relu", "gelu")
    procs = [
        subprocess.Popen(
            opguard_cmd(
                "record",
                "-o",
                str(tmp_path / name),
                "--",
                str(COMPILED),
                "--device",
                "cuda",
                "--activation",
                name,
            ),
            cwd=tmp_path,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name in names
    ]
    for proc in procs:
        _, err = proc.communicate(timeout=600)
        assert proc.returncode == 0, err
    kernels = [op for op in ops_of(tmp_path / "relu") if op.op.startswith("inductor::triton_")]
    assert kernels, "no Triton kernel recorded"
    launched = [k for op in kernels for k in op.kernels if k.kind == "kernel"]
    assert launched and any(k.name.startswith("triton_") for k in launched)
    assert all(op.origins for op in kernels)  # Triton kernels name their lines too
    first = diverged(*diff(tmp_path / "relu", tmp_path / "gelu"))
    assert first["cause"] == "replaced"
    assert "relu" in first["a"]["op"] and "gelu" in first["b"]["op"]
    activation = (str(COMPILED.resolve()), line_of(COMPILED, "activation"), "forward")
    assert activation in _origin_lines(first["b"])


def test_a_region_does_not_keep_its_inputs_alive(tmp_path: Path) -> None:
    """Inductor frees a compiled region's inputs as it runs (it clears the argument list it is
    given): a recorder holding them for the whole region raises the training's peak memory."""
    import weakref

    import torch

    import opguard
    from opguard.recorder.compiled import unit_info

    alive_inside: list[bool] = []
    first = torch.randn(64)
    inputs = [first, torch.randn(64)]
    first_ref = weakref.ref(first)
    del first

    def region(args: list[Any]) -> torch.Tensor:
        args.clear()
        alive_inside.append(first_ref() is not None)
        return torch.ones(1)

    with opguard.record(tmp_path / "run") as session:
        recorder = session._recorder
        assert recorder is not None
        info = unit_info(recorder, "compiled::test.forward", ("inputs",))
        recorder.record_call(info, region, (inputs,), {}, nested=True)
    assert alive_inside == [False]


def _deepcopy_between(x: torch.Tensor) -> torch.Tensor:
    y = x.sin()
    z = copy.deepcopy(y)  # a graph break: runs eagerly, its ops dispatched under Dynamo's hook
    return z.cos() + 1


def _frames_compiled(run_dir: Path | None) -> int:
    """Frames Dynamo compiled for one call of a freshly compiled ``_deepcopy_between``."""
    torch._dynamo.reset()
    counters.clear()
    compiled = torch.compile(_deepcopy_between, backend="eager")
    with opguard.record(run_dir) if run_dir else contextlib.nullcontext():
        compiled(torch.randn(4))
    return int(counters["frames"]["total"])


def test_dynamo_leaves_the_recorder_alone(tmp_path: Path) -> None:
    """Python a compiled function runs eagerly (at a graph break) runs under Dynamo's frame
    hook, and so do the recorder's frames for the ops it dispatches: Dynamo must not compile
    them as if they were the user's code."""
    plain = _frames_compiled(None)
    assert _frames_compiled(tmp_path / "run") == plain
    assert "aten::set_.source_Storage" in [op.op for op in ops_of(tmp_path / "run")]  # deepcopy
