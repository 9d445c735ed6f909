"""The GPT-2-shaped step-level traces of bench/step_diff_scale.py, small: the diff must find
the step the builder planted, with its cause and first differing gradient, by every path
(equal bytes; bytes that differ in stats and name ids), and its memory must not grow with the
traces. The timing is the bench's business."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path
from types import ModuleType

import pytest
from conftest import REPO, cli_in_process
from test_diff_scale import peak_kib


@pytest.fixture(scope="module")
def scale() -> ModuleType:
    sys.path.insert(0, str(REPO / "bench"))  # it imports diff_scale, its neighbour
    try:
        path = REPO / "bench" / "step_diff_scale.py"
        spec = importlib.util.spec_from_file_location("step_diff_scale", path)
        assert spec is not None and spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module  # dataclasses look their module up
        spec.loader.exec_module(module)
    finally:
        sys.path.remove(str(REPO / "bench"))
    return module


def _build(scale: ModuleType, root: Path, steps: int, *, other: bool = False) -> object:
    plan = scale.Plan(steps, steps - 3, other, other)
    scale.build_pair(root, plan, parallel=False)
    return plan


@pytest.mark.parametrize("other", [False, True], ids=["same-bytes", "other-stats-and-names"])
def test_diff_finds_the_planted_step(scale: ModuleType, tmp_path: Path, other: bool) -> None:
    plan = _build(scale, tmp_path, 12, other=other)
    code, out, err = cli_in_process("diff", str(tmp_path / "a"), str(tmp_path / "b"), "--json")
    assert code == 1, err
    import json

    result = json.loads(out)
    assert scale.check(result, plan) == []
    assert result["ranks"][0]["step_level"]["compared"] == 10
    assert len(scale.step_entries()) == 743


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads VmHWM in /proc")
def test_memory_does_not_grow_with_the_traces(
    scale: ModuleType, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """A pair five times as long (80 KiB a step) takes no more memory: opening a trace checks
    its overflow pages without keeping them mapped, and the walk releases the pages it read."""
    short, longer = tmp_path_factory.mktemp("short"), tmp_path_factory.mktemp("longer")
    _build(scale, short, 60)
    _build(scale, longer, 300)
    assert peak_kib(longer) < peak_kib(short) + 8 * 1024
