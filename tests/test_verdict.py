"""The verdict's vocabulary (kinds, causes, their words), the typed kernel entries the store hands
out, and the shared text formatters."""

from __future__ import annotations

import json
import string
from pathlib import Path
from typing import Any

import msgpack

from opguard.agent.reading import CAUSES
from opguard.analysis.state_diff import CAUSE_OF_KIND
from opguard.analysis.words.text import kernel_cells, kernel_line, short_kernel_name
from opguard.analysis.words.verdict import WORDS, Cause, Kind, Side, label
from opguard.store import KernelEntry, Run, TraceWriter, schema
from opguard.store.meta import write_meta

STEP_LEVEL = set(CAUSE_OF_KIND.values())


def _fields(template: str) -> set[str]:
    return {name for _, name, _, _ in string.Formatter().parse(template) if name}


def test_every_cause_has_its_words_and_a_reading() -> None:
    """A cause added to the enum without its sentences, or without the reading that says it,
    fails here rather than as a KeyError in front of a user."""
    for cause in Cause:
        words = WORDS[cause]
        if cause in STEP_LEVEL:
            assert "{step}" in words.state, cause
        if cause in CAUSES or cause not in STEP_LEVEL:
            assert cause in CAUSES, f"{cause}: no offline reading"
            assert words.summary and words.reading, cause
    assert set(Cause) == set(WORDS)


def test_templates_name_only_fields_their_callers_fill() -> None:
    """Each template's fields, as the code that formats it passes them (a misspelt field would
    raise KeyError only for that cause)."""
    summary = {"where", "op", "site", "shown", "slot", "step", "how", "a", "b"}
    reading = {"kernels", "name", "a", "b", "op", "input", "step", "source", "seen", "index"}
    for cause, words in WORDS.items():
        assert _fields(words.summary) <= summary, cause
        assert _fields(words.reading) <= reading, cause
        assert _fields(words.state) <= {"step", "what", "alike", "beyond"}, cause


def test_kinds_and_causes_are_their_words_in_json_and_text() -> None:
    """The enums are the plain strings the opguard.diff/1 JSON has always held."""
    assert json.dumps({"kind": Kind.PROPAGATED, "cause": Cause.UNRECORDED_WRITE}) == (
        '{"kind": "propagated", "cause": "unrecorded-write"}'
    )
    assert f"{Kind.STRUCTURE} ({Cause.INSERTED})" == "structure (inserted)"
    assert Cause("earlier-step") is Cause.EARLIER_STEP
    assert label(Kind.ORIGIN, Cause.ORIGIN) == "origin"
    assert label(Kind.PROPAGATED, Cause.LEAF) == "propagated (leaf)"
    assert [(s.name, s.key, s.value) for s in Side] == [("A", "a", 0), ("B", "b", 1)]


def _trace_with_kernels(path: Path, entries: list[Any]) -> None:
    """A one-op trace whose op has the kernels entries ``entries``, as a recorder stored them."""
    path.mkdir(parents=True)
    write_meta(path, {"schema": schema.SCHEMA_VERSION, "command": ["test"], "status": "finished"})
    writer = TraceWriter(path / "rank-0", start_info={"rank": 0})
    batches = iter([[(0, msgpack.packb(entries))]])
    writer.poll_kernels = lambda final: next(batches, [])
    writer.append(0, {"i": 0, "o": writer.intern_name("aten::mm.default"), "s": 0, "p": 0})
    writer.close({"status": "finished"})


def test_kernel_entries_decode_once_with_named_fields(tmp_path: Path) -> None:
    """Entries as earlier recorders wrote them (no device, no bytes, no flag), a memset, work
    launched after the op by unrecorded code, and a damaged entry: the op's kernels and its
    unrecorded work apart, every stored field named, the JSON form the entry as stored."""
    old = {"k": "kernel", "n": "void gemm<4>(float*)", "g": [4, 1, 1], "b": [256, 1, 1]}
    old.update(s=7, t0=1000, t1=4500)
    memset = {"k": "memset", "n": "memset", "s": 7, "d": 0, "t0": 5000, "t1": 5100, "z": 4096}
    late = {"k": "kernel", "n": "my_kernel", "s": 9, "t0": 6000, "t1": 6200, "u": 1}
    _trace_with_kernels(tmp_path / "run", [old, "damaged", memset, late])
    with Run(tmp_path / "run") as run:
        op = run.rank(0).op(0)
    gemm, mem = op.kernels
    assert (gemm.kind, gemm.name, gemm.grid, gemm.block, gemm.stream) == (
        "kernel",
        "void gemm<4>(float*)",
        (4, 1, 1),
        (256, 1, 1),
        7,
    )
    assert (gemm.device, gemm.nbytes, gemm.unrecorded, gemm.duration_us) == (None, None, False, 3.5)
    assert (mem.is_kernel, mem.nbytes, mem.grid) == (False, 4096, None)
    assert [k.name for k in op.unclaimed_kernels] == ["my_kernel"]
    assert op.unclaimed_kernels[0].unrecorded
    assert [k.to_json() for k in op.kernels] == [old, memset]
    assert op.to_json()["unrecorded_after"] == [late]


def test_kernel_text_reads_every_field_it_was_given() -> None:
    gemm = KernelEntry.decode(
        {"k": "kernel", "n": "void gemm<4>(float*)", "g": [4, 1, 1], "b": [256, 1, 1], "s": 7}
        | {"t0": 1000, "t1": 4500}
    )
    memset = KernelEntry.decode({"k": "memset", "n": "memset", "z": 0})
    assert (
        kernel_line(gemm) == "void gemm<4>(float*) grid [4, 1, 1] block [256, 1, 1] stream 7 3.5 µs"
    )
    assert kernel_line(memset) == "memset 0 bytes stream None 0.0 µs"
    assert kernel_cells(gemm) == (
        "kernel",
        "void gemm<4>(float*)",
        "[4, 1, 1] [256, 1, 1]",
        "7",
        "3.5",
    )
    assert kernel_cells(memset) == ("memset", "memset", "0", "", "0.0")
    assert kernel_line(gemm, origin_ns=500, name_chars=10) == (
        "void gemm… grid [4, 1, 1] block [256, 1, 1] stream 7 0.5–4.0 µs"
    )
    assert short_kernel_name(gemm.name) == "gemm"
