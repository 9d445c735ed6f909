"""The documentation a user reads holds: every relative link in README.md, docs/ and the agents'
skill resolves (to a file, and to a heading where it names one), the README stays a first-time
user's page, and every key of every JSON object OpGuard prints (``opguard diff --json``, the
other commands' ``--json``, the tools' answers) is specified in that object's section of
docs/json-contract.md."""

from __future__ import annotations

import json
import re
import subprocess
from collections.abc import Collection
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from conftest import cli_in_process
from sketch_reference import stored_sketch
from state_runs import hunt_of, write_state_run
from traces import TraceBuilder, chain_run, kernel, tensor

from opguard.agent.evidence import SCHEMA as EVIDENCE_SCHEMA
from opguard.analysis import diff_runs
from opguard.analysis.contract import SCHEMA as DIFF_SCHEMA
from opguard.analysis.contract import to_json
from opguard.analysis.tolerant.rule import Tolerance
from opguard.hunt import SCHEMA as HUNT_SCHEMA
from opguard.store import Run
from opguard.store.captures import INPUT, OUTPUT
from opguard.tool_registry import MAX_CHARS, Pages, bounded, page_of
from opguard.tools import BY_NAME, recording
from opguard.tools.explanation import SCHEMA as EXPLAIN_SCHEMA
from opguard.tools.runs import NAN_SCHEMA
from opguard.tools.zoom import REPLAY_SCHEMA, TENSOR_SCHEMA

ROOT = Path(__file__).resolve().parent.parent
PAGES = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
    ROOT / "skills/opguard/SKILL.md",
]
CONTRACT = ROOT / "docs" / "json-contract.md"
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
README_LIMIT = 12 * 1024  # bytes: what a first-time user reads; the manual is in docs/

# Keys whose values are free-form (argument values, kernel entries as CUPTI gives them, maps
# keyed by data, the arguments a model called a tool with): their insides are not keys of the
# contract.
FREE_FORM = {"kernels", "unrecorded_after", "by_kind", "group", "args", "arguments"}
# Lists of differences whose entries' a and b are each run's own value (an argument's, a
# meta.json field's): the entries' keys are keys of the contract, their values are not.
DIFFERENCES = {"arguments_differ", "args_differ", "b_arguments_differ", "metadata_differs"}
# The parts of the evidence bundle that are opguard.diff/1's own.
DIFF_PARTS = ("first_divergence", "unaligned_near", "alignment", "tolerance", "distance")


def _prose(page: Path) -> str:
    """A page's text outside code blocks (links and headings in code are text)."""
    return re.sub(r"```.*?```", "", page.read_text(), flags=re.S)


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_relative_links_resolve(page: Path) -> None:
    text = _prose(page)
    broken = [
        target
        for target in LINK.findall(text)
        if not re.match(r"[a-z]+:", target)
        and not target.startswith("#")
        and not (page.parent / target.split("#")[0]).exists()
    ]
    assert not broken, f"{page.name}: links to missing files: {broken}"


def _anchors(page: Path) -> set[str]:
    """The anchors of a page's headings, as GitHub spells them."""
    headings = re.findall(r"^#+ (.*)$", _prose(page), flags=re.M)
    return {
        re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-") for heading in headings
    }


@pytest.mark.parametrize("page", PAGES, ids=lambda p: p.name)
def test_links_to_headings_resolve(page: Path) -> None:
    broken = []
    for target in LINK.findall(_prose(page)):
        file, _, anchor = target.partition("#")
        linked = page.parent / file if file else page
        external = re.match(r"[a-z]+:", target) or linked.suffix != ".md" or not linked.is_file()
        if anchor and not external and anchor not in _anchors(linked):
            broken.append(target)  # a missing file is test_relative_links_resolve's to report
    assert not broken, f"{page.name}: links to missing headings: {broken}"


def test_the_readme_is_short() -> None:
    assert len((ROOT / "README.md").read_bytes()) < README_LIMIT


def _keys(value: Any, into: set[str], opaque: Collection[str] = FREE_FORM) -> set[str]:
    """The keys of every object in ``value``, at any depth, added to ``into``; the values of
    ``opaque`` keys are not looked into."""
    if isinstance(value, dict):
        for key, inner in value.items():
            into.add(key)
            if key in DIFFERENCES:
                for difference in inner:
                    into.update(difference)  # its a and b are the runs' own values
            elif key not in opaque:
                _keys(inner, into, opaque)
    elif isinstance(value, list):
        for inner in value:
            _keys(inner, into, opaque)
    return into


def _specified(name: str) -> set[str]:
    """The keys json-contract.md names in the section of ``name`` (a schema, or the command
    that prints an object without one): from its ``## `` heading, which is that name, to the
    next. Per section, so a key one object writes is not taken as specified because another
    object has a key of that name."""
    sections = re.split(r"^## ", CONTRACT.read_text(), flags=re.M)[1:]
    (text,) = [s for s in sections if s.split("\n", 1)[0].strip("`") == name]
    return set(re.findall(r'`"?([A-Za-z_]+)"?', text)) | set(re.findall(r'"([A-Za-z_]+)"', text))


def assert_specified(name: str, *objects: Any, elsewhere: Collection[str] = ()) -> None:
    """Every key ``objects`` hold is named in the section of ``name`` in json-contract.md. The
    values of ``elsewhere`` keys are objects another specification covers (another section,
    which the caller checks them against, or JSON Schema): they are not looked into here."""
    written: set[str] = set()
    for obj in objects:
        _keys(obj, written, FREE_FORM | set(elsewhere))
    assert written - _specified(name) == set(), (
        f"keys {name} writes that its section of docs/json-contract.md does not specify"
    )


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """Small runs (no torch) on which the objects write their keys: a pair where run B inserts
    an op (``a``, ``b``; run A's mm launched GPU work, some of it unrecorded), a pair whose
    leaf differs beyond rounding (``c``, ``d``, with sketches: --tolerant's distances), a
    GELU captured in both runs with other arguments (``ca``, ``cb``: the zoom commands), a run
    that makes Inf then NaN (``nan``), and a run with step-level records and ops of one step
    only (``window``)."""
    root = tmp_path_factory.mktemp("contract")
    base = [("aten::randn.default", None, 10), ("aten::mm.default", 0, 20)]
    a = [*base, ("aten::gelu.default", 1, 30)]
    b = [*base, ("aten::div.Tensor", 1, 21), ("aten::gelu.default", 2, 31)]  # inserted
    gpu_work = {1: [kernel("sgemm", 100), kernel("extension", 900, u=1)]}
    made = {
        "a": chain_run(root / "a", a, args={2: [["approximate", "none"]]}, kernels=[gpu_work]),
        "b": chain_run(root / "b", b),
        "window": write_state_run(root / "window", steps=range(4), op_steps=[2]),
    }
    leaf = np.linspace(-1.0, 1.0, 64)
    for fingerprint, (name, values) in enumerate((("c", leaf), ("d", leaf * 1.01))):
        with TraceBuilder(root / name) as run:
            x = tensor("self", fingerprint, w=stored_sketch(values))
            run.op("aten::relu.default", [x], [tensor("0", fingerprint, w=stored_sketch(values))])
        made[name] = run.path
    x = np.linspace(-1.0, 1.0, 64, dtype=np.float32)
    for fingerprint, (name, approximate) in enumerate((("ca", "none"), ("cb", "tanh"))):
        with TraceBuilder(root / name) as run:
            inputs, outputs = [tensor("self", 2)], [tensor("0", 3 + fingerprint)]
            run.op("aten::gelu.default", inputs, outputs, a=[["approximate", approximate]])
            run.capture(0, INPUT, 0, "self", x)
            run.capture(0, OUTPUT, 0, "0", x * np.float32(0.5 + 0.01 * fingerprint))
        made[name] = run.path
    # stats as stored: min, max, mean, absmax, then the NaN and Inf counts
    finite, inf, nan = ([-1.0, 1.0, 0.0, 1.0, *counts] for counts in ((0, 0), (0, 3), (3, 0)))
    with TraceBuilder(root / "nan") as run:
        run.op("aten::randn.default", [], [tensor("0", 5, m=finite)])
        # an intended -inf (a mask the softmax turns into zeros), then Inf and NaN that are not
        run.op(
            "aten::masked_fill.Scalar", [tensor("self", 5, 0, m=finite)], [tensor("0", 8, m=inf)]
        )
        run.op("aten::_softmax.default", [tensor("self", 8, 1, m=inf)], [tensor("0", 9, m=finite)])
        run.op("aten::log.default", [tensor("self", 5, 0, m=finite)], [tensor("0", 6, m=inf)])
        run.op("aten::mul.Tensor", [tensor("self", 6, 3, m=inf)], [tensor("0", 7, m=nan)])
    made["nan"] = run.path
    return {name: str(path) for name, path in made.items()}


def test_every_key_the_diff_writes_is_specified(runs: dict[str, str]) -> None:
    written = []
    with Run(runs["a"]) as one, Run(runs["b"]) as other:
        for tolerance in (None, Tolerance()):
            written.append(to_json(diff_runs(one, other, tolerance=tolerance)))
    # --tolerant's distances of a leaf that differs beyond rounding (runs with sketches)
    with Run(runs["c"]) as one, Run(runs["d"]) as other:
        written.append(to_json(diff_runs(one, other, tolerance=Tolerance())))
    # the diff tool's answer: brief, a page of each rank's steps
    written.append(BY_NAME["diff"].call({"run_a": runs["a"], "run_b": runs["b"]}))
    assert_specified(DIFF_SCHEMA, *written)


def test_every_key_the_hunt_writes_is_specified(tmp_path: Path) -> None:
    hunt = hunt_of(tmp_path, {"grad fc2.weight": 5}, {"param": 3})  # not reproduced: next
    written = [hunt.to_json(), hunt.to_json(brief=True)]
    diffs = ("step_level", "op_level")
    assert_specified(HUNT_SCHEMA, *written, elsewhere=diffs)
    assert_specified(DIFF_SCHEMA, *(hunt_json[key] for hunt_json in written for key in diffs))


def test_every_key_explain_and_its_evidence_write_is_specified(
    runs: dict[str, str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Without a model (its ``agent`` is null: test_agent checks one against a model)."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path))  # no developer's config: no model
    monkeypatch.delenv("OPGUARD_MODEL", raising=False)
    reports = []
    for pair in ((runs["a"], runs["b"]), (runs["c"], runs["d"], "--tolerant")):
        code, out, err = cli_in_process("explain", *pair, "--json")
        assert code == 1, err
        reports.append(json.loads(out))
    assert_specified(EXPLAIN_SCHEMA, *reports, elsewhere={"evidence"})
    evidence = [report["evidence"] for report in reports]
    assert_specified(EVIDENCE_SCHEMA, *evidence, elsewhere=DIFF_PARTS)
    assert_specified(DIFF_SCHEMA, *(bundle.get(key) for bundle in evidence for key in DIFF_PARTS))


def test_every_key_tensor_and_nan_write_is_specified(runs: dict[str, str]) -> None:
    compared = BY_NAME["tensor"].call({"run_a": runs["ca"], "run_b": runs["cb"], "index": 0})
    assert_specified(TENSOR_SCHEMA, compared)
    found = BY_NAME["nan"].call({"run": runs["nan"]})
    assert found["ranks"][0]["intended"]["first"], "the run makes intended -inf, then NaN and Inf"
    assert_specified(NAN_SCHEMA, found, elsewhere={"ranks"})
    assert_specified(DIFF_SCHEMA, found["ranks"])  # as the diff's nonfinite gives them


def test_every_key_replay_writes_is_specified(runs: dict[str, str]) -> None:
    """The one object that needs torch: the captured op is run again, once, on the CPU."""
    replay = ("replay", runs["ca"], "--op", "0", "--against", runs["cb"], "--device", "cpu")
    code, out, err = cli_in_process(*replay, "--times", "1", "--json")
    assert code in (0, 1), err
    assert_specified(REPLAY_SCHEMA, json.loads(out))


def test_every_key_show_writes_is_specified(runs: dict[str, str]) -> None:
    summaries = [BY_NAME["show"].call({"run": runs[name]}) for name in ("a", "window")]
    assert_specified("opguard show --json", *summaries)
    code, out, err = cli_in_process("show", runs["a"], "--ops", "0:3", "--json")
    assert code == 0, err
    listing = json.loads(out)
    assert_specified("opguard show --ops --json", listing, elsewhere={"ranks"})  # keyed by rank
    assert_specified("opguard show --ops --json", *listing["ranks"].values())


def test_every_key_record_writes_is_specified(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """The record tool's answer as it is built, around a stand-in for its child process
    (``opguard record`` needs torch and seconds): the stand-in writes the run and one line."""
    run_dir = tmp_path / "recorded"

    def child(argv: list[str]) -> subprocess.CompletedProcess[str]:
        write_state_run(run_dir, steps=range(2), op_steps=[1])
        return subprocess.CompletedProcess(argv, 0, "loss 0.5\n", "")

    monkeypatch.setattr(recording, "run_opguard", child)
    answer = BY_NAME["record"].call({"output": str(run_dir), "script": "train.py"})
    assert answer["schema"] == recording.RECORD_SCHEMA
    assert_specified(recording.RECORD_SCHEMA, answer, elsewhere={"ranks"})
    assert_specified("opguard show --json", answer["ranks"])


@pytest.mark.parametrize("tool", ["ops", "op", "producers", "source", "kernels"])
def test_every_key_a_query_writes_is_specified(runs: dict[str, str], tool: str) -> None:
    """Of run A's GELU, whose input run B makes with an op of its own (producers that are not
    partners), and of its mm, whose GPU work was recorded."""
    arguments = (
        {"run": runs["a"], "index": 1}
        if tool in ("source", "kernels")
        else {"run_a": runs["a"], "run_b": runs["b"], "index": 2}
    )
    assert_specified(f"opguard {tool} --json", BY_NAME[tool].call(arguments))


def test_every_key_the_tool_listing_and_cut_answers_write_is_specified() -> None:
    code, out, err = cli_in_process("tools", "--json")
    assert code == 0, err
    assert_specified("opguard tools --json", json.loads(out), elsewhere={"input_schema"})
    item = "x" * 1000
    page = page_of(Pages(100, lambda offset, limit: {"items": [item] * limit}), 0, 50)
    cut = bounded({"items": [item] * (MAX_CHARS // 500)})
    assert "cut" in page and "truncated" in cut
    del page["items"]  # the handler's own
    assert_specified("Every tool's answer", page, cut)
