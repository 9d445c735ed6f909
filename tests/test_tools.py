"""The coding-agent tools: every tool through the CLI (``opguard COMMAND … --json``) and through a
real MCP client session (the SDK's stdio client spawning ``opguard mcp``) on the demo runs, with
the answers compared; bad input on both fronts; and an agent's walk-through kept small.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any, NamedTuple

import anyio
import lmdb
import msgpack
import pytest
import warm
from conftest import REPO, line_of, opguard_cmd, run_cli
from mcp import ClientSession, StdioServerParameters, stdio_client
from mcp.types import CallToolResult, TextContent
from run_once import BATCH_TIMEOUT
from test_imports import cli_without

from opguard.analysis.contract import brief_json
from opguard.store import schema
from opguard.tool_registry import page_of
from opguard.tools import BY_NAME, MAX_CHARS, TOOLS, Pages

pytestmark = pytest.mark.slow  # long in all: started first (conftest.py)

DEMO = REPO / "opguard" / "demo"
LONG = REPO / "tests" / "long_runs" / "train.py"  # a tiny model's run: seconds
# Offline and without the user's agent settings: explain gives the evidence and the reading.
ENV = {"OPGUARD_MODEL": "", "LITELLM_LOCAL_MODEL_COST_MAP": "True"}


@pytest.fixture(scope="module")
def runs(demo_runs: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """The demo pair, a GPU-like copy of run A with two kernel records on op 178, the pair's
    first step recorded again capturing op 175 (the divergent layer norm), and a place for
    recordings."""
    root = tmp_path_factory.mktemp("tools")
    gpu = root / "gpu"
    # Without LMDB's lock file: a copy of it may hold the recorder's writer mutex.
    shutil.copytree(demo_runs[0], gpu, ignore=shutil.ignore_patterns("lock.mdb"))
    kernels = [
        {"k": "kernel", "n": "ampere_sgemm_32x32_sliced1x4_nn", "g": [4, 8, 1], "s": 7},
        {"k": "memcpy", "n": "DtoD", "bytes": 65536, "s": 7},
    ]
    env = lmdb.open(str(gpu / "rank-0"), max_dbs=len(schema.DB_NAMES))
    db = env.open_db(b"kernels")  # its own transaction: not inside the one below
    with env.begin(write=True) as txn:
        txn.put(schema.op_key(178), msgpack.packb(kernels), db=db)
    env.close()
    captured = {"CA": root / "capture-a", "CB": root / "capture-b"}
    recordings = [
        warm.Popen(
            opguard_cmd(
                "record",
                "-o",
                str(out),
                "--capture",
                "175",
                "--steps",
                "1",
                "--",
                str(DEMO / f"train_{script}.py"),
            ),
            cwd=root,
        )
        for out, script in zip(captured.values(), ("baseline", "refactored"), strict=True)
    ]
    for recording in recordings:
        _, err = recording.communicate(timeout=BATCH_TIMEOUT)
        assert recording.returncode == 0, err
    paths = {"A": demo_runs[0], "B": demo_runs[1], "GPU": gpu, "TMP": root, **captured}
    return {k: str(v) for k, v in paths.items()}


def fill(arguments: dict[str, Any], runs: dict[str, str]) -> dict[str, Any]:
    return {
        k: v.format(**runs)
        if isinstance(v, str)
        else [a.format(**runs) for a in v]
        if isinstance(v, list)
        else v
        for k, v in arguments.items()
    }


# (case id, tool, arguments): every tool at least once, paging and options included.
CASES: list[tuple[str, str, dict[str, Any]]] = [
    (
        "record",
        "record",
        {"output": "{TMP}/rec-{front}", "steps": 1, "script": str(DEMO / "train_baseline.py")},
    ),
    ("show", "show", {"run": "{A}"}),
    (
        "hunt",
        "hunt",
        {
            "output": "{TMP}/hunt-{front}",
            "a": f"{LONG} --steps 12",
            "b": f"{LONG} --steps 12 --scale-at 7",
        },
    ),
    ("diff", "diff", {"run_a": "{A}", "run_b": "{B}", "offset": 0}),
    ("diff-page", "diff", {"run_a": "{A}", "run_b": "{B}", "offset": 1, "limit": 2}),
    ("ops", "ops", {"run_a": "{A}", "run_b": "{B}", "index": 175}),
    (
        "ops-changed-b",
        "ops",
        {"run_a": "{A}", "run_b": "{B}", "index": 175, "side": "b", "changed": True, "limit": 5},
    ),
    ("op", "op", {"run_a": "{A}", "run_b": "{B}", "index": 175}),
    ("op-page", "op", {"run_a": "{A}", "run_b": "{B}", "index": 175, "offset": 3, "limit": 2}),
    ("producers", "producers", {"run_a": "{A}", "run_b": "{B}", "index": 178}),
    (
        "producers-slot",
        "producers",
        {"run_a": "{A}", "run_b": "{B}", "index": 175, "slot": "input", "depth": 2},
    ),
    ("source", "source", {"run": "{A}", "index": 175, "before": 2, "after": 1}),
    ("kernels", "kernels", {"run": "{GPU}", "index": 178, "limit": 1}),
    ("kernels-none", "kernels", {"run": "{A}", "index": 175}),
    ("explain", "explain", {"run_a": "{A}", "run_b": "{B}"}),
    ("tensor", "tensor", {"run_a": "{CA}", "run_b": "{CB}", "index": 175, "output": "0"}),
    (
        "replay",
        "replay",
        {"run_a": "{CA}", "index": 175, "against": "{CB}", "times": 2, "device": "cpu"},
    ),
    ("nan", "nan", {"run": "{A}"}),
]
BAD: list[tuple[str, str, dict[str, Any], str]] = [
    ("no-op", "op", {"run_a": "{A}", "run_b": "{B}", "index": 999999}, "has no op 999999"),
    ("no-run", "source", {"run": "{TMP}/missing", "index": 1}, "no such run directory"),
    ("no-rank", "kernels", {"run": "{A}", "index": 1, "rank": 3}, "no rank 3"),
    (
        "no-slot",
        "producers",
        {"run_a": "{A}", "run_b": "{B}", "index": 178, "slot": "nope"},
        "has no input 'nope'",
    ),
    (
        "too-deep",
        "producers",
        {"run_a": "{A}", "run_b": "{B}", "index": 178, "depth": 1000},
        "depth must be at most 64",
    ),
    (
        "past-end",
        "ops",
        {"run_a": "{A}", "run_b": "{B}", "index": 175, "offset": 100000},
        "past the end",
    ),
    ("not-a-run", "diff", {"run_a": "{A}", "run_b": str(DEMO)}, "not"),
    ("no-script", "record", {"output": "{TMP}/never"}, "needs a script"),
    (
        "hunt-no-script",
        "hunt",
        {"output": "{TMP}/never", "a": "{TMP}/missing.py", "b": str(LONG)},
        "missing.py: no such script",
    ),
    ("not-captured", "tensor", {"run_a": "{A}", "run_b": "{B}", "index": 175}, "was not captured"),
    ("replay-not-captured", "replay", {"run_a": "{A}", "index": 175}, "was not captured"),
    (
        "budget",
        "explain",
        {"run_a": "{A}", "run_b": "{B}", "budget": -1},
        "budget from --budget",
    ),
]


class Reply(NamedTuple):
    is_error: bool
    text: str
    structured: Any


def cli_answer(tool: str, arguments: dict[str, Any]) -> tuple[int, Any, str]:
    result = run_cli(*BY_NAME[tool].argv(arguments), env=ENV)
    answer = json.loads(result.stdout) if result.stdout.strip() else None
    return result.returncode, answer, result.stderr


@asynccontextmanager
async def mcp_session() -> AsyncIterator[ClientSession]:
    """An MCP session over stdio with ``opguard mcp`` run by this interpreter (away from the
    source tree), as a coding agent starts it."""
    server = StdioServerParameters(
        command=sys.executable,
        args=["-m", "opguard", "mcp"],
        cwd=tempfile.gettempdir(),
        env={**{k: v for k, v in os.environ.items() if k.isupper()}, **ENV},
    )
    async with stdio_client(server) as (read, write), ClientSession(read, write) as session:
        await session.initialize()
        yield session


async def call(session: ClientSession, name: str, arguments: dict[str, Any]) -> Reply:
    r = await session.call_tool(name, arguments)
    assert isinstance(r, CallToolResult)
    text = "".join(c.text for c in r.content if isinstance(c, TextContent))
    return Reply(r.is_error, text, r.structured_content)


def mcp_calls(calls: list[tuple[str, dict[str, Any]]]) -> tuple[list[str], list[Reply]]:
    """The tools one session lists, and its answers to ``calls`` made in turn."""

    async def talk() -> tuple[list[str], list[Reply]]:
        async with mcp_session() as session:
            listed = [t.name for t in (await session.list_tools()).tools]
            return listed, [await call(session, name, a) for name, a in calls]

    return anyio.run(talk)


@pytest.fixture(scope="module")
def over_mcp(runs: dict[str, str]) -> dict[str, Any]:
    """Every good and bad case through one MCP session; a good call after the bad ones shows the
    server survived them."""
    calls = [(tool, fill(a, {**runs, "front": "mcp"})) for _, tool, a in CASES]
    calls += [(tool, fill(a, runs)) for _, tool, a, _ in BAD]
    calls += [
        ("format_disk", {}),
        ("source", {"run": runs["A"], "index": "x"}),
        ("source", {"run": runs["A"]}),
        ("source", {"run": runs["A"], "index": 1, "colour": "red"}),
        ("show", {"run": runs["A"]}),
    ]
    listed, results = mcp_calls(calls)
    names = [c[0] for c in CASES] + [b[0] for b in BAD]
    names += ["unknown-tool", "wrong-type", "missing", "unknown-argument", "still-serving"]
    return {"listed": listed, **dict(zip(names, results, strict=True))}


def without_run_path(answer: dict[str, Any]) -> dict[str, Any]:
    """A record answer without what differs between two recordings of one script: where it
    went and the recording's timing."""
    return {k: v for k, v in answer.items() if k != "run"}


@pytest.mark.parametrize(("case", "tool", "arguments"), CASES, ids=[c[0] for c in CASES])
def test_cli_and_mcp_agree(
    case: str, tool: str, arguments: dict[str, Any], runs: dict[str, str], over_mcp: dict[str, Any]
) -> None:
    code, cli, err = cli_answer(tool, fill(arguments, {**runs, "front": "cli"}))
    assert code in (0, 1), err  # diff and explain: 1 = diverged
    is_error, text, structured = over_mcp[case]
    assert not is_error, text
    assert json.loads(text) == structured  # the text is the structured answer, serialised
    assert len(text) <= MAX_CHARS
    if tool == "record":
        cli, structured = without_run_path(cli), without_run_path(structured)
    if tool == "hunt":  # the same hunt, in another directory
        cli = json.loads(json.dumps(cli).replace("hunt-cli", "hunt-mcp"))
    assert cli == structured


def test_every_tool_is_listed_and_tested(over_mcp: dict[str, Any]) -> None:
    assert over_mcp["listed"] == [t.name for t in TOOLS]
    assert {tool for _, tool, _ in CASES} == {t.name for t in TOOLS}


def test_diff_tool_is_the_contract_with_pages(runs: dict[str, str]) -> None:
    """``opguard diff --json`` is unchanged; the tool's answer is the same object with ``next``
    (by default brief: without the ops given twice), and its pages together hold every step."""
    contract = json.loads(run_cli("diff", runs["A"], runs["B"], "--json").stdout)
    pair = {"run_a": runs["A"], "run_b": runs["B"]}
    _, whole, _ = cli_answer("diff", {**pair, "offset": 0, "brief": False})
    assert "next" not in contract and whole.pop("next") is None
    assert whole == contract
    _, brief, _ = cli_answer("diff", pair)
    assert brief.pop("next") is None and brief == brief_json(contract)
    steps, offset = [], 0
    while offset is not None:
        arguments = {"run_a": runs["A"], "run_b": runs["B"], "offset": offset, "limit": 2}
        _, page, _ = cli_answer("diff", arguments)
        assert len(page["ranks"][0]["steps"]) <= 2
        steps += page["ranks"][0]["steps"]
        offset = page["next"]
    assert steps == contract["ranks"][0]["steps"] and len(steps) == 5


def test_answers_hold_the_facts(over_mcp: dict[str, Any], runs: dict[str, str]) -> None:
    """What an agent reads off the demo: the eps argument, the op pair, its producers back to
    it, the source line, the kernels of the GPU-like copy."""
    answer = {case: over_mcp[case][2] for case, _, _ in CASES}
    first = answer["diff"]["first_divergence"]
    assert first["kind"] == "argument" and first["a"]["index"] == 175

    op = answer["op"]
    assert op["status"] == "differing" and op["args_differ"] == [
        {"name": "eps", "a": 1e-05, "b": 1e-06}
    ]
    inputs = [t for t in op["tensors"] if t["io"] == "in"]
    assert all(t["equal"] and "b" not in t and "values" not in t["a"] for t in inputs)
    out0 = next(t for t in op["tensors"] if t["io"] == "out" and t["slot"] == "0")
    assert not out0["equal"] and out0["a"]["values"] != out0["b"]["values"]
    assert op["tensors_total"] == 6 and answer["op-page"]["tensors"] == op["tensors"][3:5]

    rows = answer["ops"]["rows"]
    assert answer["ops"]["columns"][:3] == ["a", "b", "status"]
    assert rows[3][:3] == [175, 175, "differing"] and len(rows) == 20
    assert all(r[2] != "equal" for r in answer["ops-changed-b"]["rows"])

    hops = answer["producers"]["hops"]
    assert [h["a"]["index"] for h in hops] == [177, 175] and all(h["aligned"] for h in hops)
    assert "eps" in answer["producers"]["end"]
    assert answer["producers-slot"]["hops"][0]["output_equal"] is True

    source = answer["source"]
    assert [n for n, _ in source["lines"]] == [58, 59, 60, 61]
    assert source["lines"][2][1].strip() == "return self.head(self.norm(x))"
    assert source["stack"][-1] == "train_baseline.py:60 (forward)"

    kernels = answer["kernels"]
    assert kernels["total"] == 2 and kernels["next"] == 1
    assert kernels["kernels"][0]["n"].startswith("ampere_sgemm")
    assert (
        answer["kernels-none"]["total"] == 0 and "none recorded" in answer["kernels-none"]["note"]
    )

    assert "evidence" not in answer["explain"] and "eps" in answer["explain"]["evidence_text"]
    tensor = answer["tensor"]["tensors"]
    assert len(tensor) == 1 and 0 < tensor[0]["differing"] <= tensor[0]["elements"]
    replay = answer["replay"]
    assert replay["deterministic"] and replay["matches_a"] and not replay["matches_b"]
    assert [d["name"] for d in replay["b_arguments_differ"]] == ["eps"]
    # The demo's causal mask is filled with -inf, which the softmax makes zeros: intended.
    nan = answer["nan"]["ranks"][0]
    assert (
        nan["first_seen"] is None and nan["intended"]["first"]["op"] == "aten::masked_fill.Scalar"
    )
    rec = answer["record"]
    assert rec["exit_code"] == 0 and rec["ranks"][0]["steps"] == 1 and rec["status"] == "stopped"
    hunt = answer["hunt"]  # step 7's loss scaled in run B: the step, then the op
    assert (hunt["schema"], hunt["step"], hunt["reproduced"]) == ("opguard.hunt/1", 7, True)
    op = hunt["op_level"]["first_divergence"]
    assert op["a"]["op"] == "aten::mul.Tensor" and op["a"]["call_site"]["line"] == line_of(
        LONG, "scale"
    )
    assert hunt["step_level"]["first_divergence"]["cause"] == "loss"
    assert set(hunt["op_level"]) == {"verdict", "first_divergence", "step_level", "notes"}
    assert hunt["runs"]["a_window"].endswith("hunt-mcp/a-window")


@pytest.mark.parametrize(("case", "tool", "arguments", "message"), BAD, ids=[b[0] for b in BAD])
def test_bad_input_is_one_line(
    case: str,
    tool: str,
    arguments: dict[str, Any],
    message: str,
    runs: dict[str, str],
    over_mcp: dict[str, Any],
) -> None:
    code, answer, err = cli_answer(tool, fill(arguments, runs))
    assert code == 2 and answer is None
    assert err.count("\n") == 1 and err.startswith("opguard: error: ") and message in err
    is_error, text, _ = over_mcp[case]
    assert is_error and text.startswith("error: ") and "\n" not in text and message in text


def test_mcp_refuses_bad_calls_and_keeps_serving(over_mcp: dict[str, Any]) -> None:
    expected = {
        "unknown-tool": "error: no tool 'format_disk'",
        "wrong-type": "error: index must be an integer, not 'x'",
        "missing": "error: source needs index",
        "unknown-argument": "error: source has no argument 'colour'",
    }
    for case, start in expected.items():
        is_error, text, _ = over_mcp[case]
        assert is_error and text.startswith(start), (case, text)
    is_error, text, structured = over_mcp["still-serving"]
    assert not is_error and structured["ranks"][0]["ops"] > 0


def test_cli_argument_errors(runs: dict[str, str]) -> None:
    result = run_cli("ops", runs["A"], runs["B"], "175", "--side", "c", "--json")
    assert result.returncode == 2 and result.stderr.count("\n") == 1
    assert "invalid choice: 'c'" in result.stderr


def test_tools_load_neither_torch_nor_a_front_end(runs: dict[str, str], tmp_path: Path) -> None:
    """Listing the tools and answering one from the CLI read traces only: no torch, no MCP SDK
    (imported by `opguard mcp` alone), no Textual or LiteLLM."""
    outcome = cli_without(
        ["torch", "mcp", "textual", "litellm"],
        [["tools"], ["op", runs["A"], runs["B"], "175", "--json"]],
        tmp_path,
    )
    assert outcome["codes"] == [0, 0]
    assert outcome["attempts"] == [] and outcome["loaded"] == []


def test_listing(runs: dict[str, str]) -> None:
    text = run_cli("tools").stdout
    for tool in TOOLS:
        assert f"\n{tool.name:<10} {tool.purpose}\n" in text
        assert tool.usage() in text
    listed = json.loads(run_cli("tools", "--json").stdout)
    assert [t["name"] for t in listed["tools"]] == [t.name for t in TOOLS]
    schemas = {t["name"]: t["input_schema"] for t in listed["tools"]}
    assert schemas["ops"]["required"] == ["run_a", "run_b", "index"]
    assert schemas["hunt"]["required"] == ["output", "a", "b"]


def test_usage_lines_parse(runs: dict[str, str]) -> None:
    """The argv a tool builds is accepted by the real CLI parser, for every parameter."""
    from opguard.cli import build_parser

    parser = build_parser()
    values = {"string": "x", "integer": 1, "number": 0.5, "boolean": True, "array": ["y", "z"]}
    for tool in TOOLS:
        given = {p.name: values[p.kind] for p in tool.all_params if not p.choices}
        given.update({p.name: p.choices[-1] for p in tool.all_params if p.choices})
        if tool.name == "tensor":
            del given["output"]  # --input and --output exclude each other
        parsed = vars(parser.parse_args(tool.argv(given)))
        for p in tool.params:
            if p.flag is not None and p.name in given:  # positionals go by order, flags by name
                dest = p.flag.lstrip("-").replace("-", "_")
                stored = parsed.get(f"arg_{p.name}", parsed.get(p.name, parsed.get(dest)))
                assert str(stored) == str(given[p.name]), (tool.name, p.name)  # explain: strings
        if tool.name == "record":
            assert parsed["target"][-3:] == ["x", "y", "z"]  # script, then its arguments


def test_an_optional_value_is_written_with_its_flag() -> None:
    """``--tolerant`` takes its value only as ``--tolerant=REL`` (alone it means auto): the
    usage line says so, and the command line a tool builds writes it so."""
    from opguard.cli import build_parser

    for name in ("diff", "explain"):
        assert "[--tolerant[=REL]]" in BY_NAME[name].usage()
    diff, runs = BY_NAME["diff"], {"run_a": "a", "run_b": "b"}
    for value, word in (("auto", "--tolerant"), ("1e-3", "--tolerant=1e-3")):
        argv = diff.argv({**runs, "tolerant": value})
        assert argv[:4] == ["diff", "a", "b", word]
        assert build_parser().parse_args(argv).tolerant == value


def test_help_gives_each_default_once() -> None:
    """A parameter's help says what it is, the CLI adds its default: the paged tools' --limit
    said "(default: 20)" twice."""
    from opguard.cli import build_parser

    sub = next(a for a in build_parser()._actions if a.dest == "command")
    for command, parser in sub.choices.items():
        for action in parser._actions:
            assert (action.help or "").count("(default:") <= 1, (command, action.help)
    assert "items in the page (default: 20)" in sub.choices["ops"].format_help()


def test_record_json_forwards_every_record_option() -> None:
    """`record --json` records through the tool: an option of `opguard record` the tool lacks
    would be dropped silently."""
    from opguard.cli import build_parser

    sub = next(a for a in build_parser()._actions if a.dest == "command")
    record = sub.choices["record"]
    options = {a.dest for a in record._actions} - {"help", "json", "target", "run"}
    assert options <= {p.name for p in BY_NAME["record"].params}


def test_oversized_pages_are_cut_with_a_cursor() -> None:
    item = "x" * 1000
    pages = Pages(100, lambda offset, limit: {"items": [item] * limit, "offset": offset})
    answer = page_of(pages, 10, 50)
    text = json.dumps(answer, separators=(",", ":"))
    assert len(text) <= MAX_CHARS and 1 < len(answer["items"]) < 50
    assert answer["next"] == 10 + len(answer["items"]) and "shortened" in answer["cut"]
    whole = page_of(Pages(1, lambda o, n: {"items": ["y" * 5 * MAX_CHARS]}), 0, None)
    assert len(json.dumps(whole, separators=(",", ":"))) <= MAX_CHARS
    assert "truncated" in whole and whole["partial"].startswith('{"items":["yyy')


# -- an agent's walk-through ------------------------------------------------------------------

TOKEN_BUDGET = 4_000


def test_agent_walkthrough_reads_under_4k_tokens(
    tmp_path: Path, count_tokens: Callable[[str], int]
) -> None:
    """Record both demo scripts, diff, look at the op it names, read its source: over MCP, as a
    coding agent would. Tokens are counted by LiteLLM's tokenizer for gpt-4o (o200k, offline:
    the counter the evidence bundle is measured with); JSON is ~2.7 characters a token there,
    so the usual characters/4 rule would undercount by half."""
    a, b = str(tmp_path / "a"), str(tmp_path / "b")

    async def walk() -> list[Reply]:
        async with mcp_session() as session:
            read = [
                await call(
                    session, "record", {"output": a, "script": str(DEMO / "train_baseline.py")}
                ),
                await call(
                    session, "record", {"output": b, "script": str(DEMO / "train_refactored.py")}
                ),
                await call(session, "diff", {"run_a": a, "run_b": b}),
            ]
            index = read[-1].structured["first_divergence"]["a"]["index"]
            read.append(await call(session, "op", {"run_a": a, "run_b": b, "index": index}))
            read.append(await call(session, "source", {"run": a, "index": index}))
            return read

    replies = anyio.run(walk)
    assert not any(r.is_error for r in replies), [r.text for r in replies if r.is_error]
    assert replies[3].structured["args_differ"][0]["name"] == "eps"
    texts = [r.text for r in replies]
    tokens = sum(count_tokens(t) for t in texts)
    print(f"walk-through: {sum(map(len, texts))} characters, {tokens} tokens")
    assert tokens < TOKEN_BUDGET


@pytest.fixture
def count_tokens() -> Iterator[Callable[[str], int]]:
    from opguard.agent.llm import count_tokens as count

    yield lambda text: count("gpt-4o", text=text)
