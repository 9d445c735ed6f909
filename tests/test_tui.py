"""``opguard tui``: the debug cursor on its own, the row model on small written traces, and the
app driven headless (``run_test``) on the demo runs, plus snapshots of its main layouts.

The snapshots use a small pair of traces written here through tests/traces.py (no torch), so they are
the same on every machine; behaviour is checked on the real demo recording.
"""

from __future__ import annotations

import os
import struct
import subprocess
import sys
import time
import zlib
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from conftest import run_cli
from rich.console import Console
from traces import TraceBuilder, tensor

from opguard.analysis import diff_runs
from opguard.analysis.align.steps import StepIndex
from opguard.analysis.browse.rows import OpLine, Row, Side, Status
from opguard.analysis.browse.series import item_losses
from opguard.analysis.tolerant.rule import Tolerance
from opguard.store import (
    CallSite,
    KernelEntry,
    OpRecord,
    Run,
    TensorRecord,
    TraceError,
    schema,
)
from opguard.store.meta import write_meta
from opguard.tui.app import OpguardApp
from opguard.tui.cursor import DebugCursor, Position, Query, RowFilter, Target
from opguard.tui.detail import Selection, render
from opguard.tui.screens.help import HelpScreen
from opguard.tui.session import Session
from opguard.tui.widgets.agent_panel import AgentPanel
from opguard.tui.widgets.detail_pane import SETTLE_SECONDS, DetailPane
from opguard.tui.widgets.pictures import Bars
from opguard.tui.widgets.prompt import Prompt

SIZE = (150, 44)

# -- a fake row source for the cursor ---------------------------------------------------------


def _line(
    index: int,
    name: str = "aten::add.Tensor",
    depth: int = 1,
    file: str = "/w/t.py",
    line: int = 10,
) -> OpLine:
    return OpLine(index, name, CallSite(file, line, "f"), depth)


def _row(a: int | None, b: int | None, status: Status = Status.EQUAL, **kw: Any) -> Row:
    return Row(
        _line(a, **kw) if a is not None else None, _line(b, **kw) if b is not None else None, status
    )


@dataclass
class FakeSource:
    by_step: dict[int, list[Row]]
    equal_steps: set[int] = field(default_factory=set)  # what a diff said is equal throughout
    first: tuple[Side, int] | None = None
    reads: list[int] = field(default_factory=list)

    @property
    def steps(self) -> Sequence[int]:
        return sorted(self.by_step)

    def rows(self, step: int) -> Sequence[Row]:
        self.reads.append(step)
        return self.by_step[step]

    def step_of(self, side: Side, index: int) -> int | None:
        for step, rows in self.by_step.items():
            if any(op is not None and op.index == index for op in (r.side(side) for r in rows)):
                return step
        return None

    def may_differ(self, step: int) -> bool:
        return step not in self.equal_steps

    def first_divergence(self) -> tuple[Side, int] | None:
        return self.first


def _source() -> FakeSource:
    """Step 0: three equal ops (depths 1, 2, 2); step 1: equal, differing, only-B, only-A;
    step 2: equal throughout; step 3: one differing op in another file."""
    return FakeSource(
        {
            0: [_row(0, 0), _row(1, 1, depth=2), _row(2, 2, depth=2, name="aten::mm.default")],
            1: [
                _row(3, 3),
                _row(4, 4, Status.DIFFERING, name="aten::native_layer_norm.default", line=60),
                _row(None, 5, Status.ONLY_B),
                _row(5, None, Status.ONLY_A),
            ],
            2: [_row(6, 6), _row(7, 7)],
            3: [_row(8, 8, Status.DIFFERING, file="/w/other.py", line=7)],
        },
        equal_steps={2},
        first=(Side.A, 4),
    )


def test_cursor_walks_ops_across_steps() -> None:
    cursor = DebugCursor(_source())
    assert cursor.position == Position(0, 0)
    for _ in range(3):
        assert cursor.next_op()
    assert cursor.position == Position(1, 0)
    assert cursor.prev_op() and cursor.position == Position(0, 2)
    assert not DebugCursor(_source()).prev_op()
    cursor.move_to(Position(3, 0))
    assert not cursor.next_op()
    assert cursor.move_by(-5) and cursor.position == Position(3, 0)


def test_cursor_finds_differences_and_skips_steps_known_equal() -> None:
    source = _source()
    cursor = DebugCursor(source)
    statuses = []
    while cursor.move_to(cursor.find_difference()):
        statuses.append((cursor.position, cursor.row.status))
    assert statuses == [
        (Position(1, 1), Status.DIFFERING),
        (Position(1, 2), Status.ONLY_B),
        (Position(1, 3), Status.ONLY_A),
        (Position(3, 0), Status.DIFFERING),
    ]
    assert 2 not in source.reads  # the diff said step 2 is equal: never aligned
    assert cursor.move_to(cursor.find_difference(forward=False))
    assert cursor.position == Position(1, 3)


def test_cursor_jumps_and_goes_back() -> None:
    cursor = DebugCursor(_source())
    assert cursor.first_divergence() and cursor.position == Position(1, 1)
    assert cursor.goto(Side.B, 5) and cursor.row.status is Status.ONLY_B
    assert not cursor.goto(Side.A, 99)
    assert cursor.back() and cursor.position == Position(1, 1)
    assert cursor.back() and cursor.position == Position(0, 0)
    assert not cursor.back()


def test_cursor_steps_over_and_out_by_stack_depth() -> None:
    cursor = DebugCursor(_source())
    assert cursor.move_to(cursor.find_over())  # depth 1: the depth-2 ops are passed over
    assert cursor.position == Position(1, 0)
    cursor.move_to(Position(0, 1))
    assert cursor.move_to(cursor.find_out()) and cursor.position == Position(1, 0)
    assert cursor.find_out() is None  # nothing shallower than depth 1


def test_cursor_search_by_name_and_file_line() -> None:
    cursor = DebugCursor(_source())
    assert cursor.jump_to(cursor.find_match(Query.parse("LAYER_NORM")))
    assert cursor.position == Position(1, 1)
    cursor.move_to(Position(0, 0))
    assert cursor.jump_to(cursor.find_match(Query.parse("other.py:7")))
    assert cursor.position == Position(3, 0)
    assert cursor.find_match(Query.parse("t.py:60"), forward=False) == Position(1, 1)
    assert cursor.find_match(Query.parse("no_such_op")) is None


def test_cursor_filters() -> None:
    cursor = DebugCursor(_source())
    cursor.toggle_hide_equal()  # the cursor's row is hidden: it moves to one shown
    assert cursor.visible(0) == [] and cursor.position == Position(0, 0)
    assert cursor.next_op() and cursor.position == Position(1, 1)
    assert list(cursor.visible()) == [1, 2, 3]
    cursor.move_to(Position(1, 3))
    assert cursor.next_op() and cursor.position == Position(3, 0)
    cursor.toggle_hide_equal()
    cursor.toggle_this_file()
    assert cursor.filter.files == ("/w/other.py", "/w/other.py")
    assert not cursor.prev_op()
    assert cursor.goto(Side.A, 0)  # a jump to a hidden op drops the filter
    assert cursor.filter == RowFilter()


def test_cursor_steps_and_targets() -> None:
    cursor = DebugCursor(_source())
    assert cursor.next_step() and cursor.position == Position(1, 0)
    assert cursor.next_step(forward=False) and cursor.position == Position(0, 0)
    assert Target.parse("b12") == Target("B", 12)
    assert Target.parse("#7") == Target("A", 7)
    assert Target.parse("s 3") == Target("step", 3)
    assert Target.parse("step") is None
    assert Target("step", 3).apply(cursor) and cursor.position == Position(3, 0)
    assert DebugCursor(FakeSource({})).position is None


# -- small written traces --------------------------------------------------------------------

SOURCE = """import torch


class Net(torch.nn.Module):
    def forward(self, x):
        h = self.fc(x)
        h = torch.nn.functional.gelu(h)
        h = h * 1.0
        return self.norm(h)


def main():
    for x in data:
        loss = net(x).mean()
        print(loss.item())
        opt.step()
""".splitlines()


def _source_around(line: int) -> list[list[Any]]:
    return [[n, SOURCE[n - 1]] for n in range(max(1, line - 3), min(len(SOURCE), line + 3) + 1)]


def _tensor(slot: str, fingerprint: int, producer: int | None, values: tuple[float, ...]) -> dict:
    stats = [min(values), max(values), sum(values) / len(values), max(map(abs, values)), 0, 0]
    head = struct.pack(f"<{len(values)}f", *values)
    return tensor(slot, fingerprint, producer, shape=(4, 8), b=head, m=stats)


def write_run(path: Path, *, candidate: bool, finished: bool = True) -> None:
    """Three steps of a tiny model. The candidate passes another layer-norm eps (the first
    divergence, in step 0), inserts an equal ``* 1.0`` and lacks step 1's clone. Each op reads
    the previous op's output. Not ``finished``: as if the recorder were still writing (no end
    record yet, ``meta.json`` says running)."""
    run = TraceBuilder(path, meta=None if finished else {"status": "running"})
    train = str(path.parent / "train.py")
    keys = [(14, "main"), (15, "main"), (16, "main")]
    keys += [(6, "forward"), (7, "forward"), (8, "forward"), (9, "forward")]
    sites = {key: run.site(train, *key, _source_around(key[0])) for key in keys}
    stacks = {
        key: run.stack([sites[14, "main"]] if key[1] == "main" else [sites[14, "main"], sites[key]])
        for key in keys
    }
    fingerprint = 0
    for step in range(3):
        ops: list[tuple[str, tuple[int, str], int, dict[str, Any]]] = [
            ("aten::randn.default", (14, "main"), 0, {}),
            ("aten::addmm.default", (6, "forward"), 0, {}),
            ("aten::gelu.default", (7, "forward"), 0, {"approximate": "none"}),
            *([("aten::mul.Tensor", (8, "forward"), 0, {"other": 1.0})] if candidate else []),
            (
                "aten::native_layer_norm.default",
                (9, "forward"),
                0,
                {"eps": 1e-6 if candidate else 1e-5},
            ),
            *(
                [("aten::clone.default", (14, "main"), 0, {})]
                if step == 1 and not candidate
                else []
            ),
            ("aten::mean.default", (14, "main"), 0, {}),
            ("aten::_local_scalar_dense.default", (15, "main"), 0, {}),
            ("aten::_foreach_add_.Scalar", (16, "main"), 2, {"alpha": 0.1}),
        ]
        shift = 0  # added to every fingerprint from the divergence on
        for name, site, phase, args in ops:
            if candidate and "layer_norm" in name:
                shift = 7
            fields: dict[str, Any] = {"k": stacks[site]}
            if args:
                fields["a"] = [[k, v] for k, v in args.items()]
            inputs = []
            if run.index:
                inputs = [_tensor("self", fingerprint, run.index - 1, (0.5, -1.0, 2.0))]
            outputs = []
            if "local_scalar" in name:
                fields["v"] = 2.0 / (1 + step) + shift * 1e-7
            else:
                if name not in ("aten::mul.Tensor", "aten::clone.default"):  # copies: same data
                    fingerprint = zlib.crc32(f"{step}:{name}".encode()) + shift
                outputs = [_tensor("0", fingerprint, None, (0.25, 1.5 + shift * 1e-7, -3.0))]
            run.op(name, inputs, outputs, step=step, phase=phase, site=sites[site], **fields)
    run.close({"status": "finished", "steps": 3}, killed=not finished)


@pytest.fixture
def written(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, str]:
    """The written pair, opened by paths relative to the working directory (so screens show
    the same text on every machine)."""
    write_run(tmp_path / "runs" / "baseline", candidate=False)
    write_run(tmp_path / "runs" / "candidate", candidate=True)
    monkeypatch.chdir(tmp_path)
    return "runs/baseline", "runs/candidate"


def test_step_index_matches_a_full_read(tmp_path: Path) -> None:
    path = tmp_path / "run"
    lengths = {0: 5, 1: 5, 2: 1, 4: 9, 5: 5, 9: 2}  # irregular, with steps that have no ops
    with TraceBuilder(path) as trace:
        for step, count in lengths.items():
            for _ in range(count):
                trace.op("aten::add.Tensor", step=step)
    index = trace.index
    with Run(path) as run:
        steps = StepIndex(run.rank(0))
    assert [(r.step, r.stop - r.start) for r in steps.ranges] == list(lengths.items())
    assert steps.of(10).step == 2 and steps.of(11).step == 4 and steps.of(index) is None


def test_rows_and_loss_of_written_runs(written: tuple[str, str]) -> None:
    session = Session.open(*written)
    rows = session.rows(0)
    assert rows.steps == [0, 1, 2]
    statuses = [r.status for r in rows.rows(0)]
    assert statuses.count(Status.ONLY_B) == 1 and Status.DIFFERING in statuses
    assert any(
        r.status is Status.ONLY_A and r.a.name == "aten::clone.default" for r in rows.rows(1)
    )
    series = item_losses(session.trace(Side.B, 0))
    assert sorted(series) == [0, 1, 2] and series[1] == pytest.approx(1.0 + 7e-7)
    session.close()


def test_detail_shows_kernels_defaults_and_differing_values() -> None:
    site = CallSite("/w/train.py", 3, "main", ((3, "y = torch.mm(a, b)"),))
    kernel = KernelEntry.decode(
        {
            "k": "kernel",
            "n": "ampere_sgemm_128x64_nn",
            "g": [4, 1, 1],
            "b": [256, 1, 1],
            "s": 7,
            "t0": 1000,
            "t1": 4500,
        }
    )
    outputs = [  # B's output is longer and its second value differs
        (TensorRecord.decode(_tensor("0", 1, None, (0.5, 1.0, 2.0))),),
        (TensorRecord.decode(_tensor("0", 2, None, (0.5, 1.25, 2.0, 4.0))),),
    ]
    ops = [
        OpRecord(
            i,
            "aten::mm.default",
            0,
            "forward",
            site,
            -1,
            None,
            args,
            (),
            out,
            None,
            kernels=(kernel,) * i,
        )
        for i, args, out in ((1, (), outputs[0]), (2, (("out_dtype", "float32"),), outputs[1]))
    ]
    row = Row(_line(1), _line(2), Status.DIFFERING)
    text = _text(render(Selection(row, "", ops[0], ops[1], ([site], [site]), ())))
    assert "ampere_sgemm_128x64_nn" in text and "3.5" in text  # the kernel and its µs
    assert "default" in text and "'float32'" in text
    assert "≠ 0" in text and "0.5 1.25 2 4" in text and "0x3fa00000" in text
    assert "❱ 3" in text


def _text(renderable: Any) -> str:
    console = Console(width=120, record=True, file=open(os.devnull, "w"))  # noqa: SIM115
    console.print(renderable)
    return console.export_text()


def test_only_the_tui_command_loads_textual() -> None:
    """The CLI registers ``tui`` without importing Textual; readers and the diff never do."""
    code = (
        "import sys, opguard.cli, opguard.store, opguard.analysis, opguard.tui.session\n"
        "opguard.cli.build_parser()\n"
        "print(sorted(m for m in sys.modules if m.partition('.')[0] == 'textual'))"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0 and result.stdout.strip() == "[]", result.stderr


# -- bad input ---------------------------------------------------------------------------------


def test_unopenable_runs_are_one_line_and_exit_2(written: tuple[str, str], tmp_path: Path) -> None:
    broken = tmp_path / "broken"
    (broken / "rank-0").mkdir(parents=True)
    write_meta(broken, {"schema": schema.SCHEMA_VERSION})
    other_rank = tmp_path / "other-rank"
    (other_rank / "rank-3").mkdir(parents=True)
    write_meta(other_rank, {"schema": schema.SCHEMA_VERSION})
    for args, says in [
        ((str(tmp_path / "missing"), written[1]), "no such run directory"),
        ((written[0], str(broken)), "not a readable OpGuard trace"),
        ((written[0], str(other_rank)), "no rank recorded in both runs"),
    ]:
        result = run_cli("tui", *args, cwd=tmp_path)
        assert result.returncode == 2
        assert result.stderr.count("\n") == 1 and says in result.stderr, result.stderr
        assert "Traceback" not in result.stderr
    with pytest.raises(TraceError):
        Session.open(written[0], tmp_path / "missing")


async def test_runs_of_different_programs_get_a_notice(
    written: tuple[str, str], demo_runs: tuple[Path, Path]
) -> None:
    app = OpguardApp(Session.open(written[0], demo_runs[1]))
    notes: list[str] = []
    # Caught from the start: on an idle machine the diff's child process may finish before the
    # app's first frame; on a loaded one it may not have started when first waited for.
    app.notify = lambda message, **kw: notes.append(message)  # type: ignore[method-assign]
    async with app.run_test(size=SIZE) as pilot:
        await _settle_until(pilot, lambda: any("different programs" in note for note in notes))
        assert any("look like different programs" in note for note in notes), notes


async def test_an_unfinished_run_is_shown_in_the_header(tmp_path: Path) -> None:
    write_run(tmp_path / "a", candidate=False)
    write_run(tmp_path / "b", candidate=False, finished=False)
    app = OpguardApp(Session.open(tmp_path / "a", tmp_path / "b"))
    async with app.run_test(size=SIZE) as pilot:
        await _settle(pilot)
        header = str(app.query_one("#run-header").render())
        assert "IDENTICAL" in header and "unfinished" in header


async def test_a_run_that_could_not_be_read_to_its_end_is_not_identical(tmp_path: Path) -> None:
    """A damaged record in step 2 of run B: nothing differs before it, and the header says
    INCOMPLETE and why, never IDENTICAL (as ``opguard diff`` exits 3)."""
    import lmdb

    from opguard.store.schema import op_key

    write_run(tmp_path / "a", candidate=False)
    write_run(tmp_path / "b", candidate=False)
    env = lmdb.open(str(tmp_path / "b" / "rank-0"), max_dbs=16)
    with env.begin(write=True) as txn:
        ops = env.open_db(b"ops", txn=txn)
        last = max(int.from_bytes(k, "big") for k in txn.cursor(db=ops).iternext(values=False))
        txn.put(op_key(last - 1), b"\xc1", db=ops)
    env.close()
    app = OpguardApp(Session.open(tmp_path / "a", tmp_path / "b"))
    async with app.run_test(size=SIZE) as pilot:
        await _settle(pilot)
        header = str(app.query_one("#run-header").render())
        assert "INCOMPLETE" in header and "IDENTICAL" not in header, header
        assert "could not be read further" in header


# -- the app on the demo runs ------------------------------------------------------------------


async def _settle(pilot: Any) -> None:
    """Waits for background work, and for the detail panes (drawn once keys pause: on a
    loaded machine that may take more than the pause)."""
    await pilot.app.workers.wait_for_complete()
    await pilot.pause(SETTLE_SECONDS * 2)
    deadline = time.monotonic() + 10
    while not all(p.drawn for p in pilot.app.screen.query(DetailPane)):
        if time.monotonic() > deadline:
            break
        await pilot.pause(SETTLE_SECONDS)
    await pilot.app.workers.wait_for_complete()


async def _settle_until(pilot: Any, condition: Callable[[], bool], timeout: float = 60) -> None:
    """Settles until ``condition()`` holds or ``timeout`` seconds have passed."""
    deadline = time.monotonic() + timeout
    await _settle(pilot)
    while not condition() and time.monotonic() < deadline:
        await _settle(pilot)


async def _press(pilot: Any, *keys: str) -> None:
    await pilot.press(*keys)
    await _settle(pilot)


async def _ask(pilot: Any, key: str, answer: str) -> None:
    """Opens the prompt with ``key``, types the answer's first letters and fills in the rest."""
    await pilot.press(key, *answer[:2])
    pilot.app.query_one(Prompt).value = answer
    await _press(pilot, "enter")


@pytest.fixture(scope="module")
def demo_diff(demo_runs: tuple[Path, Path]) -> Any:
    with Run(demo_runs[0]) as a, Run(demo_runs[1]) as b:
        return diff_runs(a, b).first


async def test_opens_on_the_first_divergence_and_steps(
    demo_runs: tuple[Path, Path], demo_diff: Any
) -> None:
    app = OpguardApp(Session.open(*demo_runs))
    async with app.run_test(size=SIZE) as pilot:
        await _settle(pilot)
        first = demo_diff.observed_a.index
        assert app.cursor.row.a.index == first
        assert app.main.selection.mark == "first divergence"
        header = str(app.query_one("#run-header").render())
        assert "DIVERGED" in header and "eps" in header
        await _press(pilot, "j")
        assert app.cursor.row.a.index == first + 1
        await _press(pilot, "k")
        assert app.cursor.row.a.index == first
        await _press(pilot, "n")
        assert app.cursor.row.status is not Status.EQUAL and app.cursor.row.a.index > first
        await _press(pilot, "p")
        assert app.cursor.row.a.index == first
        await _press(pilot, "right_square_bracket")
        assert app.cursor.position.step == 1
        header = str(app.query_one("#run-header").render())
        assert "· step 1 (2 of 4)" in header  # the demo takes 4 steps
        await _press(pilot, *["right_square_bracket"] * 3)  # the ops after the last step
        assert app.cursor.position.step == 4
        header = str(app.query_one("#run-header").render())
        assert "· after the last step (4 steps)" in header
        await _press(pilot, "d")
        assert app.cursor.row.a.index == first


async def test_follows_a_producer_and_comes_back(
    demo_runs: tuple[Path, Path], demo_diff: Any
) -> None:
    app = OpguardApp(Session.open(*demo_runs))
    async with app.run_test(size=SIZE) as pilot:
        await _settle(pilot)
        first = app.cursor.row
        producer = app.main.selection.follow(1)
        await _press(pilot, "1")
        assert app.cursor.row.a.index == producer.index
        await _press(pilot, "b")
        assert app.cursor.row == first
        await _press(pilot, "f")
        assert app.cursor.row.a.index == app.main.selection.row.a.index < first.a.index
        await _press(pilot, "backspace")
        assert app.cursor.row == first


async def test_search_goto_filters_rank_and_panels(demo_runs: tuple[Path, Path]) -> None:
    app = OpguardApp(Session.open(*demo_runs))
    notes: list[str] = []
    async with app.run_test(size=SIZE) as pilot:
        await _settle(pilot)
        app.notify = lambda message, **kw: notes.append(message)  # type: ignore[method-assign]
        await _ask(pilot, "slash", "nll_loss_forward")
        assert "nll_loss_forward" in app.cursor.row.a.name
        found = app.cursor.position
        await _press(pilot, "full_stop")
        assert app.cursor.position.step > found.step and "nll_loss" in app.cursor.row.a.name
        await _ask(pilot, "slash", "train_refactored.py:93")
        assert app.cursor.row.b.site.line == 93
        await _ask(pilot, "g", "b100")
        assert app.cursor.row.b.index == 100
        await _press(pilot, "g", "s", "2", "enter")
        assert app.cursor.position == Position(2, 0)
        await _press(pilot, "r")
        assert "no other rank" in notes[-1]
        await _press(pilot, "e")
        shown = [app.cursor.source.rows(2)[i] for i in app.cursor.visible()]
        assert shown and all(row.status is not Status.EQUAL for row in shown)
        await _press(pilot, "e", "t")
        files = app.cursor.filter.files
        assert files is not None and any(f and f.endswith(".py") for f in files)
        assert all(
            app.cursor.filter.accepts(app.cursor.source.rows(2)[i]) for i in app.cursor.visible()
        )
        await _press(pilot, "t", "o")
        assert app.cursor.row is not None
        await _press(pilot, "a")
        assert app.query_one(AgentPanel).has_class("-open")
        selection, row = app.query_one(AgentPanel).selection, app.cursor.row
        assert (selection.op_a, selection.op_b) == (row.a and row.a.index, row.b and row.b.index)
        await _press(pilot, "question_mark")
        assert isinstance(app.screen, HelpScreen)
        await _press(pilot, "escape")
        assert not isinstance(app.screen, HelpScreen)


ABSORBED = 7  # differences the view pair's readers absorb, before its first divergence


def _view_pair(root: Path) -> tuple[Path, Path]:
    """Two runs: ABSORBED adds whose differing outputs a mul reads and makes equal again
    (absorbed), then an add that differs (the first divergence), ``t`` of it (a view: its
    fingerprint derived from its base's, no value read) and an ``mm`` reading that view."""
    paths = []
    for name, shift in (("a", 0), ("b", 1)):
        with TraceBuilder(root / name) as run:
            run.op("aten::randn.default", [], [_tensor("0", 1, None, (0.5, -1.0, 2.0))])
            for k in range(ABSORBED):
                made = 100 + 2 * k + shift
                at = run.op("aten::add.Tensor", [tensor("self", 1, 0)], [tensor("0", made)])
                run.op("aten::mul.Tensor", [tensor("self", made, at)], [tensor("0", 500 + k)])
            base = (1.5, 0.25, 3.0 + shift)
            added = run.op(
                "aten::add.Tensor",
                [_tensor("self", 1, 0, (0.5, -1.0, 2.0))],
                [_tensor("0", 10 + shift, None, base)],
            )
            view = tensor("0", 20 + shift, shape=(8, 4), f=schema.FLAG_VIEW)
            viewed = run.op("aten::t.default", [_tensor("self", 10 + shift, added, base)], [view])
            run.op(
                "aten::mm.default",
                [{**view, "n": "self", "p": [viewed, 0]}],
                [_tensor("0", 30 + shift, None, (7.0, 8.0, 9.0 + shift))],
            )
        paths.append(root / name)
    return paths[0], paths[1]


def _row_named(rows: Any, name: str) -> Row:
    return next(r for r in rows.rows(0) if r.a is not None and r.a.name == name)


def test_a_view_of_differing_data_is_not_equal_and_shows_its_bases_values(
    tmp_path: Path,
) -> None:
    """A view's data is its base's: in the list it reads "view ≠" where its base differs
    (not "equal", nor a difference of its own the next-difference key stops at), and as an
    input it shows its fingerprint and its base's values (not "fp view" and nothing)."""
    session = Session.open(*_view_pair(tmp_path))
    rows = session.rows(0)
    viewing = _row_named(rows, "aten::t.default")
    assert viewing.status is Status.VIEW and not viewing.status.differs
    reading = _row_named(rows, "aten::mm.default")
    traces = (session.trace(Side.A, 0), session.trace(Side.B, 0))
    text = _text(render(Selection.load(reading, traces)))
    session.close()
    assert "fp view" not in text, text
    assert "fp 0000000000000014 (view of A #" in text and "aten::add.Tensor output 0" in text, text
    assert "1.5 0.25 3 " in text and "1.5 0.25 4 " in text, text  # each run's base


async def test_absorbed_differences_are_one_toast(tmp_path: Path) -> None:
    """Each absorbed difference is a note of the diff; the debugger marks them in the list
    and says it once, instead of a pile of toasts over the detail pane."""
    app = OpguardApp(Session.open(*_view_pair(tmp_path)))
    notes: list[str] = []
    app.notify = lambda message, **kw: notes.append(message)  # type: ignore[method-assign]
    async with app.run_test(size=SIZE) as pilot:
        await _settle_until(pilot, lambda: bool(app.main._diffs))
    absorbed = [note for note in notes if "absorbed" in note]
    assert len(absorbed) == 1 and f"{ABSORBED} difference(s)" in absorbed[0], notes


@pytest.fixture(scope="module")
def rounding_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A pair that differs by rounding alone (fp32 against bf16 autocast, tests/tolerant_runs.py):
    every op's outputs differ, their step-level records too."""
    from tolerant_runs import record_runs

    runs = record_runs(tmp_path_factory.mktemp("rounding"), ["fp32", "bf16"])
    return runs["fp32"], runs["bf16"]


async def test_tolerant_within_rounding_says_so_and_opens_on_the_first_difference(
    rounding_runs: tuple[Path, Path],
) -> None:
    """``opguard tui A B --tolerant`` on runs within rounding: the header says so, as ``diff
    --tolerant`` and the drift line do (the step-level records differ by rounding too: not a
    divergence); the list opens on the first op whose outputs differ and ``d`` comes back to
    it; the drift line and both loss lines are all on screen."""
    app = OpguardApp(Session.open(*rounding_runs, Tolerance()))
    notes: list[str] = []
    app.notify = lambda message, **kw: notes.append(message)  # type: ignore[method-assign]
    async with app.run_test(size=SIZE) as pilot:
        await _settle_until(pilot, lambda: bool(app.main._diffs))
        header = str(app.query_one("#run-header").render())
        assert "WITHIN-ROUNDING" in header and "DIVERGED" not in header, header
        assert "explained by rounding" in header, header
        first = app.cursor.position
        assert app.cursor.row.status is Status.DIFFERING, app.cursor.row
        await _press(pilot, "right_square_bracket")
        assert app.cursor.position != first
        await _press(pilot, "d")
        assert app.cursor.position == first
        assert "within rounding" in notes[-1], notes
        await _settle_until(pilot, lambda: bool(app.query_one("#loss-b", Bars).values))
        for bars in app.query(Bars):
            region = bars.region
            assert bars.display and app.screen.get_widget_at(region.x, region.y)[0] is bars, bars


# -- snapshots ---------------------------------------------------------------------------------


def _app(written: tuple[str, str]) -> OpguardApp:
    return OpguardApp(Session.open(*written))


def test_snapshot_first_divergence(written: tuple[str, str], snap_compare: Any) -> None:
    assert snap_compare(_app(written), terminal_size=SIZE, run_before=_settle)


def test_snapshot_filtered_with_agent_panel(written: tuple[str, str], snap_compare: Any) -> None:
    async def run_before(pilot: Any) -> None:
        await _settle(pilot)
        await _press(pilot, "e", "n", "a")
        # "equal ops hidden" shows for a few seconds: on a loaded machine settling outlasts it
        pilot.app.clear_notifications()
        await pilot.pause()

    assert snap_compare(_app(written), terminal_size=SIZE, run_before=run_before)


def test_snapshot_help(written: tuple[str, str], snap_compare: Any) -> None:
    async def run_before(pilot: Any) -> None:
        await _settle(pilot)
        await _press(pilot, "question_mark")

    assert snap_compare(_app(written), terminal_size=SIZE, run_before=run_before)
