"""Bad input never meets a traceback: every ``opguard`` command, given wrong arguments and every
kind of path that is not a healthy trace, answers with one line on stderr and exit status 2, or
(for a trace it can still read: damaged past its start, still being written, of another
program) with its usual output and a note.

The cases run in one child process (tests/cli_driver.py), so that a reader dying of a signal
(as LMDB made it on a truncated file) fails the test instead of the test run, and names the
case. Property-based tests (hypothesis) check the decoding of stored records.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import lmdb
import msgpack
import numpy as np
import pytest
import torch
from conftest import run_cli
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import opguard
from opguard.analysis.align.keys import KeyTable, OpKeys
from opguard.store import RankTrace, Run, TraceWriter, schema
from opguard.store.errors import DamagedRecord
from opguard.store.light import LightReader, check_light
from opguard.store.reader import _unpack, mapped_spans

DRIVER = Path(__file__).resolve().parent / "cli_driver.py"


def _train(run_dir: Path, lr: float = 0.1, steps: int = 2) -> Path:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    with opguard.record(run_dir):
        for _ in range(steps):
            loss = torch.nn.functional.mse_loss(model(torch.ones(3, 4)), torch.zeros(3, 2))
            opt.zero_grad()
            loss.backward()
            opt.step()
            loss.item()
    return run_dir


def _other_program(run_dir: Path) -> Path:
    with opguard.record(run_dir):
        torch.arange(10.0).cumsum(0).flip(0).max()
    return run_dir


def _data(run: Path) -> Path:
    return run / "rank-0" / "data.mdb"


@pytest.fixture(scope="module")
def traces(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("bad-input")
    return {
        "good": _train(root / "good"),
        "good-again": _train(root / "good-again"),
        "other-lr": _train(root / "other-lr", lr=0.2),
        "other": _other_program(root / "other"),
    }


# -- paths that are not healthy traces ---------------------------------------------------------
#
# Each builder makes one path in ``d`` from the good run ``g`` and returns it. "error": every
# command must refuse it (exit 2, one line); "readable": a command may also read what it can.


def _copy(g: Path, d: Path, name: str = "copy") -> Path:
    shutil.copytree(g, d / name)
    return d / name


def _truncated(size: Callable[[int], int]) -> Callable[[Path, Path], Path]:
    def build(g: Path, d: Path) -> Path:
        run = _copy(g, d)
        full = _data(run).stat().st_size
        with open(_data(run), "r+b") as f:
            f.truncate(size(full))
        return run

    return build


def _flipped(seed: int, flips: int) -> Callable[[Path, Path], Path]:
    def build(g: Path, d: Path) -> Path:
        run = _copy(g, d)
        data = bytearray(_data(run).read_bytes())
        rng = random.Random(seed)
        for _ in range(flips):
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
        _data(run).write_bytes(bytes(data))
        return run

    return build


def _value_past_its_page(g: Path, d: Path) -> Path:
    """The good run with op 5's record claiming 64 KiB more than its leaf page holds: the high
    half of the size in its node header set (in every copy of the node in the file, the stale
    ones of earlier commits included)."""
    run = _copy(g, d)
    data = bytearray(_data(run).read_bytes())
    # A plain node: data size (lo, hi), flags 0, key size 8, then the key.
    header = struct.pack("<HH", 0, 8) + schema.op_key(5)
    at = data.find(header)
    assert at > 0
    while at > 0:
        data[at - 2] |= 1  # the low byte of hi
        at = data.find(header, at + 1)
    _data(run).write_bytes(bytes(data))
    return run


def _meta_edited(edit: Callable[[dict[str, Any]], object]) -> Callable[[Path, Path], Path]:
    def build(g: Path, d: Path) -> Path:
        run = _copy(g, d)
        meta = json.loads((run / schema.META_FILE).read_text())
        edit(meta)
        (run / schema.META_FILE).write_text(json.dumps(meta))
        return run

    return build


def _meta_text(text: str) -> Callable[[Path, Path], Path]:
    def build(g: Path, d: Path) -> Path:
        run = _copy(g, d)
        (run / schema.META_FILE).write_text(text)
        return run

    return build


def _lmdb_edited(edit: Callable[[lmdb.Environment], None]) -> Callable[[Path, Path], Path]:
    """The good run with its LMDB changed through LMDB itself (a structurally sound file)."""

    def build(g: Path, d: Path) -> Path:
        run = _copy(g, d)
        env = lmdb.open(str(run / "rank-0"), max_dbs=len(schema.DB_NAMES))
        try:
            edit(env)
        finally:
            env.close()
        return run

    return build


def _put(db: str, key: bytes, value: bytes) -> Callable[[lmdb.Environment], None]:
    def edit(env: lmdb.Environment) -> None:
        with env.begin(write=True) as txn:
            txn.put(key, value, db=env.open_db(db.encode(), txn=txn))

    return edit


def _drop(db: str) -> Callable[[lmdb.Environment], None]:
    def edit(env: lmdb.Environment) -> None:
        with env.begin(write=True) as txn:
            txn.drop(env.open_db(db.encode(), txn=txn), delete=True)

    return edit


def _missing(g: Path, d: Path) -> Path:
    return d / "missing"


def _file(g: Path, d: Path) -> Path:
    (d / "file.txt").write_text("not a run\n")
    return d / "file.txt"


def _empty_dir(g: Path, d: Path) -> Path:
    (d / "empty").mkdir()
    return d / "empty"


def _meta_is_a_directory(g: Path, d: Path) -> Path:
    run = _copy(g, d)
    (run / schema.META_FILE).unlink()
    (run / schema.META_FILE).mkdir()
    return run


def _no_meta(g: Path, d: Path) -> Path:
    run = _copy(g, d)
    (run / schema.META_FILE).unlink()
    return run


def _data_is_a_directory(g: Path, d: Path) -> Path:
    run = _copy(g, d)
    _data(run).unlink()
    _data(run).mkdir()
    return run


def _rank_is_a_file(g: Path, d: Path) -> Path:
    run = _copy(g, d)
    shutil.rmtree(run / "rank-0")
    (run / "rank-0").write_text("x")
    return run


def _random_bytes(g: Path, d: Path) -> Path:
    run = _copy(g, d)
    _data(run).write_bytes(random.Random(3).randbytes(_data(run).stat().st_size))
    return run


def _foreign_lmdb(g: Path, d: Path) -> Path:
    """A run directory whose rank holds an LMDB of something else."""
    run = d / "foreign"
    run.mkdir()
    shutil.copy(g / schema.META_FILE, run / schema.META_FILE)
    env = lmdb.open(str(run / "rank-0"), max_dbs=2)
    with env.begin(write=True) as txn:
        txn.put(b"user", b"alice", db=env.open_db(b"accounts", txn=txn))
    env.close()
    return run


def _plain_lmdb(g: Path, d: Path) -> Path:
    """An LMDB environment given where a run directory is expected."""
    env = lmdb.open(str(d / "plain-lmdb"))
    with env.begin(write=True) as txn:
        txn.put(b"k", b"v")
    env.close()
    return d / "plain-lmdb"


def _no_ranks(g: Path, d: Path) -> Path:
    run = _copy(g, d)
    shutil.rmtree(run / "rank-0")
    return run


def _live(g: Path, d: Path) -> Path:
    """A trace still being written: half of the good run's ops, its writer open, no end."""
    run = d / "live"
    run.mkdir()
    meta = json.loads((g / schema.META_FILE).read_text())
    meta = {k: v for k, v in meta.items() if k in ("schema", "command", "argv", "devices")}
    (run / schema.META_FILE).write_text(json.dumps({**meta, "status": "running"}))
    with Run(g) as source:
        trace = source.rank(0)
        writer = TraceWriter(run / "rank-0", start_info=trace.info["start"])
        for ident in sorted(trace.op_names):
            writer.intern_name(trace.op_names[ident])
        for ident in sorted(trace.sites):
            site = trace.sites[ident]
            writer.intern_site(ident, lambda s=site: [s.file, s.line, s.function, s.source])
        for ident in sorted(trace.stacks):
            writer.intern_stack(trace.stacks[ident])
        half = len(trace) // 2
        for raw in trace.raw_ops(0, half):
            writer.append(raw["i"], raw)
    _LIVE_WRITERS.append(writer)
    deadline = time.monotonic() + 30  # committed by the writer's thread within 0.25 s
    while writer.records_written < half and time.monotonic() < deadline:
        time.sleep(0.02)
    return run


_LIVE_WRITERS: list[TraceWriter] = []

ERROR, READABLE = "error", "readable"
PATH_CASES: dict[str, tuple[Callable[[Path, Path], Path], str]] = {
    "missing": (_missing, ERROR),
    "file": (_file, ERROR),
    "empty-dir": (_empty_dir, ERROR),
    "no-meta": (_no_meta, ERROR),
    "meta-is-a-directory": (_meta_is_a_directory, ERROR),
    "meta-not-json": (_meta_text("{not json"), ERROR),
    "meta-truncated": (_meta_text('{"schema": 1, "comm'), ERROR),
    "meta-a-list": (_meta_text("[1, 2]"), ERROR),
    "meta-newer-schema": (_meta_edited(lambda m: m.update(schema=999)), ERROR),
    "meta-no-schema": (_meta_edited(lambda m: m.pop("schema")), ERROR),
    "meta-schema-a-string": (_meta_edited(lambda m: m.update(schema="1")), ERROR),
    "meta-damaged-command": (_meta_edited(lambda m: m.update(command=5)), ERROR),
    "meta-damaged-devices": (_meta_edited(lambda m: m.update(devices="cpu")), ERROR),
    "meta-damaged-started": (_meta_edited(lambda m: m.update(started="yesterday")), ERROR),
    "data-is-a-directory": (_data_is_a_directory, ERROR),
    "rank-is-a-file": (_rank_is_a_file, ERROR),
    "data-random-bytes": (_random_bytes, ERROR),
    "data-empty": (_truncated(lambda n: 0), ERROR),
    "data-truncated-in-header": (_truncated(lambda n: 100), ERROR),
    "data-truncated-to-1-page": (_truncated(lambda n: 4096), ERROR),
    "data-truncated-to-2-pages": (_truncated(lambda n: 8192), ERROR),
    "data-truncated-by-half": (_truncated(lambda n: n // 2), ERROR),
    "data-truncated-by-1-page": (_truncated(lambda n: n - 4096), ERROR),
    "data-value-past-its-page": (_value_past_its_page, ERROR),
    "non-trace-lmdb": (_foreign_lmdb, ERROR),
    "plain-lmdb-as-run": (_plain_lmdb, ERROR),
    "info-newer-schema": (_lmdb_edited(_put("info", b"schema", msgpack.packb(999))), ERROR),
    "info-schema-garbage": (_lmdb_edited(_put("info", b"schema", b"\xc1")), ERROR),
    "ops-dropped": (_lmdb_edited(_drop("ops")), ERROR),
    "record-not-msgpack": (
        _lmdb_edited(_put("ops", schema.op_key(5), b"\xc1\xff garbage")),
        READABLE,
    ),
    "record-wrong-shape": (
        _lmdb_edited(_put("ops", schema.op_key(5), msgpack.packb({"i": "five", "x": 3}))),
        READABLE,
    ),
    "record-key-wrong-length": (_lmdb_edited(_put("ops", b"\x00\x07", b"\x80")), READABLE),
    "names-damaged": (_lmdb_edited(_put("names", schema.id_key(0), b"\xc1")), READABLE),
    "sites-wrong-shape": (
        _lmdb_edited(_put("sites", schema.id_key(0), msgpack.packb([1, 2]))),
        READABLE,
    ),
    "no-ranks": (_no_ranks, READABLE),
    "still-being-written": (_live, READABLE),
    **{f"bytes-flipped-{seed}": (_flipped(seed, 24), READABLE) for seed in range(12)},
}


def _path_commands(g: Path, other: Path, p: Path, expect: str) -> Iterator[list[str]]:
    yield ["show", str(p)]
    yield ["show", str(p), "--json"]
    yield ["show", str(p), "--ops", "0:6", "--json"]
    yield ["show", str(p), "--ops", "3"]
    yield ["diff", str(g), str(p)]
    yield ["diff", str(p), str(g), "--json"]
    yield ["diff", str(p), str(other), "--json"]
    yield ["explain", str(g), str(p)]
    yield ["explain", str(p), str(g), "--json"]
    yield ["nan", str(p)]
    yield ["nan", str(p), "--json"]
    yield ["tensor", str(g), str(p), "--op", "3", "--json"]
    yield ["replay", str(p), "--op", "3", "--against", str(g)]
    yield ["ops", str(g), str(p), "3", "--json"]
    yield ["op", str(p), str(g), "3"]
    yield ["producers", str(g), str(p), "3", "--json"]
    yield ["source", str(p), "3", "--json"]
    yield ["kernels", str(p), "3"]
    if expect == ERROR:  # a readable pair would start the terminal UI, or record again
        yield ["tui", str(g), str(p)]
        yield ["tui", str(p), str(g)]
        yield ["capture", str(g), str(p)]
        yield ["capture", str(p), str(g)]


def _argument_cases(t: dict[str, Path], d: Path) -> dict[str, list[str]]:
    g, g2, lr = str(t["good"]), str(t["good-again"]), str(t["other-lr"])
    script = d / "train.py"
    script.write_text("print('should not run')\n")
    (d / "a-file").write_text("x\n")
    out = str(d / "out")
    huge = "99999999999999999999"  # past 64 bits
    earlier = d / "earlier-hunt"  # holds a run directory of an earlier hunt
    (earlier / "b-window").mkdir(parents=True)
    return {
        "unknown-command": ["frobnicate"],
        "unknown-option": ["diff", g, g2, "--frobnicate"],
        "show-no-run": ["show"],
        "show-bad-rank": ["show", g, "--rank", "x"],
        "show-absent-rank": ["show", g, "--rank", "3"],
        "show-bad-ops": ["show", g, "--ops", "a:b"],
        "show-negative-op": ["show", g, "--ops=-1"],
        "show-negative-range": ["show", g, "--ops=-5:-1"],
        "show-huge-op": ["show", g, "--ops", huge],
        "show-backward-range": ["show", g, "--ops", "10:5"],
        "show-op-past-the-end": ["show", g, "--ops", "99999"],
        "show-range-past-the-end": ["show", g, "--ops", "99999:", "--json"],
        "diff-one-run": ["diff", g],
        "diff-three-runs": ["diff", g, g2, g2],
        "diff-bad-rank": ["diff", g, g2, "--rank", "-"],
        "diff-absent-rank": ["diff", g, g2, "--rank", "7"],
        "diff-absent-step": ["diff", g, g2, "--step", "99"],
        "diff-bad-step": ["diff", g, g2, "--step", "one"],
        "diff-offset-without-json": ["diff", g, g2, "--offset", "1"],
        "diff-limit-without-json": ["diff", g, g2, "--limit", "1"],
        "diff-unrelated-programs": ["diff", g, str(t["other"])],
        "explain-unrelated-programs": ["explain", str(t["other"]), g, "--json"],
        "explain-bad-budget": ["explain", g, lr, "--budget", "cheap"],
        "explain-negative-budget": ["explain", g, lr, "--budget", "-1"],
        "explain-zero-max-tokens": ["explain", g, lr, "--max-tokens", "0"],
        "explain-one-price": ["explain", g, lr, "--model", "openai/x", "--input-price", "1"],
        "tui-one-run": ["tui", g],
        "record-no-output": ["record", "--", str(script)],
        "record-no-script": ["record", "-o", out],
        "record-empty-output": ["record", "-o", "", "--", str(script)],
        "record-missing-script": ["record", "-o", out, "--", str(d / "nope.py")],
        "record-bad-steps": ["record", "-o", out, "--steps", "x", "--", str(script)],
        "record-zero-steps": ["record", "-o", out, "--steps", "0", "--", str(script)],
        "record-huge-keep-last": ["record", "-o", out, "--keep-last", huge, "--", str(script)],
        "record-huge-window": ["record", "-o", out, "--window", f"1:{huge}", "--", str(script)],
        "record-output-a-file": ["record", "-o", str(d / "a-file"), "--", str(script)],
        "record-output-a-run": ["record", "-o", g, "--", str(script)],
        "record-missing-module": ["record", "-o", out, "-m", "no_such_module_anywhere"],
        "record-missing-python": [
            *("record", "-o", out, "--python", str(d / "no-python"), "--", str(script)),
        ],
        "demo-dir-a-file": ["demo", "--dir", str(d / "a-file")],
        "demo-empty-dir": ["demo", "--dir", ""],
        "nan-no-run": ["nan"],
        "nan-absent-rank": ["nan", g, "--rank", "9"],
        "tensor-no-op": ["tensor", g, g2],
        "tensor-bad-op": ["tensor", g, g2, "--op", "x"],
        "tensor-huge-op": ["tensor", g, g2, "--op", huge],
        "tensor-uncaptured-op": ["tensor", g, g2, "--op", "3"],
        "tensor-input-and-output": ["tensor", g, g2, "--op", "3", "--input", "0", "--output", "0"],
        "replay-no-op": ["replay", g],
        "replay-zero-times": ["replay", g, "--op", "0", "--times", "0"],
        "replay-uncaptured-op": ["replay", g, "--op", "3"],
        "replay-huge-op": ["replay", g, "--op", huge],
        "replay-op-b-alone": ["replay", g, "--op", "3", "--op-b", "3"],
        "capture-one-run": ["capture", g],
        "ops-no-index": ["ops", g, g2],
        "ops-bad-index": ["ops", g, g2, "x", "--json"],
        "op-absent-index": ["op", g, g2, "99999", "--json"],
        "op-bad-side": ["op", g, g2, "3", "--side", "c"],
        "producers-absent-index": ["producers", g, g2, "99999"],
        "source-absent-index": ["source", g, "99999", "--json"],
        "source-huge-index": ["source", g, huge, "--json"],
        "kernels-huge-index": ["kernels", g, huge],
        "source-two-runs": ["source", g, g2, "3"],
        "kernels-bad-index": ["kernels", g, "x"],
        "tools-unknown-option": ["tools", "--frobnicate"],
        "mcp-extra-argument": ["mcp", g],
        "capture-negative-window": ["capture", g, lr, "--window", "-1"],
        "capture-bad-window": ["capture", g, lr, "--window", "x"],
        "capture-empty-output": ["capture", g, lr, "-o", "", out],
        "hunt-no-b": ["hunt", "-o", out, "--a", str(script)],
        "hunt-empty-output": ["hunt", "-o", "", "--a", str(script), "--b", str(script)],
        "hunt-empty-a": ["hunt", "-o", out, "--a", " ", "--b", str(script)],
        "hunt-unclosed-quote": ["hunt", "-o", out, "--a", f"{script} 'x", "--b", str(script)],
        "hunt-missing-script": ["hunt", "-o", out, "--a", str(script), "--b", str(d / "nope.py")],
        "hunt-module-alone": ["hunt", "-o", out, "--a", "-m ", "--b", str(script)],
        "hunt-earlier-hunt": ["hunt", "-o", str(earlier), "--a", str(script), "--b", str(script)],
    }


def _run_driver(cases: list[tuple[str, list[str]]], d: Path) -> dict[str, dict[str, Any]]:
    (d / "cases.json").write_text(json.dumps(cases))
    results = d / "results.jsonl"
    done = subprocess.run(
        [sys.executable, str(DRIVER), str(d / "cases.json"), str(results)],
        cwd=tempfile.gettempdir(),  # never the repository root (see conftest.run_cli)
        capture_output=True,
        text=True,
        timeout=600,
        env={
            **os.environ,
            "XDG_CONFIG_HOME": str(d / "config"),
            "OPGUARD_MODEL": "",
            "OPGUARD_API_BASE": "",
        },
    )
    started = (d / "results.jsonl.started").read_text().split()
    assert done.returncode == 0, (
        f"the CLI process died (exit {done.returncode}) in case {started[-1:]}: "
        f"{done.stderr[-3000:]}"
    )
    return {r["id"]: r for r in map(json.loads, results.read_text().splitlines())}


@pytest.fixture(scope="module")
def outcomes(
    traces: dict[str, Path], tmp_path_factory: pytest.TempPathFactory
) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """Every case's outcome, and what each case was expected to do."""
    root = tmp_path_factory.mktemp("cases")
    cases: list[tuple[str, list[str]]] = []
    expected: dict[str, str] = {}
    for name, (build, expect) in PATH_CASES.items():
        d = root / name
        d.mkdir()
        path = build(traces["good"], d)
        for n, argv in enumerate(_path_commands(traces["good"], traces["other"], path, expect)):
            case_id = f"{name}/{n}:{argv[0]}"
            cases.append((case_id, argv))
            expected[case_id] = expect
    args_dir = root / "arguments"
    args_dir.mkdir()
    for name, argv in _argument_cases(traces, args_dir).items():
        cases.append((f"args/{name}", argv))
        expected[f"args/{name}"] = ERROR
    try:
        results = _run_driver(cases, root)
    finally:
        while _LIVE_WRITERS:
            _LIVE_WRITERS.pop().close({"status": "finished"})
    return results, expected


def _assert_one_line_error(case: str, result: dict[str, Any]) -> None:
    assert result["code"] == 2, (case, result)
    lines = result["stderr"].splitlines()
    assert len(lines) == 1 and lines[0].startswith("opguard: error: "), (case, result["stderr"])
    assert "Traceback" not in result["stderr"] and not result["stdout"].strip(), (case, result)


def test_every_bad_input_is_one_line_and_exit_2(
    outcomes: tuple[dict[str, dict[str, Any]], dict[str, str]],
) -> None:
    results, expected = outcomes
    assert set(results) == set(expected)
    escaped = {case: r["escaped"] for case, r in results.items() if r["escaped"]}
    assert not escaped, escaped
    for case, expect in expected.items():
        result = results[case]
        if expect == ERROR or result["code"] == 2:
            _assert_one_line_error(case, result)
            continue
        # A trace read as far as it can be: the command's usual output, no traceback (3: the
        # comparison met a part it could not read).
        assert result["code"] in (0, 1, 3), (case, result)
        assert "Traceback" not in result["stderr"], (case, result["stderr"])
        assert len(result["stderr"].splitlines()) <= 1, (case, result["stderr"])
        if "--json" in case or result["stdout"].startswith("{"):
            json.loads(result["stdout"])


def test_refusals_say_what_is_wrong(
    outcomes: tuple[dict[str, dict[str, Any]], dict[str, str]],
) -> None:
    results, _ = outcomes

    def said(case: str) -> str:
        return str(results[case]["stderr"])

    assert "no such run directory" in said("missing/0:show")
    assert "not a directory" in said("file/0:show")
    assert "999" in said("meta-newer-schema/0:show") and "upgrade" in said(
        "meta-newer-schema/0:show"
    )
    assert "newer" in said("info-newer-schema/0:show")
    assert "no valid schema version" in said("meta-no-schema/0:show")
    empty = [case for case in results if case.startswith("data-empty/")]
    assert len(empty) > 15  # every reading command
    for case in empty:
        assert "data.mdb is empty (0 bytes): never written, or truncated" in said(case), case
    assert "truncated" in said("data-truncated-by-half/0:show")
    assert "truncated" in said("data-truncated-by-1-page/4:diff")
    assert "has a damaged node" in said("data-value-past-its-page/4:diff")
    assert "damaged run metadata (field 'command')" in said("meta-damaged-command/0:show")
    assert "no such module" in said("args/record-missing-module")
    for case in ("args/diff-unrelated-programs", "args/explain-unrelated-programs"):
        assert "no op in common" in said(case) and "different programs" in said(case)
    assert "cannot create the demo directory" in said("args/demo-dir-a-file")
    assert "indices from 0" in said("args/show-negative-op")
    assert "indices from 0" in said("args/show-negative-range")
    assert "END must be past START" in said("args/show-backward-range")
    for case in ("show-huge-op", "show-op-past-the-end", "show-range-past-the-end"):
        assert "selects no op: rank 0 has ops 0 to " in said(f"args/{case}"), case
    for case in ("diff-offset-without-json", "diff-limit-without-json"):
        assert "add --json" in said(f"args/{case}"), case
    for case in ("record-empty-output", "demo-empty-dir", "capture-empty-output"):
        assert "an empty name is not a directory" in said(f"args/{case}"), case
    assert said("args/unknown-option").endswith("(see opguard diff --help)\n")
    for case in ("tensor-huge-op", "replay-huge-op", "source-huge-index", "kernels-huge-index"):
        assert "no op 99999999999999999999" in said(f"args/{case}"), case
    assert "an empty name is not a directory" in said("args/hunt-empty-output")
    assert "--a is empty" in said("args/hunt-empty-a")
    assert "No closing quotation" in said("args/hunt-unclosed-quote")
    assert "--b: " in said("args/hunt-missing-script") and "nope.py: no such script" in said(
        "args/hunt-missing-script"
    )
    assert "earlier-hunt/b-window exists (an earlier hunt?)" in said("args/hunt-earlier-hunt")


def test_readable_damage_is_reported_not_hidden(
    outcomes: tuple[dict[str, dict[str, Any]], dict[str, str]],
) -> None:
    results, _ = outcomes
    for name in ("record-not-msgpack", "record-wrong-shape"):
        shown = json.loads(results[f"{name}/1:show"]["stdout"])["ranks"][0]
        assert shown["ops"] == 5 and "damaged record" in shown["damage"], shown
        diffed = json.loads(results[f"{name}/5:diff"]["stdout"])
        assert any("damaged record" in note for note in diffed["notes"]), diffed["notes"]
        # Damage is never a verdict of equality.
        assert (diffed["verdict"], results[f"{name}/5:diff"]["code"]) == ("incomplete", 3)
        assert diffed["unread"] and "damaged record" in diffed["unread"][0]["why"]
    live = json.loads(results["still-being-written/1:show"]["stdout"])["ranks"][0]
    assert live["partial"] and not live["finished"] and live["ops"] > 0
    diffed = json.loads(results["still-being-written/5:diff"]["stdout"])
    assert diffed["verdict"] == "identical" and diffed["unaligned_a"] == 0
    assert any("did not finish" in note for note in diffed["notes"])
    assert "did not finish" in diffed["scope"]  # the verdict covers the steps compared


# -- damage inside a recorded trace's data -----------------------------------------------------


def _live_offset(rank_dir: Path, db: bytes, key: bytes) -> int:
    """Where the value of ``key`` in database ``db`` lies in ``rank_dir``'s data.mdb, in the
    snapshot LMDB reads (copies of its page from earlier commits lie elsewhere, unread): LMDB
    hands out values as views of its map of the file."""
    env = lmdb.open(str(rank_dir), readonly=True, lock=False, max_dbs=len(schema.DB_NAMES))
    try:
        with env.begin(buffers=True) as txn:
            value = txn.get(key, db=env.open_db(db, txn=txn, create=False))
            ((start, _),) = mapped_spans(rank_dir)
            return int(np.frombuffer(value, dtype=np.uint8).ctypes.data) - start
    finally:
        env.close()


PAGE = 4096
# Bytes overwritten around op N's record (its value at ``v``; before it, its key and node
# header; the page's header and node pointers at the start of its page): where, and with what.
DAMAGE: dict[str, Callable[[int], tuple[int, bytes]]] = {
    "page-header": lambda v: (v - v % PAGE, b"\xff" * 16),
    "node-pointers": lambda v: (v - v % PAGE + 16, b"\xff" * 8),
    "node-header": lambda v: (v - 16, b"\xff" * 8),
    "record": lambda v: (v + 2, b"\xc1" * 8),
}


@pytest.fixture(scope="module")
def longer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The good run's training for 12 steps: a trace of dozens of pages."""
    return _train(tmp_path_factory.mktemp("longer") / "run", steps=12)


@pytest.mark.parametrize("share", [0.3, 0.6, 0.9])
@pytest.mark.parametrize("kind", sorted(DAMAGE))
def test_damage_inside_the_ops_reads_the_records_before_it(
    longer: Path, tmp_path: Path, kind: str, share: float
) -> None:
    """Bytes overwritten inside a page of op records in the middle of the file: the records
    before the damage are read and compared (incomplete, exit 3), never a whole rank refused,
    never a verdict of equality; where reading stopped is said."""
    with Run(longer) as run:
        ops = len(run.rank(0))
    index = int(ops * share)
    damaged = _copy(longer, tmp_path)
    at, garbage = DAMAGE[kind](_live_offset(damaged / "rank-0", b"ops", schema.op_key(index)))
    with open(_data(damaged), "r+b") as f:
        f.seek(at)
        f.write(garbage)
    result = run_cli("diff", str(longer), str(damaged), "--json")
    assert result.returncode == 3 and not result.stderr, (result.returncode, result.stderr)
    diffed = json.loads(result.stdout)
    ((unread),) = diffed["unread"]
    assert (diffed["verdict"], unread["run"]) == ("incomplete", "b")
    shown = json.loads(run_cli("show", str(damaged), "--json").stdout)["ranks"][0]
    assert shown["damage"] == unread["why"]
    if kind == "record":  # the record does not decode: every one before it is read
        assert "damaged record" in unread["why"] and diffed["aligned"] == shown["ops"] == index
        return
    # The page is damaged: its records and those after it cannot be reached in order.
    assert "reading stopped at a damaged page" in unread["why"], unread
    last = shown["last_op"]["index"]
    assert f"{last + 1} op record(s) read, up to op {last}" in unread["why"]
    assert 0 < last < index and diffed["aligned"] == shown["ops"] == last + 1
    past = run_cli("show", str(damaged), "--ops", str(index))
    assert past.returncode == 2 and len(past.stderr.splitlines()) == 1, past.stderr


def test_a_damaged_step_record_is_no_verdict_of_equality(longer: Path, tmp_path: Path) -> None:
    """Bytes overwritten inside a step-level record (compressed, over overflow pages): every op
    compares equal, but the run could not be read to its end."""
    damaged = _copy(longer, tmp_path)
    at = _live_offset(damaged / "rank-0", b"steps", schema.op_key(5))
    with open(_data(damaged), "r+b") as f:
        f.seek(at + 200)
        f.write(b"\xff" * 64)
    result = run_cli("diff", str(longer), str(damaged), "--json")
    assert result.returncode == 3, (result.returncode, result.stderr)
    diffed = json.loads(result.stdout)
    assert diffed["verdict"] == "incomplete" and diffed["unaligned_b"] == 0
    assert "damaged step record: step 5" in diffed["unread"][0]["why"]


def test_a_damaged_page_of_step_records_reads_the_steps_before_it(
    longer: Path, tmp_path: Path
) -> None:
    """A page of step-level records damaged (the header of the page holding step 8's record):
    the rank is not refused; the steps before the damage are compared (incomplete, exit 3),
    and where reading stopped is said, in the diff and by ``show``."""
    damaged = _copy(longer, tmp_path)
    value = _live_offset(damaged / "rank-0", b"steps", schema.op_key(8))
    with open(_data(damaged), "r+b") as f:
        f.seek(value - value % PAGE)
        f.write(b"\xff" * 16)
    result = run_cli("diff", str(longer), str(damaged), "--json")
    assert result.returncode == 3 and not result.stderr, (result.returncode, result.stderr)
    diffed = json.loads(result.stdout)
    assert diffed["verdict"] == "incomplete"
    ((unread),) = diffed["unread"]
    assert "reading stopped at a damaged page of step records" in unread["why"], unread
    with Run(damaged) as run:
        steps = run.rank(0).step_numbers()
    assert steps == list(range(len(steps))) and 0 < len(steps) <= 8
    assert f"up to step {steps[-1]}" in unread["why"]
    shown = run_cli("show", str(damaged), "--json")
    assert shown.returncode == 0, shown.stderr


# -- decoding stored records (hypothesis) --------------------------------------------------------

SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**63), max_value=2**64 - 1)
    | st.floats(allow_nan=True)
    | st.text(max_size=8)
    | st.binary(max_size=16)
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.text(max_size=3) | st.integers(-3, 3), inner, max_size=4)
    ),
    max_leaves=12,
)
SMALL_INTS = st.integers(min_value=-2, max_value=70)


def _near(valid: st.SearchStrategy[Any]) -> st.SearchStrategy[Any]:
    """Mostly what the recorder writes, sometimes anything."""
    return valid | VALUES


TENSORS = st.fixed_dictionaries(
    {},
    optional={
        "n": _near(st.sampled_from(["self", "0", "out"])),
        "d": _near(st.sampled_from(["float32", "bfloat16", "int64", "complex64", "qint8"])),
        "s": _near(st.lists(st.integers(0, 5), max_size=3)),
        "t": _near(st.lists(st.integers(0, 5), max_size=3)),
        "v": _near(st.just("cpu")),
        "h": _near(st.integers(0, 2**64 - 1)),
        "b": _near(st.binary(max_size=16)),
        "z": _near(st.integers(0, 64)),
        "m": _near(st.lists(st.floats() | st.integers(0, 3), max_size=6)),
        "p": _near(st.tuples(SMALL_INTS, st.integers(0, 2)).map(list)),
        "f": _near(st.integers(0, 15)),
    },
)
OPS = st.fixed_dictionaries(
    {"i": _near(st.integers(0, 50)), "o": _near(SMALL_INTS)},
    optional={
        "s": _near(SMALL_INTS),
        "p": _near(st.integers(0, 4)),
        "c": _near(SMALL_INTS),
        "k": _near(SMALL_INTS),
        "f": _near(SMALL_INTS),
        "a": _near(st.lists(st.tuples(st.text(max_size=4), VALUES).map(list), max_size=3)),
        "x": _near(st.lists(TENSORS, max_size=3)),
        "y": _near(st.lists(TENSORS, max_size=3)),
        "r": _near(st.integers(0, 2**64 - 1)),
        "v": VALUES,
        "l": _near(st.lists(SMALL_INTS, max_size=3)),
    },
)
HYPOTHESIS = settings(
    max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)


@pytest.fixture(scope="module")
def trace(traces: dict[str, Path]) -> Iterator[RankTrace]:
    with Run(traces["good"]) as run:
        yield run.rank(0)


def _decode_everywhere(trace: RankTrace, raw: Any) -> None:
    """Decodes ``raw`` as the reader and the diff do: a valid record, usable by everything
    that reads one, or DamagedRecord; no other exception."""
    try:
        op = trace.decode(raw)
    except DamagedRecord:
        with contextlib.suppress(DamagedRecord):  # the diff may still compare odd values
            LightReader(trace, OpKeys(trace, KeyTable())).light(check_light(raw))
        return
    json.dumps(op.to_json(), default=str)  # what show --json and the evidence print
    for tensor in (*op.inputs, *op.outputs):
        tensor.values(), tensor.bits(), tensor.content_key(), tensor.fingerprint_text()
    LightReader(trace, OpKeys(trace, KeyTable())).light(check_light(raw))  # what the diff reads


@HYPOTHESIS
@given(raw=OPS)
def test_op_shaped_values_decode_or_are_damaged(trace: RankTrace, raw: Any) -> None:
    _decode_everywhere(trace, raw)


@HYPOTHESIS
@given(raw=VALUES)
def test_arbitrary_values_decode_or_are_damaged(trace: RankTrace, raw: Any) -> None:
    _decode_everywhere(trace, raw)


@HYPOTHESIS
@given(data=st.binary(max_size=64))
def test_arbitrary_bytes_unpack_or_are_damaged(data: bytes) -> None:
    with contextlib.suppress(DamagedRecord):  # any other exception fails the test
        _unpack(data)


@pytest.fixture(scope="module")
def stored_records(trace: RankTrace) -> list[bytes]:
    with trace._env.begin() as txn:
        return [bytes(v) for _, v in txn.cursor(db=trace._dbs["ops"])]


@HYPOTHESIS
@given(data=st.data())
def test_mutated_stored_records_decode_or_are_damaged(
    trace: RankTrace, stored_records: list[bytes], data: st.DataObject
) -> None:
    record = bytearray(data.draw(st.sampled_from(stored_records)))
    for _ in range(data.draw(st.integers(1, 4))):
        position = data.draw(st.integers(0, len(record) - 1))
        action = data.draw(st.sampled_from(("flip", "cut", "insert")))
        if action == "flip":
            record[position] ^= 1 << data.draw(st.integers(0, 7))
        elif action == "cut":
            del record[position:]
        else:
            record[position:position] = data.draw(st.binary(min_size=1, max_size=4))
        if not record:
            record = bytearray(b"\x90")
    try:
        raw = _unpack(bytes(record))
    except DamagedRecord:
        return
    _decode_everywhere(trace, raw)
