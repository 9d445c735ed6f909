"""GPU work no recorded op launched (a custom extension, a raw Triton launch, a ctypes call into
libcuda), as the analysis and the front ends read it.

CUPTI needs a GPU, so these traces are written here through the real :class:`TraceWriter`, its
``poll_kernels`` hook handing over kernel lists the way the recorder's CUPTI drain does: an op's
own kernels, and work launched after it outside any op, flagged ``"u": 1``. The recording side is
tested on a GPU in ``tests/test_cuda.py``.

Both runs: ``randn`` (op 0) → ``mul`` (op 1, writes Y) → ``relu`` (op 2, reads Y) → ``addmm``
(op 3, reads Y). In run B unrecorded code launches a memset and two ``my_kernel`` between ops 2
and 3 that change Y, plus GPU work before the window and after it, which the window must leave
out.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from conftest import cli_in_process
from traces import TraceBuilder, kernel, tensor

from opguard.agent.evidence import build_evidence
from opguard.analysis import diff_runs
from opguard.store import Run


def _tensor(slot: str, fingerprint: int, producer: int | None) -> dict[str, Any]:
    return tensor(slot, fingerprint, producer, device="cuda:0")


def _kernel(name: str, start: int, *, unrecorded: bool = False, kind: str = "kernel") -> dict:
    shape = {"g": [4, 1, 1], "b": [256, 1, 1]} if kind == "kernel" else {"z": 256}
    return kernel(name, start, kind=kind, **shape, **({"u": 1} if unrecorded else {}))


OWN = {
    0: [_kernel("void at::native::normal_kernel<float>(float*, int)", 1000)],
    1: [_kernel("void at::native::vectorized_elementwise_kernel<4, MulFunctor>(int)", 2000)],
    2: [_kernel("void at::native::vectorized_elementwise_kernel<4, ReluFunctor>(int)", 3000)],
    3: [_kernel("ampere_sgemm_32x32_sliced1x4_nn", 6000)],
}
UNRECORDED_B = {
    0: [_kernel("early_kernel", 1500, unrecorded=True)],  # before the window
    2: [
        _kernel("memset", 4000, unrecorded=True, kind="memset"),
        _kernel("my_kernel(float*, int)", 4500, unrecorded=True),
        _kernel("my_kernel(float*, int)", 5000, unrecorded=True),
    ],
    3: [_kernel("late_kernel", 7000, unrecorded=True)],  # after the op that read the change
}


def _write(path: Path, *, read_y: int, out: int, unrecorded: dict[int, list[dict]]) -> None:
    """One run: op 3 reads Y with fingerprint ``read_y`` (20 as written; anything else: an
    input fingerprinted again when read, as with --verify-inputs) and outputs ``out``. What
    successive CUPTI drains hand the writer: the ops' own kernels first, unrecorded work later
    (so the writer extends lists it already wrote)."""
    ops = [
        ("aten::randn.default", [], 10),
        ("aten::mul.Tensor", [_tensor("self", 10, 0)], 20),
        ("aten::relu.default", [_tensor("self", 20, 1)], 30),
        ("aten::addmm.default", [_tensor("self", read_y, 1)], out),
    ]
    with TraceBuilder(path, kernels=[OWN, unrecorded]) as run:
        for name, inputs, output in ops:
            run.op(name, inputs, [_tensor("0", output, None)])


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A; B verified (op 3 reads the changed Y); B unverified (the recorder reused Y's
    fingerprint, so op 3 looks like it changed its output by itself); A again, with no
    unrecorded work, unverified."""
    root = tmp_path_factory.mktemp("unrecorded")
    _write(root / "a", read_y=20, out=40, unrecorded={})
    _write(root / "b", read_y=21, out=41, unrecorded=UNRECORDED_B)
    _write(root / "b_unverified", read_y=20, out=41, unrecorded=UNRECORDED_B)
    _write(root / "a_unverified", read_y=20, out=41, unrecorded={})
    return {name: str(root / name) for name in ("a", "b", "b_unverified", "a_unverified")}


def _diff(a: str, b: str) -> dict[str, Any]:
    code, out, err = cli_in_process("diff", a, b, "--json")
    assert code == 1, err
    first: dict[str, Any] = json.loads(out)["first_divergence"]
    return first


def test_reader_keeps_unrecorded_work_apart_from_the_ops_kernels(runs: dict[str, str]) -> None:
    with Run(Path(runs["b"])) as run:
        relu, addmm = run.rank(0).op(2), run.rank(0).op(3)
    assert [k.name for k in relu.kernels] == [OWN[2][0]["n"]]
    assert [k.name for k in relu.unclaimed_kernels] == ["memset", *["my_kernel(float*, int)"] * 2]
    assert [k.name for k in addmm.kernels] == ["ampere_sgemm_32x32_sliced1x4_nn"]
    assert [k.name for k in addmm.unclaimed_kernels] == ["late_kernel"]
    code, out, _ = cli_in_process("show", runs["b"], "--ops", "2", "--json")
    (shown,) = json.loads(out)["ranks"]["0"]
    assert code == 0
    assert [k["n"] for k in shown["kernels"]] == [OWN[2][0]["n"]]
    assert [k["n"] for k in shown["unrecorded_after"]] == [
        "memset",
        *["my_kernel(float*, int)"] * 2,
    ]


def test_window_lists_the_unrecorded_gpu_work_in_it(runs: dict[str, str]) -> None:
    first = _diff(runs["a"], runs["b"])
    assert (first["kind"], first["cause"]) == ("propagated", "unrecorded-write")
    (window,) = first["unrecorded_writes"]
    assert (window["run"], window["producer"], window["after"], window["before"]) == ("B", 1, 2, 3)
    assert [(k["i"], k["n"]) for k in window["kernels"]] == [
        (2, "memset"),
        (2, "my_kernel(float*, int)"),
        (2, "my_kernel(float*, int)"),
    ]
    assert window["kernels_total"] == 3
    assert (
        "run B: written by unrecorded code between op 2 and op 3, kernels: memset, my_kernel ×2"
        in first["summary"]
    )
    # The human report and the agent's evidence say the same.
    code, out, _ = cli_in_process("diff", runs["a"], runs["b"])
    assert code == 1 and "kernels: memset, my_kernel ×2" in " ".join(out.split())
    with Run(Path(runs["a"])) as a, Run(Path(runs["b"])) as b:
        evidence = build_evidence(diff_runs(a, b), a, b)
    reading = evidence.text.split("reading (rules)")[1]
    assert "between op 2 and op 3, kernels: memset, my_kernel ×2" in reading
    # The observed op's own kernels, then what ran after it unrecorded, apart.
    assert "\n    ampere_sgemm_32x32_sliced1x4_nn grid [4, 1, 1]" in evidence.text
    assert "\n    after this op, unrecorded: late_kernel grid" in evidence.text


def test_kernels_differ_ignores_work_launched_after_the_op(runs: dict[str, str]) -> None:
    """B's addmm is followed by late_kernel, which is not the addmm's: same kernels."""
    first = _diff(runs["a"], runs["b"])
    assert first["kernels_differ"] is False
    assert [k["n"] for k in first["kernels"]["b"]] == ["ampere_sgemm_32x32_sliced1x4_nn"]


def test_unverified_read_after_unrecorded_gpu_work_gets_a_hint(runs: dict[str, str]) -> None:
    """Without --verify-inputs the addmm looks like an origin; the unrecorded GPU work between
    its input's producer and it is named, with how to find out."""
    first = _diff(runs["a"], runs["b_unverified"])
    assert first["cause"] == "origin"
    hint = first["hint"]
    assert hint.startswith("run B launched GPU work OpGuard did not record")
    assert "early_kernel" not in hint and "late_kernel" not in hint
    assert "(memset, my_kernel ×2) after op 1, which produced input 'self'" in hint
    assert "--verify-inputs" in hint
    # Without unrecorded GPU work, no such hint.
    plain = _diff(runs["a"], runs["a_unverified"])
    assert plain["cause"] == "origin" and not plain["hint"]


def test_kernels_tool_shows_unrecorded_work_apart(runs: dict[str, str]) -> None:
    code, out, err = cli_in_process("kernels", runs["b"], "2", "--json")
    assert code == 0, err
    answer = json.loads(out)
    assert answer["total"] == 1 and answer["kernels"][0]["n"] == OWN[2][0]["n"]
    assert [k["n"] for k in answer["unrecorded_after"]] == [
        "memset",
        *["my_kernel(float*, int)"] * 2,
    ]
    assert answer["unrecorded_after_total"] == 3
    code, out, _ = cli_in_process("kernels", runs["a"], "2", "--json")
    assert "unrecorded_after" not in json.loads(out)
