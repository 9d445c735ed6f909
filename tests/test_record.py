"""The recorder, as a user relies on it: real scripts recorded through ``opguard record`` (and
``opguard.record`` in code), read back with ``opguard.store``.

The two training scripts live in ``tests/scripts/record_*.py``; lines tagged ``# SITE:name``
there are the call sites the traces are checked against.

Subprocesses are mostly interpreter start-up and ``import torch``, so the recordings that
several tests share (the training runs, the ``opguard record`` cases) are started in the
background, several at a time, as soon as this module's tests start; the tests that record in
this process come first and run meanwhile.
"""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import msgpack
import numpy as np
import pytest
import torch
import warm
from conftest import opguard_cmd, run_cli

import opguard
import opguard.recorder.mode as recorder_mode
import opguard.recorder.ops as recorder_ops
from opguard import _C
from opguard.recorder.tensors import entry_recorder, fingerprint_fields
from opguard.store import OpRecord, RankTrace, Run, TraceError
from opguard.store import schema as store_schema
from opguard.store.meta import write_meta
from opguard.store.writer import TraceWriter

pytestmark = pytest.mark.slow  # long in all: started first (conftest.py)

SCRIPTS = Path(__file__).resolve().parent / "scripts"
TINY = SCRIPTS / "record_tiny_transformer.py"
GPT2 = SCRIPTS / "record_gpt2_tiny.py"
# One intra-op thread: several recordings run at once on small machines, and OpenMP threads
# spinning against each other only slow them down. Plain and recorded runs share the setting.
ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_VERBOSITY": "error", "OMP_NUM_THREADS": "1"}
PARALLEL = max(2, min(4, os.cpu_count() or 2))


# -- helpers ---------------------------------------------------------------------------------


def site_line(script: Path, name: str) -> int:
    """The line number tagged ``# SITE:name`` in ``script``."""
    tag = f"# SITE:{name}"
    lines = [
        n
        for n, text in enumerate(script.read_text().splitlines(), 1)
        if text.rstrip().endswith(tag)
    ]
    assert len(lines) == 1, f"{script.name}: expected one {tag!r} line, found {lines}"
    return lines[0]


def losses(stdout: str) -> list[str]:
    """The ``loss <float.hex>`` values a script printed, in order."""
    return [line.split()[1] for line in stdout.splitlines() if line.startswith("loss ")]


def one_line(text: str) -> str:
    """Output with any line wrapping undone."""
    return " ".join(text.split())


def open_trace(run_dir: Path) -> RankTrace:
    return Run(run_dir).rank(0)


def load_tiny() -> ModuleType:
    spec = importlib.util.spec_from_file_location("record_tiny_transformer", TINY)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def quiet(line: str) -> None:
    pass


def comparable(op: OpRecord) -> dict[str, Any]:
    """Everything of an op that two recordings of the same program must agree on."""
    return op.to_json()


def _find(ops: list[OpRecord], name: str, nth: int = 0) -> OpRecord:
    found = [op for op in ops if op.op == name]
    assert len(found) > nth, f"{name}: {[op.op for op in ops]}"
    return found[nth]


def _assert_usage_error(result: subprocess.CompletedProcess[str]) -> None:
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    lines = result.stderr.splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("opguard: error: "), lines[0]


def _write(path: Path, source: str) -> Path:
    path.write_text(textwrap.dedent(source))
    return path


def _listing(root: Path) -> list[Path]:
    return sorted(p.relative_to(root) for p in root.rglob("*"))


# -- shared subprocesses, started in the background ------------------------------------------


@dataclass
class Recorded:
    run_dirs: list[Path]
    recorded_stdout: list[str]
    plain_stdout: str

    def trace(self, k: int = 0) -> RankTrace:
        return open_trace(self.run_dirs[k])

    def ops(self, k: int = 0) -> list[OpRecord]:
        return list(self.trace(k).ops())


@dataclass
class CliCase:
    result: subprocess.CompletedProcess[str]
    cwd: Path
    before: list[Path]  # the files of cwd before the command ran


STEPS_SCRIPT = """
    import sys
    import torch

    torch.manual_seed(0)
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with open("progress.txt", "w") as progress:
        for i in range(5):
            loss = model(torch.randn(2, 4)).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            print("after step", i, file=progress, flush=True)
        print("loop done", file=progress, flush=True)
    sys.exit(4)
"""


EXITS_SCRIPT = """
    import json
    import sys
    import torch

    x = torch.ones(3) * 2
    print(json.dumps(sys.argv))
    sys.exit(int(sys.argv[1]))
"""


EXITS_ARGS = ["3", "--flag", "value with spaces", "-o", "x", "--"]


RAISES_SCRIPT = """
    import torch

    x = torch.ones(3) * 2
    raise ValueError("boom in the script")
"""


MODULE_SCRIPT = """
    import json
    import sys
    import torch

    x = torch.arange(4.0) + 1
    print(json.dumps([__name__, sys.argv[1:]]))
"""


def _record_exits(d: Path) -> list[str]:
    script = _write(d / "exits.py", EXITS_SCRIPT)
    return opguard_cmd("record", "-o", str(d / "run"), "--", str(script), *EXITS_ARGS)


def _record_raises(d: Path) -> list[str]:
    script = _write(d / "raises.py", RAISES_SCRIPT)
    return opguard_cmd("record", "-o", str(d / "run"), "--", str(script))


def _record_module(d: Path) -> list[str]:
    _write(d / "record_target_mod.py", MODULE_SCRIPT)
    return opguard_cmd("record", "-o", str(d / "run"), "-m", "record_target_mod", "a", "--b", "c")


def _record_module_console_script(d: Path) -> list[str]:
    _write(d / "record_target_mod.py", MODULE_SCRIPT)
    return [
        str(Path(sys.executable).parent / "opguard"),
        "record",
        "-o",
        str(d / "run"),
        "-m",
        "record_target_mod",
        "a",
    ]


def _bad_missing_script(d: Path) -> list[str]:
    return opguard_cmd("record", "-o", str(d / "run"), "--", str(d / "no_such_script.py"))


def _bad_no_script(d: Path) -> list[str]:
    return opguard_cmd("record", "-o", str(d / "run"))


def _bad_non_empty_dir(d: Path) -> list[str]:
    (d / "busy").mkdir()
    (d / "busy" / "notes.txt").write_text("mine\n")
    (d / "train.py").write_text("print('should not run')\n")
    return opguard_cmd("record", "-o", str(d / "busy"), "--", str(d / "train.py"))


def _bad_overwrite_foreign_dir(d: Path) -> list[str]:
    command = _bad_non_empty_dir(d)  # [..., "-o", DIR, "--", SCRIPT]
    return [*command[:-2], "--overwrite", *command[-2:]]


def _bad_output_is_file(d: Path) -> list[str]:
    (d / "out").write_text("a file\n")
    (d / "train.py").write_text("print('should not run')\n")
    return opguard_cmd("record", "-o", str(d / "out"), "--", str(d / "train.py"))


def _bad_zero_steps(d: Path) -> list[str]:
    (d / "train.py").write_text("print('should not run')\n")
    return opguard_cmd("record", "-o", str(d / "run"), "--steps", "0", "--", str(d / "train.py"))


CLI_CASES: dict[str, Callable[[Path], list[str]]] = {
    "exits": _record_exits,
    "raises": _record_raises,
    "module": _record_module,
    "module-console-script": _record_module_console_script,
    "bad-missing-script": _bad_missing_script,
    "bad-no-script": _bad_no_script,
    "bad-non-empty-dir": _bad_non_empty_dir,
    "bad-overwrite-foreign-dir": _bad_overwrite_foreign_dir,
    "bad-output-is-file": _bad_output_is_file,
    "bad-zero-steps": _bad_zero_steps,
}


BAD_RECORD_CASES = [name for name in CLI_CASES if name.startswith("bad-")]


TINY_ARGS = (str(TINY), "--steps", "3", "--dropout", "0.1")


def _training_commands(base: Path) -> dict[str, tuple[list[str], Path]]:
    """The tiny transformer (dropout on) recorded twice and run once unrecorded; the tiny GPT-2
    (dropout on) recorded once and run once unrecorded."""
    return {
        "gpt2": (opguard_cmd("record", "-o", str(base / "gpt2"), "--", str(GPT2), "2"), base),
        "gpt2-plain": ([sys.executable, str(GPT2), "2"], base),
        "tiny-a": (opguard_cmd("record", "-o", str(base / "tiny-a"), "--", *TINY_ARGS), base),
        "tiny-b": (opguard_cmd("record", "-o", str(base / "tiny-b"), "--", *TINY_ARGS), base),
        "tiny-plain": ([sys.executable, *TINY_ARGS], base),
    }


@dataclass
class Background:
    """Subprocess results being computed: ``group -> name -> future``."""

    futures: dict[str, dict[str, Future[subprocess.CompletedProcess[str]]]]
    dirs: dict[str, Path]
    before: dict[str, list[Path]]  # cli cases: the files of each case's directory beforehand

    def results(self, group: str) -> dict[str, subprocess.CompletedProcess[str]]:
        return {name: future.result() for name, future in self.futures[group].items()}


GROUP_FIXTURES = {"trainings": {"trainings", "tiny", "gpt2"}, "cli": {"cli"}}


@pytest.fixture(scope="module", autouse=True)
def background(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Background]:
    """Starts the shared subprocesses the selected tests of this module need."""
    wanted = {
        name
        for item in request.session.items
        if item.module is request.module
        for name in getattr(item, "fixturenames", ())
    }
    env = {**os.environ, **ENV}
    pool = ThreadPoolExecutor(PARALLEL)

    def start(argv: list[str], cwd: Path) -> Future[subprocess.CompletedProcess[str]]:
        return pool.submit(warm.run, argv, cwd=cwd, env=env, timeout=300)

    state = Background({}, {}, {})
    if wanted & GROUP_FIXTURES["trainings"]:
        base = state.dirs["trainings"] = tmp_path_factory.mktemp("trainings")
        state.futures["trainings"] = {
            name: start(argv, cwd) for name, (argv, cwd) in _training_commands(base).items()
        }
    if wanted & GROUP_FIXTURES["cli"]:
        base = state.dirs["cli"] = tmp_path_factory.mktemp("cli")
        state.futures["cli"] = {}
        for name, setup in CLI_CASES.items():
            cwd = base / name
            cwd.mkdir()
            argv = setup(cwd)
            state.before[name] = _listing(cwd)
            state.futures["cli"][name] = start(argv, cwd)
    try:
        yield state
    finally:
        pool.shutdown(wait=True)


@pytest.fixture(scope="module")
def trainings(background: Background) -> dict[str, Recorded]:
    results = background.results("trainings")
    for name, result in results.items():
        assert result.returncode == 0, f"{name}: {result.stderr}"
    base = background.dirs["trainings"]
    return {
        "tiny": Recorded(
            [base / "tiny-a", base / "tiny-b"],
            [results["tiny-a"].stdout, results["tiny-b"].stdout],
            results["tiny-plain"].stdout,
        ),
        "gpt2": Recorded([base / "gpt2"], [results["gpt2"].stdout], results["gpt2-plain"].stdout),
    }


@pytest.fixture(scope="module")
def tiny(trainings: dict[str, Recorded]) -> Recorded:
    return trainings["tiny"]


@pytest.fixture(scope="module")
def gpt2(trainings: dict[str, Recorded]) -> Recorded:
    return trainings["gpt2"]


@pytest.fixture(scope="module")
def cli(background: Background) -> dict[str, CliCase]:
    """Every `opguard record` case of CLI_CASES, each run in its own directory."""
    results = background.results("cli")
    base = background.dirs["cli"]
    return {
        name: CliCase(results[name], base / name, background.before[name]) for name in CLI_CASES
    }


def test_a_harness_running_the_command_line_is_no_part_of_the_recorded_stacks(
    tmp_path: Path,
) -> None:
    """A job runner that calls ``opguard.cli.main(["record", …])`` from its own Python code
    sits beneath every op of the program it records: each stack starts at the script, never
    at the harness (whose file would be taken for the script an op was reached from)."""
    harness = tmp_path / "harness.py"
    harness.write_text(
        textwrap.dedent(
            f"""\
            from opguard.cli import main

            def launch():
                main(["record", "-o", {str(tmp_path / "run")!r}, "--", {str(TINY)!r}])

            launch()
            """
        )
    )
    done = subprocess.run([sys.executable, str(harness)], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    with Run(tmp_path / "run") as run:
        trace = run.rank(0)
        outermost = {trace.stack(op.stack_id)[0].file for op in trace.ops() if op.stack_id}
    assert outermost == {str(TINY)}


# -- recording in code -----------------------------------------------------------------------


def test_record_in_code_with_optimizer(tmp_path: Path) -> None:
    tiny_module = load_tiny()
    plain = tiny_module.train(steps=2, dropout=0.1, report=quiet)
    with opguard.record(tmp_path / "run") as session:
        recorded = tiny_module.train(steps=2, dropout=0.1, report=quiet)
    assert recorded == plain
    assert session.failure is None
    run = Run(tmp_path / "run")
    trace = run.rank(0)
    assert run.status == "finished" and trace.finished
    assert run.meta["steps"] == 2
    assert {op.step for op in trace.ops()} == {0, 1}
    qkv = [
        op
        for op in trace.ops()
        if op.op == "aten::addmm.default" and op.outputs[0].shape == (16, 48)
    ]
    assert {(op.call_site.file, op.call_site.line) for op in qkv} == {
        (str(TINY), site_line(TINY, "qkv"))
    }


def test_step_cuts_steps_without_optimizer(tmp_path: Path) -> None:
    opguard.step()  # outside a recording: nothing to do
    with opguard.record(tmp_path / "run"):
        total = torch.zeros(())
        for i in range(3):
            total = total + torch.full((4,), float(i)).sum()
            opguard.step()
    trace = open_trace(tmp_path / "run")
    assert trace.info["end"]["steps"] == 3
    ops = list(trace.ops())
    assert {op.step for op in ops} == {0, 1, 2}
    assert not [op for op in ops if op.phase == "optimizer"]
    assert [op.op for op in ops if op.step == 1] == [op.op for op in ops if op.step == 2]


def test_steps_limit_in_code_stops_recording_not_training(tmp_path: Path) -> None:
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    done = 0
    with opguard.record(tmp_path / "run", steps=2):
        for _ in range(4):
            model(torch.ones(2, 4)).sum().backward()
            opt.step()
            done += 1
    assert done == 4
    run = Run(tmp_path / "run")
    assert run.status == "stopped"
    assert {op.step for op in run.rank(0).ops()} == {0, 1}


def test_nested_recording_is_refused(tmp_path: Path) -> None:
    with opguard.record(tmp_path / "outer"):
        with pytest.raises(RuntimeError, match="already active"):
            opguard.record(tmp_path / "inner").start()
        torch.ones(2) + 1
    assert len(open_trace(tmp_path / "outer")) > 0


# -- recorder failures never stop the training -----------------------------------------------


def _fail_on_call(
    monkeypatch: pytest.MonkeyPatch, owner: object, name: str, counted: Callable[..., bool]
) -> None:
    """Makes the third call of a function the native recorder calls back, among those
    ``counted`` picks by their arguments, raise, as a bug or a value it cannot read would."""
    real = getattr(owner, name)
    calls = []

    def failing(*args: Any) -> Any:
        if counted(*args):
            calls.append(name)
            if len(calls) == 3:
                raise RuntimeError("injected fingerprint failure")
        return real(*args)

    monkeypatch.setattr(owner, name, failing)


@pytest.mark.parametrize(
    ("owner", "name", "counted"),
    [
        # fails before the op runs: encoding a dtype, device or memory format argument, which
        # only the walk of an op's arguments does
        (
            recorder_ops,
            "encode",
            lambda value: isinstance(value, (torch.dtype, torch.device, torch.memory_format)),
        ),
        (TraceWriter, "append", lambda *args: True),  # after it, queueing its record
    ],
)
def test_recorder_failure_does_not_stop_training(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    owner: object,
    name: str,
    counted: Callable[..., bool],
) -> None:
    tiny_module = load_tiny()
    plain = tiny_module.train(steps=3, dropout=0.1, report=quiet)
    _fail_on_call(monkeypatch, owner, name, counted)
    with opguard.record(tmp_path / "run") as session:
        recorded = tiny_module.train(steps=3, dropout=0.1, report=quiet)
    monkeypatch.undo()
    assert recorded == plain  # the same bits, every step
    assert session.failure is not None

    run = Run(tmp_path / "run")
    trace = run.rank(0)
    failure = trace.failure
    assert failure is not None
    assert "injected fingerprint failure" in failure["error"]
    assert "RuntimeError" in failure["traceback"]
    at_op = failure["at_op"]
    assert at_op > 0
    assert f"opguard: recording stopped at op {at_op}" in capsys.readouterr().err
    # The trace is complete and readable up to the op where recording stopped.
    assert trace.finished
    assert [op.index for op in trace.ops()] == list(range(at_op))
    assert len(trace) == at_op
    assert max(op.step for op in trace.ops()) < 2  # later steps ran unrecorded
    assert run.meta["ops"] == at_op
    assert "injected fingerprint failure" in run.meta["recorder_failure"]

    shown = run_cli("show", str(tmp_path / "run"))
    assert shown.returncode == 0, shown.stderr
    assert f"recording stopped at op {at_op}" in one_line(shown.stdout)
    shown_json = run_cli("show", str(tmp_path / "run"), "--json")
    assert json.loads(shown_json.stdout)["ranks"][0]["recorder_failure"]["at_op"] == at_op


def test_the_writer_is_woken_as_each_backward_pass_starts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """GPU records are packed while a backward pass runs (the host then has time to spare),
    not during the forward pass: the recorder wakes the writer once per backward pass."""
    from opguard.store.writer import TraceWriter

    wakes: list[int] = []
    real_wake = TraceWriter.wake
    monkeypatch.setattr(TraceWriter, "wake", lambda self: (wakes.append(1), real_wake(self)))
    model = torch.nn.Linear(4, 2)
    with opguard.record(tmp_path / "run"):
        for _ in range(3):
            model(torch.ones(3, 4)).sum().backward()
            torch.ones(2) * 2  # a forward op between backward passes
            opguard.step()
    assert len(wakes) == 3


def test_deferred_records_are_stored_in_order_among_packed_ones(tmp_path: Path) -> None:
    """A GPU record reaches the writer unpacked (its fingerprints are still being computed)
    and is packed on the writer thread by the recorder's hook, in batches; records packed
    before they were appended (bytes, dicts) go in as they are. The trace holds every op, in
    order, whichever way it came."""
    from opguard.store.writer import TraceWriter, packb

    class Deferred:  # stands in for the recorder's OpRecord
        def __init__(self, record: dict[str, Any]) -> None:
            self.record = record

    batches: list[int] = []

    def pack_deferred(records: list[Deferred]) -> list[bytes]:
        batches.append(len(records))
        return [packb(r.record) for r in records]

    write_meta(tmp_path, {"schema": store_schema.SCHEMA_VERSION, "command": ["t"]})
    writer = TraceWriter(tmp_path / "rank-0", start_info={"rank": 0})
    writer.pack_deferred = pack_deferred
    name = writer.intern_name("aten::mul.Tensor")
    for index in range(9):
        record = {"i": index, "o": name, "s": index // 3, "x": [], "y": []}
        kind = index % 3
        writer.append(
            index, packb(record) if kind == 0 else record if kind == 1 else Deferred(record)
        )
    writer.close({"status": "finished"})
    with Run(tmp_path) as run:
        ops = list(run.rank(0).ops())
    assert [(op.index, op.step) for op in ops] == [(k, k // 3) for k in range(9)]
    assert sum(batches) == 3  # the deferred ones, and only they, went through the hook


def test_full_rings_get_gpu_records_packed_and_a_wake_gets_them_written(
    tmp_path: Path,
) -> None:
    """When the GPU result rings fill, the writer packs the records holding them (freeing the
    rings) but leaves the trace alone until it is woken, as a backward pass starts: a commit
    trades the GIL with the training thread once per record, which slows a forward pass on a
    slow host. Waking it writes everything packed so far."""
    from opguard.store.writer import packb

    packed = threading.Event()

    class Deferred:  # stands in for the recorder's OpRecord
        def __init__(self, record: dict[str, Any]) -> None:
            self.record = record

    def pack_deferred(records: list[Deferred]) -> list[bytes]:
        out = [packb(r.record) for r in records]
        packed.set()
        return out

    write_meta(tmp_path, {"schema": store_schema.SCHEMA_VERSION, "command": ["t"]})
    writer = TraceWriter(tmp_path / "rank-0", start_info={"rank": 0}, flush_interval=600)
    writer.pack_deferred = pack_deferred
    name = writer.intern_name("aten::mul.Tensor")
    for index in range(3):
        writer.append(index, Deferred({"i": index, "o": name, "s": 0, "x": [], "y": []}))
    writer.make_room()
    assert packed.wait(30)
    time.sleep(0.2)  # a write, if one were coming, would follow the packing at once
    assert writer.records_written == 0
    writer.wake()
    deadline = time.monotonic() + 30
    while writer.records_written < 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert writer.records_written == 3
    writer.close({"status": "finished"})
    with Run(tmp_path) as run:
        assert [op.index for op in run.rank(0).ops()] == [0, 1, 2]


# -- fingerprints: reuse, views, uninitialized memory ----------------------------------------


def test_native_entry_flags_are_the_schemas() -> None:
    """The native entry builder writes the flags the reader decodes."""

    native = (_C.FLAG_VIEW, _C.FLAG_UNINITIALIZED, _C.FLAG_UNREADABLE, _C.FLAG_WRITTEN)
    assert native == (
        store_schema.FLAG_VIEW,
        store_schema.FLAG_UNINITIALIZED,
        store_schema.FLAG_UNREADABLE,
        store_schema.FLAG_WRITTEN,
    )


def test_natively_packed_records_are_what_msgpack_writes(tmp_path: Path) -> None:
    """Records' entries are packed natively (csrc/msgpack_out.h). Each stored record must be
    exactly what msgpack-python packs for the values it decodes to: any other reader of the
    trace sees standard msgpack, with the smallest integer forms and float64 stats.
    The tensors cover every kind of entry field: stats with and without finite values, integers
    of each width, bool tensors, views, writes and producers; the ops every kind of record
    field: arguments of each type (floats, negative and wide integers, booleans, strings,
    lists, dtypes), a random generator's state and a returned value."""
    with opguard.record(tmp_path / "run"):
        x = torch.tensor([1.5, -2.0, float("nan"), float("inf")])
        big = torch.tensor([2**62, -(2**40), 7], dtype=torch.int64)
        flags = torch.tensor([True, False])
        (x * 2).t().add_(1)
        torch.full((3,), float("nan")).sum()
        (big + 1).view(3, 1).bool().logical_and(flags[0])
        torch.empty(5).fill_(0.25)
        torch.arange(70.0).reshape(2, 35).t().contiguous()  # sizes and strides of 35 to 70
        torch.clamp(x, min=-1.5, max=2**40)
        torch.sum(x, dim=[0], keepdim=True, dtype=torch.float64)
        torch.nn.functional.gelu(x, approximate="tanh")
        torch.full((2,), -(2**40)).add_(-3)
        torch.rand(3, generator=torch.Generator().manual_seed(3))
        x[1].item()
    with Run(tmp_path / "run") as run:
        records = [raw for chunk in run.rank(0).raw_chunks() for raw in chunk]
    assert len(records) > 8
    fields: set[str] = set()
    for raw in records:
        decoded = msgpack.unpackb(raw)
        assert msgpack.packb(decoded, use_bin_type=True) == raw, decoded
        fields.update(decoded)
    assert {"i", "o", "s", "p", "c", "k", "a", "r", "v", "x", "y"} <= fields


def test_inputs_carry_their_producer(tmp_path: Path) -> None:
    with opguard.record(tmp_path / "run"):
        x = torch.arange(6.0)
        y = x * 3
        z = y + y
        values, indices = torch.sort(z - torch.ones(6) * 20, descending=True)
        as_float = indices.float()
        y.add_(1)  # in place: y has a new producer from here on
        w = y * 2
        del values, as_float, w
    ops = list(open_trace(tmp_path / "run").ops())
    mul = _find(ops, "aten::mul.Tensor")
    add = _find(ops, "aten::add.Tensor")
    assert mul.inputs[0].producer == (_find(ops, "aten::arange.default").index, 0)
    assert [t.producer for t in add.inputs] == [(mul.index, 0), (mul.index, 0)]
    # The producer's output fingerprint is reused for the input.
    assert [t.hash for t in add.inputs] == [mul.outputs[0].hash] * 2

    sort = _find(ops, "aten::sort.default")
    to_float = _find(ops, "aten::_to_copy.default")
    assert to_float.inputs[0].producer == (sort.index, 1)  # the indices output
    assert to_float.inputs[0].hash == sort.outputs[1].hash

    add_ = _find(ops, "aten::add_.Tensor")
    assert add_.inputs[0].producer == (mul.index, 0)
    assert add_.outputs[0].flags & store_schema.FLAG_WRITTEN
    assert add_.outputs[0].hash != mul.outputs[0].hash
    last_mul = [op for op in ops if op.op == "aten::mul.Tensor"][-1]
    assert last_mul.index > add_.index
    assert last_mul.inputs[0].producer == (add_.index, 0)
    assert last_mul.inputs[0].hash == add_.outputs[0].hash


def test_parameters_moved_by_module_to_keep_their_producer(tmp_path: Path) -> None:
    """``module.to(...)`` swaps each parameter's memory (``param.data = copy``), leaving the
    parameter its own version counter: its readers, and the views C++ makes of it (F.linear's
    ``weight.t()``), name the copy as producer, so a difference in a parameter is followed to
    where it was made (every model moved to a GPU is)."""
    with opguard.record(tmp_path / "run"):
        torch.manual_seed(0)
        layer = torch.nn.Linear(4, 3).double()
        layer(torch.randn(2, 4, dtype=torch.float64)).sum()
        layer.weight.pow(2).sum()
    ops = list(open_trace(tmp_path / "run").ops())
    weight_copy, bias_copy = [op.index for op in ops if op.op == "aten::_to_copy.default"]
    addmm = _find(ops, "aten::addmm.default")
    pow_ = _find(ops, "aten::pow.Tensor_Scalar")
    bias, _, weight_t = addmm.inputs
    assert (bias.producer, weight_t.producer) == ((bias_copy, 0), (weight_copy, 0))
    assert pow_.inputs[0].producer == (weight_copy, 0)


def test_view_outputs_are_flagged_and_not_read(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    entries = entry_recorder()  # the recorder's, to count the tensors it reads
    monkeypatch.setattr(recorder_mode, "entry_recorder", lambda: entries)
    with opguard.record(tmp_path / "run"):
        z = torch.arange(6.0) * 3
        before = entries.reads
        v = z.view(2, 3)
        t = v.t()
        s = v[1]
        during_views = entries.reads - before
        total = t.sum(dim=1)
        del s, total
    monkeypatch.undo()
    assert during_views == 0  # no view op read tensor memory
    ops = list(open_trace(tmp_path / "run").ops())
    mul = _find(ops, "aten::mul.Tensor")
    view = _find(ops, "aten::view.default")
    transpose = _find(ops, "aten::t.default")
    select = _find(ops, "aten::select.int")
    for op in (view, transpose, select):
        (out,) = op.outputs
        assert out.is_view and not out.is_uninitialized
        assert out.fingerprint_text() == "view"
    assert view.inputs[0].producer == (mul.index, 0)
    assert transpose.inputs[0].producer == (view.index, 0)
    assert select.inputs[0].producer == (view.index, 0)
    total_op = _find(ops, "aten::sum.dim_IntList")
    assert total_op.inputs[0].producer == (transpose.index, 0)
    assert total_op.inputs[0].hash is not None


def _empty_program() -> None:
    e = torch.empty(64, 64)
    like = torch.empty_like(e)
    e.fill_(3.0)
    like.copy_(e)
    (e * 2 + like).sum()


def _record_with_garbage(run_dir: Path, seed: int) -> list[OpRecord]:
    # Leave different bytes in freed memory before each recording, for torch.empty to return
    # if the allocator hands the same block back.
    garbage = torch.rand(64 * 64 * 4, generator=torch.Generator().manual_seed(seed))
    del garbage
    with opguard.record(run_dir):
        _empty_program()
    return list(open_trace(run_dir).ops())


def test_uninitialized_memory_is_not_fingerprinted(tmp_path: Path) -> None:
    ops_a = _record_with_garbage(tmp_path / "a", seed=1)
    ops_b = _record_with_garbage(tmp_path / "b", seed=2)
    for name in ("aten::empty.memory_format", "aten::empty_like.default"):
        (out,) = _find(ops_a, name).outputs
        assert out.is_uninitialized and out.hash is None
        assert out.fingerprint_text() == "uninitialized"
    fill = _find(ops_a, "aten::fill_.Scalar")
    assert fill.inputs[0].is_uninitialized and fill.inputs[0].hash is None
    assert fill.outputs[0].hash is not None
    copy = _find(ops_a, "aten::copy_.default")
    assert copy.inputs[0].is_uninitialized  # `like`, written by copy_
    assert not copy.inputs[1].is_uninitialized  # `e`, filled
    assert [comparable(op) for op in ops_a] == [comparable(op) for op in ops_b]


def test_inputs_aliasing_uninitialized_memory_are_not_hashed(tmp_path: Path) -> None:
    """nn.Parameter(torch.empty(...)) is a new alias of the empty's output: an init op reading
    it (normal_, uniform_) reads no garbage."""
    with opguard.record(tmp_path / "run"):
        param = torch.nn.Parameter(torch.empty(32, 32))
        with torch.no_grad():
            param.normal_()
    ops = list(open_trace(tmp_path / "run").ops())
    empty = _find(ops, "aten::empty.memory_format")
    normal = _find(ops, "aten::normal_.default")
    assert normal.inputs[0].producer == (empty.index, 0)
    assert normal.inputs[0].is_uninitialized and normal.inputs[0].hash is None


def test_view_of_uninitialized_memory_is_still_a_view(tmp_path: Path) -> None:
    with opguard.record(tmp_path / "run"):
        e = torch.empty(4, 4)
        e.view(16)
    view = _find(list(open_trace(tmp_path / "run").ops()), "aten::view.default")
    (out,) = view.outputs
    assert out.is_uninitialized
    assert out.is_view


def test_data_assignment_gives_the_new_memorys_producer(tmp_path: Path) -> None:
    """``p.data = new`` (an EMA update, ``Module._apply``) swaps a tensor's memory without an op
    and without a version bump: later readers of ``p`` get the new memory's producer and
    fingerprint, not those of the memory it held before."""
    with opguard.record(tmp_path / "run"):
        average = torch.zeros(4).clone()  # an op's output: known by its Python object
        first = average * 1
        average.data = torch.arange(4.0) + 1
        second = average * 2
        del first, second
    ops = list(open_trace(tmp_path / "run").ops())
    clone, add = _find(ops, "aten::clone.default"), _find(ops, "aten::add.Tensor")
    before, after = (op.inputs[0] for op in ops if op.op == "aten::mul.Tensor")
    assert before.producer == (clone.index, 0)
    assert after.producer == (add.index, 0)
    assert after.hash == add.outputs[0].hash != before.hash


def test_no_stale_fingerprint_from_a_reused_address(tmp_path: Path) -> None:
    """A tensor made outside the dispatcher (from_numpy here; torch.tensor, optimizer state and
    DataLoader batches alike) at the address of a freed recorded tensor is read for what it
    holds, not given the dead tensor's producer and fingerprint."""
    n = 1 << 18  # 1 MiB blocks: malloc hands freed ones straight back
    seen: set[int] = set()
    reused = 0
    with opguard.record(tmp_path / "run"):
        for i in range(8):
            recorded = torch.ones(n)  # a recorded op's output, then freed
            seen.add(recorded.data_ptr())
            del recorded
            outside = np.full(n, float(i + 2), dtype=np.float32)  # written by numpy
            reused += outside.ctypes.data in seen
            seen.add(outside.ctypes.data)
            torch.from_numpy(outside).sum()
    if not reused:
        pytest.skip("the allocator never handed a freed block back")
    ops = list(open_trace(tmp_path / "run").ops())
    entered = [op.inputs[0] for op in ops if op.op == "aten::lift_fresh.default"]
    assert len(entered) == 8
    for i, tensor in enumerate(entered):
        truth = torch.full((n,), float(i + 2))
        assert tensor.hash == fingerprint_fields(truth)["h"], f"iteration {i}"
        assert tensor.producer is None, f"iteration {i}"


# -- `opguard record` and `opguard show`, one at a time --------------------------------------


def test_steps_limit_ends_the_run(
    write_script: Callable[[str, str], Path], record: Callable[..., Path], tmp_path: Path
) -> None:
    script = write_script("steps.py", STEPS_SCRIPT)
    run_dir = record(script, extra=("--steps", "2"))  # asserts exit status 0 (not 4)
    run = Run(run_dir)
    trace = run.rank(0)
    assert run.status == "stopped"
    assert run.meta["steps"] == 2
    assert "step limit 2" in run.meta["stopped"]
    assert trace.finished
    assert {op.step for op in trace.ops()} == {0, 1}
    assert {"forward", "backward", "optimizer"} <= {op.phase for op in trace.ops()}
    # The run ends inside the second optimizer.step(): nothing after it runs.
    assert (tmp_path / "progress.txt").read_text().splitlines() == ["after step 0"]


FOREVER_SCRIPT = """
    import sys
    import torch
    import opguard

    with opguard.record(sys.argv[1]):
        torch.manual_seed(0)
        model = torch.nn.Linear(8, 8)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        step = 0
        while True:
            loss = model(torch.randn(4, 8)).square().mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            if step == 20:
                print("ready", flush=True)
"""


def _last_committed_step(run_dir: Path) -> int:
    """The step of the last op a live recording has committed so far (-1: none yet)."""
    with Run(run_dir) as run:
        trace = run.rank(0)
        n = len(trace)
        return trace.op(n - 1).step if n else -1


def test_sigkill_leaves_a_readable_trace(
    write_script: Callable[[str, str], Path], tmp_path: Path
) -> None:
    script = write_script("forever.py", FOREVER_SCRIPT)
    run_dir = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, str(script), str(run_dir)],
        cwd=tmp_path,
        env={**os.environ, **ENV},
        text=True,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()
        assert line.strip() == "ready", proc.stderr.read() if proc.stderr else ""
        time.sleep(0.5)  # the writer commits a batch every 0.25 s
        # On a loaded machine the writer thread may lag: wait (reading the live trace, which
        # is safe) until the first 20 steps are on disk.
        deadline = time.monotonic() + 30
        while _last_committed_step(run_dir) < 20 and time.monotonic() < deadline:
            time.sleep(0.1)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGKILL

    run = Run(run_dir)
    assert run.status == "running"  # nobody wrote the end
    trace = run.rank(0)
    assert not trace.finished
    n = len(trace)
    assert n > 0
    ops = list(trace.ops())
    assert [op.index for op in ops] == list(range(n))
    assert trace.damage is None
    assert max(op.step for op in ops) >= 20

    shown = run_cli("show", str(run_dir))
    assert shown.returncode == 0, shown.stderr
    assert "did not finish" in one_line(shown.stdout)
    shown_json = run_cli("show", str(run_dir), "--json")
    assert shown_json.returncode == 0, shown_json.stderr
    assert json.loads(shown_json.stdout)["ranks"][0]["finished"] is False


@pytest.fixture
def small_run(tmp_path: Path) -> Path:
    """A real, tiny finished run, recorded in this process."""
    run_dir = tmp_path / "small-run"
    with opguard.record(run_dir):
        torch.ones(3) * 2
    return run_dir


def test_newer_schema_is_refused(small_run: Path) -> None:
    meta_path = small_run / store_schema.META_FILE
    meta = json.loads(meta_path.read_text())
    meta["schema"] = 999
    meta_path.write_text(json.dumps(meta))
    for extra in ((), ("--json",), ("--ops", "0:2")):
        result = run_cli("show", str(small_run), *extra)
        _assert_usage_error(result)
        assert "999" in result.stderr
    with pytest.raises(TraceError, match="999"):
        Run(small_run)


def test_overwrite_replaces_an_earlier_run(
    small_run: Path, write_script: Callable[[str, str], Path]
) -> None:
    script = write_script(
        "again.py",
        """
        import torch
        torch.arange(3.0).sum()
    """,
    )
    replaced = run_cli(
        "record", "-o", str(small_run), "--overwrite", "--", str(script), cwd=small_run.parent
    )
    assert replaced.returncode == 0, replaced.stderr
    ops = list(open_trace(small_run).ops())
    assert [op.op for op in ops] == ["aten::arange.default", "aten::sum.default"]


def _bad_show_not_a_trace(d: Path) -> str:
    (d / "plain").mkdir()
    (d / "plain" / "data.txt").write_text("x\n")
    return str(d / "plain")


def _bad_show_empty_dir(d: Path) -> str:
    (d / "empty").mkdir()
    return str(d / "empty")


def _bad_show_missing(d: Path) -> str:
    return str(d / "missing")


def _bad_show_file(d: Path) -> str:
    (d / "file.txt").write_text("x\n")
    return str(d / "file.txt")


def _bad_show_rank_without_lmdb(d: Path) -> str:
    with opguard.record(d / "run"):
        torch.ones(2) + 1
    shutil.rmtree(d / "run" / "rank-0")
    (d / "run" / "rank-0").mkdir()
    return str(d / "run")


@pytest.mark.parametrize(
    "setup",
    [
        _bad_show_not_a_trace,
        _bad_show_empty_dir,
        _bad_show_missing,
        _bad_show_file,
        _bad_show_rank_without_lmdb,
    ],
    ids=lambda f: f.__name__.removeprefix("_bad_show_"),
)
def test_bad_show_input_is_one_line_exit_2(setup: Callable[[Path], str], tmp_path: Path) -> None:
    path = setup(tmp_path)
    for extra in ((), ("--json",), ("--ops", "0:3")):
        _assert_usage_error(run_cli("show", path, *extra, cwd=tmp_path))


# -- a small transformer through `opguard record` --------------------------------------------


def test_tiny_transformer_recording_is_deterministic(tiny: Recorded) -> None:
    a, b = tiny.trace(0), tiny.trace(1)
    assert len(a) > 0
    assert len(a) == len(b)
    assert a.finished and b.finished
    ops_a, ops_b = tiny.ops(0), tiny.ops(1)
    assert [op.index for op in ops_a] == list(range(len(a)))
    # Same program, same seed: every op, argument, call site and fingerprint agrees.
    for op_a, op_b in zip(ops_a, ops_b, strict=True):
        assert comparable(op_a) == comparable(op_b), f"op {op_a.index} differs"


def test_tiny_transformer_steps(tiny: Recorded) -> None:
    run = Run(tiny.run_dirs[0])
    trace = run.rank(0)
    assert run.status == "finished"
    assert run.meta["steps"] == 3
    assert trace.info["end"]["steps"] == 3
    steps = [op.step for op in trace.ops()]
    assert set(steps) == {0, 1, 2}
    assert steps == sorted(steps)  # steps are contiguous in execution order


def test_tiny_transformer_phases_and_call_sites(tiny: Recorded) -> None:
    trace = tiny.trace()
    ops = tiny.ops()
    script = str(TINY)
    assert {"forward", "backward", "optimizer"} <= {op.phase for op in ops}

    # Every step runs forward, then backward, then the optimizer.
    for step in range(3):
        phases = [op.phase for op in ops if op.step == step and op.phase != "other"]
        assert phases.index("backward") > phases.index("forward")
        last_backward = len(phases) - 1 - phases[::-1].index("backward")
        assert set(phases[last_backward + 1 :]) == {"optimizer"}

    # Backward ops point at the forward op they differentiate and borrow its call site, which
    # is a line of the user's script.
    backward = [op for op in ops if op.phase == "backward"]
    linked = [op for op in backward if op.forward_index is not None]
    assert len(linked) > 0.8 * len(backward)
    for op in linked:
        forward = ops[op.forward_index]
        assert forward.phase == "forward", (op.index, forward.index)
        assert forward.index < op.index and forward.step == op.step
        assert op.call_site == forward.call_site
        assert op.call_site.file == script
    lines = {op.call_site.line for op in linked}
    for name in ("qkv", "scores", "proj", "mlp", "head", "loss", "embed"):
        assert site_line(TINY, name) in lines, name

    # Optimizer ops are all at the `opt.step()` line.
    optimizer = [op for op in ops if op.phase == "optimizer"]
    assert optimizer
    assert {(op.call_site.file, op.call_site.line, op.call_site.function) for op in optimizer} == {
        (script, site_line(TINY, "opt"), "train")
    }

    # The first Linear (qkv, weight 48x16): its matmul is at the line that calls the layer, in
    # the block's forward, under the lines that called the model and the block.
    qkv_line = site_line(TINY, "qkv")
    first_linear = [
        op
        for op in ops
        if op.phase == "forward"
        and op.op in ("aten::addmm.default", "aten::mm.default")
        and op.outputs[0].shape == (16, 48)
    ]
    assert len(first_linear) == 3  # one per step
    # One stack, interned once: every step's call reuses its id, which no other site's has.
    (qkv_stack,) = {op.stack_id for op in first_linear}
    assert all(op.stack_id != qkv_stack for op in ops if op.call_site.line != qkv_line)
    for op in first_linear:
        site = op.call_site
        assert (site.file, site.line, site.function) == (script, qkv_line, "forward")
        assert site.source_line() == "qkv = self.qkv(h)  # SITE:qkv"
        stack = trace.stack(op.stack_id)
        assert [s.line for s in stack[-3:]] == [
            site_line(TINY, "model"),
            site_line(TINY, "block"),
            qkv_line,
        ]
    # Its gradients (backward mm: grad input and grad weight, each step) are at the same line.
    first_indices = {op.index for op in first_linear}
    grads = [
        op for op in linked if op.forward_index in first_indices and op.op == "aten::mm.default"
    ]
    assert len(grads) == 6
    assert {op.call_site.line for op in grads} == {qkv_line}


def test_tiny_transformer_losses_are_unchanged_by_recording(tiny: Recorded) -> None:
    plain = losses(tiny.plain_stdout)
    assert len(plain) == 3
    assert losses(tiny.recorded_stdout[0]) == plain
    assert losses(tiny.recorded_stdout[1]) == plain


def test_tiny_transformer_show(tiny: Recorded) -> None:
    result = run_cli("show", str(tiny.run_dirs[0]), "--json")
    assert result.returncode == 0, result.stderr
    summary = json.loads(result.stdout)
    assert summary["run"]["status"] == "finished"
    (rank,) = summary["ranks"]
    assert rank["ops"] == len(tiny.trace())
    assert rank["steps"] == 3 and rank["finished"] is True
    listing = run_cli("show", str(tiny.run_dirs[0]), "--ops", "0:5", "--json")
    assert listing.returncode == 0, listing.stderr
    assert [op["index"] for op in json.loads(listing.stdout)["ranks"]["0"]] == list(range(5))


def test_module_initialisation_reads_no_garbage(tiny: Recorded) -> None:
    """Module initialisation (empty, then normal_/uniform_ on a Parameter aliasing it): two
    recordings of the transformer agree there, op for op."""
    ops_a, ops_b = tiny.ops(0), tiny.ops(1)
    init_a = [op.to_json() for op in ops_a if op.phase == "other" and op.step == 0]
    init_b = [op.to_json() for op in ops_b if op.phase == "other" and op.step == 0]
    assert init_a and init_a == init_b
    assert any(t.is_uninitialized for op in ops_a if op.phase == "other" for t in op.inputs)


def test_parameter_views_keep_their_producer_across_steps(tiny: Recorded) -> None:
    """F.linear passes addmm a fresh alias of weight.t() the recorder never saw as an object:
    it is still traced to the op that last wrote the weight (the optimizer, from step 1 on),
    not taken for a leaf."""
    ops = tiny.ops()
    for op in ops:
        if op.phase == "forward" and op.op == "aten::addmm.default":
            producers = [t.producer for t in op.inputs]
            assert None not in producers, (op.index, op.step, op.call_site.short())
            if op.step > 0:  # parameters were last written by the previous optimizer step
                assert any(ops[p[0]].phase == "optimizer" for p in producers if p is not None)


# -- Hugging Face GPT-2 ----------------------------------------------------------------------


def test_gpt2_records_two_steps(gpt2: Recorded) -> None:
    run = Run(gpt2.run_dirs[0])
    trace = run.rank(0)
    assert run.status == "finished" and trace.finished
    assert trace.failure is None
    assert run.meta["steps"] == 2
    assert {op.step for op in trace.ops()} == {0, 1}
    assert {"forward", "backward", "optimizer"} <= {op.phase for op in trace.ops()}


def test_gpt2_losses_are_unchanged_by_recording(gpt2: Recorded) -> None:
    plain = losses(gpt2.plain_stdout)
    assert len(plain) == 2
    assert losses(gpt2.recorded_stdout[0]) == plain


def test_gpt2_call_sites_are_in_transformers(gpt2: Recorded) -> None:
    import transformers

    library = os.path.realpath(os.path.dirname(transformers.__file__)) + os.sep
    trace = gpt2.trace()
    model_line = site_line(GPT2, "model")
    in_model = [
        op
        for op in trace.ops()
        if op.phase == "forward"
        and op.step == 0
        and any(s.file == str(GPT2) and s.line == model_line for s in trace.stack(op.stack_id))
    ]
    assert len(in_model) > 50
    # Library frames are user code: the innermost frame is in transformers, under a frame of
    # modeling_gpt2.py, under the script's `model(...)` line.
    outside = [op for op in in_model if not os.path.realpath(op.call_site.file).startswith(library)]
    assert not outside, [(op.op, op.call_site.short()) for op in outside[:5]]
    for op in in_model:
        assert any(s.file.endswith("modeling_gpt2.py") for s in trace.stack(op.stack_id))
    assert any(op.call_site.file.endswith("modeling_gpt2.py") for op in in_model)


# -- the `opguard record` command ------------------------------------------------------------


def test_exit_code_and_argv_are_passed_through(cli: dict[str, CliCase]) -> None:
    case = cli["exits"]
    assert case.result.returncode == 3, case.result.stderr
    assert json.loads(case.result.stdout) == [str(case.cwd / "exits.py"), *EXITS_ARGS]
    run = Run(case.cwd / "run")
    assert run.status == "failed"
    assert run.meta["exit_code"] == 3
    assert run.rank(0).finished and len(run.rank(0)) > 0


def test_script_exception_fails_the_run(cli: dict[str, CliCase]) -> None:
    case = cli["raises"]
    assert case.result.returncode == 1
    assert "ValueError: boom in the script" in case.result.stderr
    run = Run(case.cwd / "run")
    assert run.status == "failed"
    assert "boom in the script" in run.meta["error"]
    assert run.rank(0).finished and len(run.rank(0)) > 0


def test_module_target(cli: dict[str, CliCase]) -> None:
    case = cli["module"]
    assert case.result.returncode == 0, case.result.stderr
    assert json.loads(case.result.stdout) == ["__main__", ["a", "--b", "c"]]
    trace = open_trace(case.cwd / "run")
    assert trace.finished
    ops = list(trace.ops())
    assert [op.op for op in ops] == ["aten::arange.default", "aten::add.Tensor"]
    assert ops[0].call_site.file.endswith("record_target_mod.py")


def test_module_command_in_meta_replays(cli: dict[str, CliCase]) -> None:
    from opguard.cli import build_parser

    case = cli["module"]
    command = Run(case.cwd / "run").meta["command"]
    assert command[:2] == ["opguard", "record"]
    args = build_parser().parse_args(command[1:])
    assert args.module == "record_target_mod"
    assert [a for a in args.target if a != "--"] == ["a", "--b", "c"]


def test_module_target_with_console_script(cli: dict[str, CliCase]) -> None:
    case = cli["module-console-script"]
    assert case.result.returncode == 0, case.result.stderr
    assert json.loads(case.result.stdout) == ["__main__", ["a"]]


@pytest.mark.parametrize("case", BAD_RECORD_CASES)
def test_bad_record_input_is_one_line_exit_2(case: str, cli: dict[str, CliCase]) -> None:
    found = cli[case]
    _assert_usage_error(found.result)
    assert "should not run" not in found.result.stdout
    assert _listing(found.cwd) == found.before  # nothing the user had was touched


def test_refused_overwrite_names_the_flag(cli: dict[str, CliCase]) -> None:
    assert "--overwrite" in cli["bad-non-empty-dir"].result.stderr


def test_a_conjugated_view_is_not_taken_for_a_plain_one(tmp_path: Path) -> None:
    """``z.conj()`` is a view whose values differ from its bytes (torch applies the conjugate
    bit when reading): its fingerprint must differ from a plain view of the same memory, or the
    op that reads it would be blamed for a difference its input already had."""
    z = torch.tensor([1 + 2j, 3 - 4j])
    with opguard.record(tmp_path / "run"):
        torch.mul(z.conj(), 2)
        torch.mul(z[:], 2)
    ops = list(open_trace(tmp_path / "run").ops())
    conj = _find(ops, "aten::_conj.default")
    plain = _find(ops, "aten::slice.Tensor")
    # torch materialises the conjugated view before mul reads it
    reader = next(op for op in ops if op.inputs and op.inputs[0].producer == (conj.index, 0))
    assert reader.inputs[0].hash != plain.outputs[0].hash
    # read rather than derived: fingerprinted by its values, as the materialised copy is
    assert reader.inputs[0].hash == reader.outputs[0].hash


def test_tensors_without_readable_memory_are_recorded_and_recording_goes_on(
    tmp_path: Path,
) -> None:
    """Sparse, nested and meta tensors have no strided memory to read: their entries are
    flagged unreadable (no fingerprint), and recording continues past them (it used to stop at
    the first sparse tensor, whose data pointer torch refuses to give)."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # sparse invariants, nested tensors' prototype status
        with opguard.record(tmp_path / "run"):
            sparse = torch.sparse_coo_tensor(torch.tensor([[0, 2]]), torch.tensor([1.0, 2.0]), (3,))
            (sparse + sparse).to_dense()
            (torch.nested.nested_tensor([torch.ones(2), torch.ones(3)]) * 2).unbind()
            torch.empty(3, device="meta") + 1
            torch.ones(2) * 3  # recorded after them
    run = Run(tmp_path / "run")
    assert run.meta.get("recorder_failure") is None
    ops = list(run.rank(0).ops())
    unreadable = store_schema.FLAG_UNREADABLE
    for name in ("aten::add.Tensor", "aten::mul.Tensor"):
        op = _find(ops, name)
        assert op.outputs[0].hash is None and op.outputs[0].flags & unreadable, op.to_json()
    assert _find(ops, "aten::_to_dense.default").outputs[0].hash is not None
    assert ops[-1].op == "aten::mul.Tensor" and ops[-1].outputs[0].hash is not None
