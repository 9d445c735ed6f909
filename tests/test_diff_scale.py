"""The synthetic GPT-2-like traces of bench/diff_scale.py, small: the diff must find what the
builder planted (an argument change near the end, logging ops inserted in run B). A correctness
test of the builder and of the diff's fast reading path; the timing is the bench's business."""

from __future__ import annotations

import importlib.util
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from types import ModuleType

import lmdb
import msgpack
import pytest
from conftest import REPO, run_cli

from opguard.store.schema import op_key


@pytest.fixture(scope="module")
def scale() -> ModuleType:
    spec = importlib.util.spec_from_file_location("diff_scale", REPO / "bench" / "diff_scale.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def pair(scale: ModuleType, tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, object]:
    root = tmp_path_factory.mktemp("scale")
    plan, _, reused = scale.build_pair(root, 20_000, insert_every=3_000, parallel=False)
    assert not reused
    return root, plan


def diff(root: Path, *extra: str, b: Path | None = None) -> tuple[int, dict]:
    result = run_cli("diff", str(root / "a"), str(b or root / "b"), "--json", *extra)
    assert result.returncode in (0, 1, 3), result.stderr
    return result.returncode, json.loads(result.stdout)


# ``opguard diff ARGS`` run in a child, which prints its peak resident memory in KiB (VmHWM,
# the high-water mark of its own memory) on stderr's last line. Not the child's ``ru_maxrss``:
# on Linux that starts from the parent's resident memory at the spawn (here, a test run).
_PEAK = """
import sys
from opguard.cli import main
try:
    main(sys.argv[1:])
    code = 0
except SystemExit as exit_:
    code = exit_.code
with open("/proc/self/status") as status:
    print(next(line.split()[1] for line in status if line.startswith("VmHWM:")), file=sys.stderr)
sys.exit(code)
"""


def peak_kib(root: Path) -> int:
    """Peak resident memory of ``opguard diff root/a root/b --json``, which must find the
    planted divergence."""
    result = subprocess.run(
        [sys.executable, "-c", _PEAK, "diff", str(root / "a"), str(root / "b"), "--json"],
        cwd=tempfile.gettempdir(),  # never the repository root (see conftest.run_cli)
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 1 and json.loads(result.stdout)["verdict"] == "diverged", (
        result.stderr
    )
    return int(result.stderr.split()[-1])


def test_plan(scale: ModuleType, pair: tuple[Path, object]) -> None:
    _, plan = pair
    assert plan.steps >= 8 and plan.inserted == (plan.ops_a - 1) // 3_000 >= 5
    assert plan.ops_a - plan.step_ops <= plan.diverge_at < plan.ops_a  # in the last step
    assert plan.inserted_b() == [plan.b_index(k * 3_000) - 1 for k in range(1, plan.inserted + 1)]


def test_diff_finds_what_was_planted(scale: ModuleType, pair: tuple[Path, object]) -> None:
    root, plan = pair
    code, result = diff(root)
    assert code == 1
    assert scale.check(result, plan) == []
    first = result["first_divergence"]
    assert first["cause"] == "argument"
    assert first["arguments_differ"][0]["a"] == "tanh"
    assert first["arguments_differ"][0]["b"] == "none"
    assert first["a"]["call_site"]["file"].endswith("model.py")
    rank = result["ranks"][0]
    assert rank["steps_a"] == rank["steps_b"] == plan.steps
    steps = rank["steps"]
    assert sum(s["unaligned_b"] for s in steps) == plan.inserted
    assert [s["step"] for s in steps if s["differing"]] == [plan.steps - 1]


def test_one_step(pair: tuple[Path, object]) -> None:
    root, plan = pair
    code, result = diff(root, "--step", "0")  # no logging op yet, nothing changed
    assert (code, result["verdict"], result["unaligned_b"]) == (0, "identical", 0)
    assert result["aligned"] == plan.step_ops
    code, result = diff(root, "--step", str(plan.steps - 1))
    assert code == 1
    assert result["first_divergence"]["a"]["index"] == plan.diverge_at


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads VmHWM in /proc")
def test_memory_does_not_grow_with_the_traces(
    scale: ModuleType, pair: tuple[Path, object], tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Diffing a pair five times as long takes no more memory: a trace's pages are checked a
    window at a time when it is opened, and released as the diff reads on (the whole file
    mapped at once once made a diff of 1M ops per side hold 530 MiB)."""
    root, _ = pair
    longer = tmp_path_factory.mktemp("scale-longer")
    scale.build_pair(longer, 100_000, insert_every=3_000, parallel=False)
    assert peak_kib(longer) < peak_kib(root) + 8 * 1024


def test_built_traces_are_reused(scale: ModuleType, pair: tuple[Path, object]) -> None:
    root, plan = pair
    again, seconds, reused = scale.build_pair(root, 20_000, insert_every=3_000, parallel=False)
    assert reused and again == plan and seconds == 0.0


def test_odd_and_damaged_records(pair: tuple[Path, object], tmp_path: Path) -> None:
    """Records the native scanner leaves to Python compare as before; a damaged record ends
    the reading of its trace, and is noted only when the diff reads that far."""
    root, plan = pair
    b = tmp_path / "b"
    shutil.copytree(root / "b", b)
    env = lmdb.open(str(b / "rank-0"), max_dbs=8)
    ops = env.open_db(b"ops")
    with env.begin(write=True) as txn:
        odd = op_key(plan.b_index(plan.step_ops + 10))  # step 1: shapes as floats
        raw = msgpack.unpackb(txn.get(odd, db=ops), raw=False)
        for y in raw["y"]:
            y["s"] = [float(n) for n in y["s"]]
        txn.put(odd, msgpack.packb(raw, use_bin_type=True), db=ops)
        txn.put(op_key(plan.b_index(3 * plan.step_ops + 5)), b"\xc1", db=ops)  # step 3
    env.close()
    code, result = diff(root, b=b)
    # Nothing differed before the damage: not a verdict of equality (exit 3), and what was
    # compared is said.
    assert (code, result["verdict"], result["ranks"][0]["differing"]) == (3, "incomplete", 0)
    assert [s["step"] for s in result["ranks"][0]["steps"]] == [0, 1, 2, 3]
    assert any("run B: reading stopped at a damaged record" in n for n in result["notes"])
    assert [(u["rank"], u["run"]) for u in result["unread"]] == [(0, "b")]
    assert result["scope"].startswith("over steps 0-3: run B could not be read further")
    code, result = diff(root, "--step", "1", b=b)
    assert (code, result["aligned"], result["notes"]) == (0, plan.step_ops, [])


def test_python_reading_gives_the_same_diff(
    pair: tuple[Path, object], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Without the native scanner (an extension built before it) every record is decoded in
    Python: the diff must come out the same."""
    from opguard.analysis import diff_runs
    from opguard.analysis.contract import to_json
    from opguard.store import Run, light

    root, _ = pair

    def diffed() -> dict:
        with Run(root / "a") as a, Run(root / "b") as b:
            return to_json(diff_runs(a, b))

    native = diffed()
    monkeypatch.setattr(light, "_NativeScanner", None)
    assert diffed() == native
