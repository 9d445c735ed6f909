"""The agent (``opguard explain`` and the TUI's chat): evidence bundle, offline reading, budget,
follow-up tools, secrets.

Providers are real but local: LiteLLM talks to an OpenAI-compatible server on 127.0.0.1
(tests/llm_stub.py) or answers with its own ``mock_response``; nothing leaves the machine. The
bundle's size is checked on every scenario pair of the suite, reusing its recordings.
"""

from __future__ import annotations

import html
import json
import os
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
import torch
import torch.nn.functional as F
from conftest import run_cli
from llm_stub import Answer, StubProvider, stub_provider
from scenario_runs import PAIRS, Recordings, session_recordings
from test_docs import assert_specified
from test_imports import BLOCKER, _explain, cli_without
from textual.app import App, ComposeResult
from textual.containers import Vertical
from textual.reactive import reactive
from textual.widgets import Input, Markdown, Static

import opguard
from opguard.agent import (
    TOOLS,
    AgentSettings,
    CallPlanned,
    CallSettled,
    ConfigError,
    LiteLLMCompletion,
    ProviderError,
    Reply,
    Request,
    Secret,
    TextPiece,
    TraceTools,
    Usage,
    open_session,
    resolve_settings,
)
from opguard.agent.config import KEYLESS_SERVER_KEY
from opguard.agent.evidence import COUNT_MODEL
from opguard.agent.llm import count_tokens, missing_keys
from opguard.agent.panel import AgentChat
from opguard.analysis import diff_runs
from opguard.cli import main
from opguard.store import Run
from opguard.tools.explanation import SCHEMA as EXPLAIN_SCHEMA

KEY = "sk-opguard-PLANTED-7f3a9c1e5b2d"
IN_PRICE, OUT_PRICE = 2.0, 8.0  # USD per million tokens, for the stub model
MAX_OUTPUT = 2048  # the default output limit of a call
BUNDLE_LIMIT = 1500
ESTIMATE_ERROR = 0.1  # the offline token estimate, relative to LiteLLM's count
SCRIPTED_USAGE = Usage(400, 25)


def usd(prompt: int, completion: int) -> float:
    return (prompt * IN_PRICE + completion * OUT_PRICE) / 1e6


@pytest.fixture(autouse=True)
def no_user_settings(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A developer's own config file, model and keys never reach a test."""
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    for name in ("OPGUARD_MODEL", "OPGUARD_API_BASE", "OPENAI_API_KEY", "GROQ_API_KEY"):
        monkeypatch.delenv(name, raising=False)


# -- two tiny runs that differ in their learning rate --------------------------------------------


def train(run_dir: Path, lr: float) -> Path:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    x, y = torch.randn(6, 4), torch.randn(6, 2)
    with opguard.record(run_dir):
        for _ in range(2):
            loss = F.mse_loss(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
    return run_dir


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("agent")
    return {
        "a": train(root / "a", 0.1),
        "b": train(root / "b", 0.2),
        "same": train(root / "same", 0.1),
    }


@pytest.fixture(scope="module")
def divergent_op(tiny: dict[str, Path]) -> int:
    with Run(tiny["a"]) as a, Run(tiny["b"]) as b:
        first = diff_runs(a, b).first
    assert first is not None and first.a is not None
    return first.a.index


def explain(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """``opguard explain ARGS`` in this process: exit status, stdout, stderr."""
    with pytest.raises(SystemExit) as exit_:
        main(["explain", *args])
    captured = capsys.readouterr()
    return int(exit_.value.code or 0), captured.out, captured.err


def ask(
    capsys: pytest.CaptureFixture[str], tiny: dict[str, Path], stub: StubProvider, *extra: str
) -> tuple[int, str, str]:
    """``opguard explain`` of the tiny pair against the stub provider."""
    provider = ("--model", "openai/stub", "--api-base", stub.url, "--api-key", KEY)
    prices = ("--input-price", str(IN_PRICE), "--output-price", str(OUT_PRICE))
    return explain(capsys, str(tiny["a"]), str(tiny["b"]), *provider, *prices, *extra)


class Scripted:
    """An injected completion: answers each request with the next reply, in pieces."""

    def __init__(self, *replies: str | Exception, usage: Usage | None = SCRIPTED_USAGE) -> None:
        self.replies = list(replies)
        self.usage = usage
        self.requests: list[Request] = []

    def __call__(self, request: Request) -> Any:
        self.requests.append(request)
        reply = self.replies.pop(0)
        if isinstance(reply, Exception):
            raise reply
        yield from re.split(r"(?<= )", reply)  # word by word
        yield Reply(reply, usage=self.usage)


# -- the evidence bundle on every scenario pair ---------------------------------------------------


@pytest.fixture(scope="module")
def scenarios(tmp_path_factory: pytest.TempPathFactory) -> Recordings:
    recordings = session_recordings(tmp_path_factory)
    recordings(*dict.fromkeys(name for pair in PAIRS for name in pair))  # all at once, in parallel
    return recordings


# What a reader must find in each pair's bundle.
FACTS = {
    "rerun": ["verdict: identical"],
    "lr": ["argument alpha: -0.1 (A) vs -0.2 (B)", "optimizer"],
    "init_seed": ["RNG state consumed: differs", "random op with a different RNG state"],
    "seed": ["RNG state consumed: differs", "aten::bernoulli_"],
    "no_zero_grad": ["zero_grad", "ops in one run only, step 1"],
    "eval": ["op only in run A feeds the divergence", "h = self.drop(h)"],
    "gelu_tanh": ["argument `approximate` differs: 'none' vs 'tanh'", 'approximate="tanh"'],
    "loss_scaled": ["op only in run B feeds the divergence", "loss = loss / ACCUMULATION"],
    "logging": ["verdict: identical", "only in B"],
    "refactor": ["verdict: identical"],
    "gpt2_eps": ["argument eps: 1e-05 (A) vs 1e-06 (B)", "reached from gpt2_base.py"],
    "item_log": ["verdict: identical"],
    "stats_twice": ["verdict: identical"],
    "peaks_3": ["verdict: identical"],
    "reorder_2": ["verdict: identical"],
    "deeper": ["op only in run B feeds the divergence", "h = torch.relu(self.fc2(h))"],
    "workspace_ballast": ["verdict: identical"],
    "workspace_ballast_lr": ["argument alpha: -0.1 (A) vs -0.2 (B)", "optimizer"],
}


@pytest.mark.slow  # records the scenario suite, unless test_scenarios.py did in this session
@pytest.mark.parametrize(("a", "b"), PAIRS, ids=[b for _, b in PAIRS])
def test_bundle_fits_and_holds_the_facts(scenarios: Recordings, a: str, b: str) -> None:
    run_a, run_b = scenarios(a, b)
    with Run(run_a) as ra, Run(run_b) as rb:
        result = diff_runs(ra, rb)
        evidence = open_session(result, ra, rb, AgentSettings()).evidence
        again = open_session(diff_runs(ra, rb), ra, rb, AgentSettings()).evidence
    counted = count_tokens(COUNT_MODEL, text=evidence.text)
    assert counted <= BUNDLE_LIMIT, evidence.text
    assert evidence.estimated and evidence.token_model == "groq/openai/gpt-oss-20b"
    assert abs(evidence.tokens - counted) <= ESTIMATE_ERROR * counted, (evidence.tokens, counted)
    assert (again.text, again.data) == (evidence.text, evidence.data)  # deterministic
    for fact in FACTS[b]:
        assert fact in evidence.text, (fact, evidence.text)
    json.dumps(evidence.to_json())  # plain JSON


# -- offline: the rule-based reading ----------------------------------------------------------------


def test_no_model_prints_bundle_reading_and_how_to_enable(
    capsys: pytest.CaptureFixture[str], tiny: dict[str, Path]
) -> None:
    code, out, err = explain(capsys, str(tiny["a"]), str(tiny["b"]))
    assert code == 1, err
    assert "argument `alpha` differs: -0.1 vs -0.2" in out
    assert "## reading (rules)" in out and "evidence: " in out
    assert "No model configured" in out and "--model groq/openai/gpt-oss-20b" in out


def test_no_model_json(capsys: pytest.CaptureFixture[str], tiny: dict[str, Path]) -> None:
    code, out, _ = explain(capsys, str(tiny["a"]), str(tiny["b"]), "--json")
    report = json.loads(out)
    assert code == 1 and report["schema"] == "opguard.explain/1"
    assert report["agent"] is None and "--model" in report["how_to_enable"]
    evidence = report["evidence"]
    assert evidence["first_divergence"]["arguments_differ"][0]["name"] == "alpha"
    assert evidence["reading"]
    counted = count_tokens(COUNT_MODEL, text=report["evidence_text"])
    tokens = evidence["tokens"]
    assert tokens["estimated"] and tokens["model"] == COUNT_MODEL
    assert abs(tokens["count"] - counted) <= ESTIMATE_ERROR * counted, (tokens, counted)


def test_offline_reading_imports_no_llm_library(tiny: dict[str, Path], tmp_path: Path) -> None:
    """Without a model, ``explain`` never imports LiteLLM (seconds of start-up), not even
    behind a guard: its token count is an estimate."""
    a, b, same = (str(tiny[name]) for name in ("a", "b", "same"))
    outcome = cli_without(
        ["litellm"],
        [["explain", a, b], ["explain", a, b, "--json"], ["explain", a, same]],
        tmp_path,
    )
    assert outcome["codes"] == [1, 1, 0]
    assert outcome["attempts"] == [], _explain(outcome)
    assert outcome["loaded"] == []


def test_without_litellm_the_reading_works_and_a_model_is_one_line(
    tiny: dict[str, Path], tmp_path: Path
) -> None:
    """``opguard explain`` where ``import litellm`` fails (a meta-path blocker installed by a
    sitecustomize on PYTHONPATH): the offline reading as usual, exit status as the verdict
    says; asking a model, one line saying to install LiteLLM."""
    (tmp_path / "sitecustomize.py").write_text(f"FORBIDDEN = ['litellm']\n{BLOCKER}")
    env = {"PYTHONPATH": str(tmp_path)}
    probe = subprocess.run(
        [sys.executable, "-c", "import litellm"], env={**os.environ, **env}, capture_output=True
    )
    assert probe.returncode == 1 and b"refused by the test" in probe.stderr  # the blocker works
    a, b, same = (str(tiny[name]) for name in ("a", "b", "same"))
    diverged = run_cli("explain", a, b, cwd=tmp_path, env=env)
    assert diverged.returncode == 1 and diverged.stderr == "", diverged.stderr
    assert "argument `alpha` differs: -0.1 vs -0.2" in diverged.stdout
    identical = run_cli("explain", a, same, "--json", cwd=tmp_path, env=env)
    assert identical.returncode == 0 and json.loads(identical.stdout)["verdict"] == "identical"
    model = ("--model", "groq/openai/gpt-oss-20b")
    asked = run_cli("explain", a, b, *model, cwd=tmp_path, env=env)
    assert asked.returncode == 2 and asked.stderr.count("\n") == 1, asked.stderr
    assert asked.stderr.startswith("opguard: error: asking a model needs LiteLLM")
    assert "pip install litellm" in asked.stderr and "Traceback" not in asked.stderr


def test_identical_runs_call_no_model(
    capsys: pytest.CaptureFixture[str], tiny: dict[str, Path]
) -> None:
    with stub_provider(Answer(text=("never",))) as stub:
        code, out, _ = explain(
            capsys,
            str(tiny["a"]),
            str(tiny["same"]),
            "--model",
            "openai/stub",
            "--api-base",
            stub.url,
            "--input-price",
            "1",
            "--output-price",
            "1",
        )
    assert code == 0 and "identical" in out
    assert stub.requests == []


# -- the budget ------------------------------------------------------------------------------------


def test_bound_is_computed_before_sending(tiny: dict[str, Path]) -> None:
    with (
        stub_provider(Answer(text=("The ", "learning rate."), usage=(900, 12))) as stub,
        Run(tiny["a"]) as ra,
        Run(tiny["b"]) as rb,
    ):
        settings = AgentSettings(
            model="openai/stub",
            api_base=stub.url,
            api_key=Secret(KEY),
            input_price=IN_PRICE,
            output_price=OUT_PRICE,
        )
        agent = open_session(diff_runs(ra, rb), ra, rb, settings).agent
        assert agent is not None
        events = agent.ask()
        planned = next(events)
        assert isinstance(planned, CallPlanned) and stub.requests == []  # bound first, then send
        prompt = count_tokens("openai/stub", messages=agent.messages, tools=TOOLS)
        assert planned.bound.prompt_tokens == prompt
        assert planned.bound.usd == pytest.approx(usd(prompt, MAX_OUTPUT))
        rest = list(events)
    (request,) = stub.requests
    assert [m["content"] for m in request["body"]["messages"]] == [
        m["content"] for m in agent.messages[:2]
    ]
    assert request["body"]["max_tokens"] == MAX_OUTPUT  # the output the bound allowed for
    assert "".join(e.text for e in rest if isinstance(e, TextPiece)) == "The learning rate."
    (settled,) = [e for e in rest if isinstance(e, CallSettled)]
    assert (settled.charge.prompt_tokens, settled.charge.completion_tokens) == (900, 12)
    assert agent.budget.spent_usd == pytest.approx(usd(900, 12))


def test_spend_is_reported(capsys: pytest.CaptureFixture[str], tiny: dict[str, Path]) -> None:
    with stub_provider(Answer(text=("Check ", "`lr`."), usage=(1000, 50))) as stub:
        code, out, err = ask(capsys, tiny, stub)
    assert code == 1, err
    lines = out.splitlines()
    bound_line = next(n for n, line in enumerate(lines) if line.startswith("· call 1: at most $"))
    answer_line = next(n for n, line in enumerate(lines) if "Check `lr`." in line)
    assert lines[0].startswith("evidence: ") and bound_line < answer_line
    assert f"${usd(1000, 50):.6f} (1,000 input + 50 output tokens)" in out
    assert f"spent ${usd(1000, 50):.6f} of $0.05" in out


def test_spend_in_json(capsys: pytest.CaptureFixture[str], tiny: dict[str, Path]) -> None:
    with stub_provider(Answer(text=("Check lr.",), usage=(1000, 50))) as stub:
        code, out, _ = ask(capsys, tiny, stub, "--json", "--budget", "0.5", "--max-tokens", "9000")
    agent = json.loads(out)["agent"]
    assert code == 1 and agent["answer"] == "Check lr."
    (call,) = agent["calls"]
    assert call["usd"] == pytest.approx(usd(1000, 50)) and call["estimated"] is False
    assert call["bound_usd"] == pytest.approx(usd(call["prompt_tokens"], MAX_OUTPUT))
    assert agent["spent_usd"] == pytest.approx(usd(1000, 50)) and agent["spent_tokens"] == 1050
    assert (agent["budget_usd"], agent["max_tokens"]) == (0.5, 9000)
    assert agent["pricing"]["source"] == "as configured"


@pytest.mark.parametrize(
    ("limit", "reason"),
    [
        (("--budget", "0.000001"), "of the $1e-06 budget is left"),
        (("--max-tokens", "500"), "-token limit are left"),
    ],
)
def test_over_budget_call_is_never_sent(
    capsys: pytest.CaptureFixture[str], tiny: dict[str, Path], limit: tuple[str, str], reason: str
) -> None:
    with stub_provider(Answer(text=("never",))) as stub:
        code, out, err = ask(capsys, tiny, stub, *limit)
    assert stub.requests == []  # the server saw nothing
    assert code == 2 and "· call 1: at most $" in out  # the bound was shown
    assert err.count("\n") == 1 and "call refused, not sent" in err and reason in err


def test_usage_not_reported_is_estimated(tiny: dict[str, Path]) -> None:
    """A completion that reports no usage (LiteLLM fills in its own count when a provider
    does not) is charged by OpGuard's count, marked estimated."""
    with Run(tiny["a"]) as ra, Run(tiny["b"]) as rb:
        settings = AgentSettings(model="openai/stub", input_price=IN_PRICE, output_price=OUT_PRICE)
        complete = Scripted("Check the learning rate.", usage=None)
        agent = open_session(diff_runs(ra, rb), ra, rb, settings, complete).agent
        assert agent is not None
        events = list(agent.ask())
    planned, settled = (e for e in events if isinstance(e, (CallPlanned, CallSettled)))
    assert isinstance(planned, CallPlanned) and isinstance(settled, CallSettled)
    assert settled.charge.estimated
    assert settled.charge.prompt_tokens == planned.bound.prompt_tokens
    assert 0 < settled.charge.completion_tokens < 10


def test_unknown_price_is_refused(
    capsys: pytest.CaptureFixture[str], tiny: dict[str, Path]
) -> None:
    with stub_provider(Answer(text=("never",))) as stub:
        code, _, err = explain(
            capsys, str(tiny["a"]), str(tiny["b"]), "--model", "openai/stub", "--api-base", stub.url
        )
    assert code == 2 and "no price is known" in err and "--input-price" in err
    assert stub.requests == []


def test_litellm_mock_response_priced_from_the_cost_map(tiny: dict[str, Path]) -> None:
    with Run(tiny["a"]) as ra, Run(tiny["b"]) as rb:
        settings = AgentSettings(model="groq/openai/gpt-oss-20b", api_key=Secret(KEY))
        complete = LiteLLMCompletion(mock_response="The learning rate doubled.")
        agent = open_session(diff_runs(ra, rb), ra, rb, settings, complete).agent
        assert agent is not None
        events = list(agent.ask())
    assert (
        "".join(e.text for e in events if isinstance(e, TextPiece)) == "The learning rate doubled."
    )
    (settled,) = [e for e in events if isinstance(e, CallSettled)]
    charge = settled.charge
    assert not charge.estimated and charge.completion_tokens > 0
    assert charge.usd == pytest.approx(
        charge.prompt_tokens * 7.5e-08 + charge.completion_tokens * 3e-07
    )
    assert agent.budget.pricing.source == "LiteLLM's cost map"


# -- provider keys, checked before the first call ------------------------------------------------


def test_missing_provider_key_is_named_before_any_call(
    capsys: pytest.CaptureFixture[str], tiny: dict[str, Path]
) -> None:
    """GROQ_API_KEY unset: one line naming it, before a call is even planned (it used to come
    back as LiteLLM's error from the failed request)."""
    code, out, err = explain(capsys, str(tiny["a"]), str(tiny["b"]), "--model", COUNT_MODEL)
    assert code == 2 and err.count("\n") == 1, err
    assert "needs GROQ_API_KEY, which is not set" in err and "--api-key" in err
    assert "· call" not in out


def test_local_server_needs_no_key(
    capsys: pytest.CaptureFixture[str], tiny: dict[str, Path]
) -> None:
    """The README's local-server line, as written: no key anywhere (OPENAI_API_KEY unset)."""
    with stub_provider(Answer(text=("The learning rate doubled.",))) as stub:
        code, out, err = explain(
            capsys,
            str(tiny["a"]),
            str(tiny["b"]),
            *("--model", "openai/qwen", "--api-base", stub.url),
            *("--input-price", "0", "--output-price", "0"),
        )
    assert code == 1, err
    assert "The learning rate doubled." in out and "spent $0.000000" in out
    (request,) = stub.requests
    headers = {k.lower(): v for k, v in request["headers"].items()}
    assert headers["authorization"] == f"Bearer {KEYLESS_SERVER_KEY}"


def test_keys_are_litellms_knowledge_of_the_provider(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("ANTHROPIC_API_KEY", "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(name, raising=False)
    anthropic = AgentSettings(model="anthropic/claude-sonnet-4-5")
    with pytest.raises(ConfigError, match="needs ANTHROPIC_API_KEY, which is not set: set it "):
        anthropic.for_provider(missing_keys)
    with pytest.raises(ConfigError, match="AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, which are"):
        AgentSettings(model="bedrock/anthropic.claude-v2").for_provider(missing_keys)
    given = AgentSettings(model="anthropic/claude-sonnet-4-5", api_key=Secret(KEY))
    assert given.for_provider(missing_keys) is given  # a key given stands in for the variable
    served = AgentSettings(model="openai/qwen", api_base="http://127.0.0.1:8000/v1")
    placeholder = served.for_provider(missing_keys).api_key
    assert placeholder is not None and placeholder.reveal() == KEYLESS_SERVER_KEY
    monkeypatch.setenv("ANTHROPIC_API_KEY", KEY)
    assert anthropic.for_provider(missing_keys) is anthropic  # LiteLLM reads it itself


# -- follow-up tools ------------------------------------------------------------------------------


def test_tool_calls_are_answered_from_the_trace_and_counted(
    capsys: pytest.CaptureFixture[str], tiny: dict[str, Path], divergent_op: int
) -> None:
    asks = (
        ("neighbours", {"run": "a", "index": divergent_op, "before": 2, "after": 1}),
        ("producer", {"run": "b", "index": divergent_op, "slot": "other"}),
    )
    with stub_provider(
        Answer(tool_calls=asks, usage=(300, 30)), Answer(text=("lr doubled",), usage=(700, 40))
    ) as stub:
        code, out, _ = ask(capsys, tiny, stub, "--json")
    report = json.loads(out)
    agent = report["agent"]
    assert code == 1 and agent["answer"] == "lr doubled"
    assert_specified(EXPLAIN_SCHEMA, report, elsewhere={"evidence"})  # test_docs: the rest
    _, second = (r["body"] for r in stub.requests)
    answers = {m["tool_call_id"]: m["content"] for m in second["messages"] if m["role"] == "tool"}
    assert f"> #{divergent_op} aten::add_.Tensor" in answers["call_0"]
    assert len(answers["call_0"].splitlines()) == 4  # 2 before, the op, 1 after
    assert answers["call_1"].startswith(f"input other of #{divergent_op} is output")
    assert [t["name"] for t in agent["tools"]] == ["neighbours", "producer"]
    assert all(t["tokens"] > 0 for t in agent["tools"])
    bounds = [c["prompt_tokens"] for c in agent["calls"]]
    assert bounds[1] > bounds[0] + sum(t["tokens"] for t in agent["tools"]) - 10  # answers counted
    assert agent["spent_usd"] == pytest.approx(usd(300, 30) + usd(700, 40))


def test_tool_rounds_are_bounded(capsys: pytest.CaptureFixture[str], tiny: dict[str, Path]) -> None:
    keeps_asking = Answer(
        tool_calls=(("kernels", {"run": "a", "index": 0}),), text=("still looking",)
    )
    with stub_provider(keeps_asking) as stub:
        code, out, _ = ask(capsys, tiny, stub, "--rounds", "2", "--json")
    assert code == 1 and len(stub.requests) == 3  # two rounds of tools, then an answer
    assert [("tools" in r["body"]) for r in stub.requests] == [True, True, False]
    tool_answers = [
        m["content"] for m in stub.requests[-1]["body"]["messages"] if m["role"] == "tool"
    ]
    assert tool_answers and all(a.startswith("no kernels recorded for #0") for a in tool_answers)
    assert len(json.loads(out)["agent"]["calls"]) == 3


def test_tool_errors_are_answers(tiny: dict[str, Path]) -> None:
    with Run(tiny["a"]) as ra, Run(tiny["b"]) as rb:
        tools = TraceTools(ra, rb, 0)
        assert (
            tools.call("producer", {"run": "c", "index": 1, "slot": "x"})
            == "error: run must be 'a' or 'b'"
        )
        assert tools.call("neighbours", {"run": "a", "index": "x"}).startswith(
            "error: index must be an integer"
        )
        assert "no op 99999" in tools.call("kernels", {"run": "a", "index": 99999})
        assert tools.call("format_disk", {}).startswith("error: no tool 'format_disk'")
        assert "has no input 'nope'" in tools.call(
            "producer", {"run": "a", "index": 1, "slot": "nope"}
        )
        source = tools.call("source", {"run": "a", "index": 1, "before": 1, "after": 1})
    lines = source.splitlines()  # where, then the call line and one line either side
    assert lines[0].endswith(f"in {train.__name__}") and len(lines) == 4
    assert [line.startswith(">") for line in lines[1:]] == [False, True, False]


# -- provider errors and secrets ---------------------------------------------------------------------


def test_provider_error_is_one_line_without_the_key(
    capsys: pytest.CaptureFixture[str], tiny: dict[str, Path]
) -> None:
    with stub_provider(Answer(error=(401, f"Incorrect API key provided: {KEY}"))) as stub:
        code, out, err = ask(capsys, tiny, stub)
    headers = {k.lower(): v for k, v in stub.requests[0]["headers"].items()}
    assert headers["authorization"] == f"Bearer {KEY}"  # the key was used ...
    assert code == 2 and err.count("\n") == 1 and "Incorrect API key provided" in err
    assert KEY not in out + err and "[redacted]" in err  # ... and never shown


def test_planted_key_never_appears(
    capsys: pytest.CaptureFixture[str],
    tiny: dict[str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    config = tmp_path / "config" / "opguard" / "config.toml"
    config.parent.mkdir(parents=True)
    config.write_text(
        f'[agent]\nmodel = "openai/stub"\napi_key = "{KEY}"\ninput_price = 1\noutput_price = 2\n'
    )
    config.chmod(0o600)
    outputs = []
    with stub_provider(
        Answer(tool_calls=(("source", {"run": "a", "index": 0}),)),
        Answer(text=("ok",)),
        Answer(error=(500, f"upstream rejected {KEY}")),
    ) as stub:
        monkeypatch.setenv("OPGUARD_API_BASE", stub.url)
        for extra in (["--json"], [], ["--json"]):
            outputs.append(explain(capsys, str(tiny["a"]), str(tiny["b"]), *extra))
    assert [code for code, _, _ in outputs] == [1, 2, 2]
    assert all(KEY not in out + err for _, out, err in outputs)
    assert all(KEY not in json.dumps(r["body"]) for r in stub.requests)  # not even to the model
    settings = resolve_settings({})
    assert (
        KEY not in repr(settings) + str(settings)
        and settings.api_key
        and settings.api_key.reveal() == KEY
    )
    for run in tiny.values():  # nothing of the agent's reaches a trace
        for path in run.rglob("*"):
            assert not path.is_file() or KEY.encode() not in path.read_bytes()


def test_config_file_readable_by_others_is_refused(
    capsys: pytest.CaptureFixture[str], tiny: dict[str, Path], tmp_path: Path
) -> None:
    config = tmp_path / "config" / "opguard" / "config.toml"
    config.parent.mkdir(parents=True)
    config.write_text(f'[agent]\nmodel = "openai/stub"\napi_key = "{KEY}"\n')
    config.chmod(0o644)
    code, out, err = explain(capsys, str(tiny["a"]), str(tiny["b"]))
    assert code == 2 and "chmod 600" in err and "mode 644" in err
    assert KEY not in out + err


def test_settings_precedence(tmp_path: Path) -> None:
    config = tmp_path / "config.toml"
    config.write_text('[agent]\nmodel = "from-file"\nbudget = 0.5\nrounds = 1\n')
    config.chmod(0o600)
    env = {"OPGUARD_MODEL": "from-env"}
    assert resolve_settings({}, env, config).model == "from-env"
    chosen = resolve_settings({"model": "from-flag", "rounds": "2"}, env, config)
    assert (chosen.model, chosen.budget, chosen.rounds) == ("from-flag", 0.5, 2)
    with pytest.raises(ConfigError, match="budget from --budget"):
        resolve_settings({"budget": "-1"}, env, config)
    config.write_text('[agent]\nmodle = "typo"\n')
    with pytest.raises(ConfigError, match="unknown setting"):
        resolve_settings({}, {}, config)


# -- the TUI's chat panel ---------------------------------------------------------------------------


class Holder(Vertical):
    """Stands in for the TUI's agent panel: a container with a ``selection`` reactive."""

    selection: reactive[Any] = reactive(None, always_update=True)


class ChatApp(App[None]):
    def __init__(self, chat: AgentChat) -> None:
        super().__init__()
        self.chat = chat

    def compose(self) -> ComposeResult:
        yield Holder(id="agent-panel")

    async def on_mount(self) -> None:
        await self.query_one("#agent-panel").mount(self.chat)


async def settle(app: App[None], pilot: Any) -> None:
    await app.workers.wait_for_complete()
    await pilot.pause()


def chat_for(tiny: dict[str, Path], complete: Scripted | None, **settings: Any) -> AgentChat:
    ra, rb = Run(tiny["a"]), Run(tiny["b"])
    chosen = (
        AgentSettings(model="openai/stub", input_price=IN_PRICE, output_price=OUT_PRICE, **settings)
        if complete
        else AgentSettings()
    )
    return AgentChat.for_runs(ra, rb, settings=chosen, complete=complete)


async def submit(app: App, pilot: Any, question: str) -> Input:
    """Types ``question`` into the panel's box, submits it and waits for the panel to settle."""
    box = app.query_one("#agent-question", Input)
    box.value = question
    await box.action_submit()
    await settle(app, pilot)
    return box


def shown_error(app: App) -> str:
    return str(app.query_one("#agent-error", Static).render())


async def test_panel_streams_the_answer_about_the_selected_op(
    tiny: dict[str, Path], divergent_op: int
) -> None:
    complete = Scripted("The learning rate doubled.")
    app = ChatApp(chat_for(tiny, complete))
    async with app.run_test() as pilot:
        await settle(app, pilot)
        app.query_one(Holder).selection = SimpleNamespace(
            rank=0, op_a=divergent_op, op_b=divergent_op
        )
        placeholder = app.query_one("#agent-question", Input).placeholder
        assert placeholder == f"Ask about op #{divergent_op} of run A"
        box = await submit(app, pilot, "Why does this op differ?")
        answer = app.query_one("#agent-answer", Markdown).source
        meter = str(app.query_one("#agent-meter", Static).render())
    assert "The learning rate doubled." in answer and "**Why does this op differ?**" in answer
    question = complete.requests[0].messages[-1]["content"]
    assert f"#{divergent_op} aten::add_.Tensor" in question and "Evidence:" in question
    assert f"${usd(400, 25):.6f} spent" in meter and "cap $0.05" in meter
    assert box.value == ""  # answered: the box is cleared


async def test_panel_shows_a_refusal_and_keeps_the_question(tiny: dict[str, Path]) -> None:
    complete = Scripted("never")
    app = ChatApp(chat_for(tiny, complete, budget=1e-6))
    async with app.run_test() as pilot:
        await settle(app, pilot)
        box = await submit(app, pilot, "What changed?")
        assert "call refused, not sent" in shown_error(app) and box.value == "What changed?"
    assert complete.requests == []


async def test_panel_shows_a_provider_error(tiny: dict[str, Path]) -> None:
    complete = Scripted(ProviderError("RateLimitError: slow down [redacted]"), "Now it works.")
    app = ChatApp(chat_for(tiny, complete))
    async with app.run_test() as pilot:
        await settle(app, pilot)
        box = await submit(app, pilot, "What changed?")
        # shown as text, not markup
        assert "RateLimitError: slow down [redacted]" in shown_error(app)
        assert box.value == "What changed?"
        await box.action_submit()  # asked again: the conversation was left clean
        await settle(app, pilot)
        assert "Now it works." in app.query_one("#agent-answer", Markdown).source
        assert not app.query_one("#agent-error").has_class("-shown")
    assert [m["role"] for m in complete.requests[1].messages] == ["system", "user"]


async def test_panel_without_a_model_shows_the_reading(tiny: dict[str, Path]) -> None:
    app = ChatApp(chat_for(tiny, None))
    async with app.run_test() as pilot:
        await settle(app, pilot)
        answer = app.query_one("#agent-answer", Markdown).source
        assert "argument `alpha` differs" in answer and "--model" in answer
        assert app.query_one("#agent-question", Input).disabled


def shown_text(app: App) -> str:
    """The screen as text (what a person reads, after Markdown rendering)."""
    svg = app.export_screenshot()
    return html.unescape(re.sub(r"<[^>]+>", "", svg)).replace("\xa0", " ")


async def test_panel_shows_the_reading_as_written(tiny: dict[str, Path]) -> None:
    """The reading is text with `code`: a function named ``<module>`` or ``__init__`` in it is
    shown as it is (Markdown took the one for an HTML tag and dropped it, the other for bold)."""
    chat = chat_for(tiny, None)
    opened = chat.opener

    def opener() -> Any:
        session = opened()
        session.evidence.data["reading"] = [
            "op only in run B feeds it: #9 at cnn.py:32 (<module>), #3 at cnn.py:11 (__init__)",
            "argument `a<b>` differs",
        ]
        return session

    chat.opener = opener
    app = ChatApp(chat)
    async with app.run_test(size=(160, 30)) as pilot:
        await settle(app, pilot)
        shown = shown_text(app)
    assert "cnn.py:32 (<module>), #3 at cnn.py:11 (__init__)" in shown, shown
    assert "argument a<b> differs" in shown, shown


async def test_panel_names_a_missing_key(tiny: dict[str, Path]) -> None:
    """The TUI's panel checks the key as ``explain`` does (the same session code)."""
    chat = AgentChat.for_runs(
        Run(tiny["a"]), Run(tiny["b"]), settings=AgentSettings(model=COUNT_MODEL)
    )
    app = ChatApp(chat)
    async with app.run_test() as pilot:
        await settle(app, pilot)
        assert "needs GROQ_API_KEY, which is not set" in shown_error(app)
        assert app.query_one("#agent-question", Input).disabled


def test_recorder_store_and_cli_start_without_the_agent(tmp_path: Path) -> None:
    """The agent is a front end: recording and reading traces never import it, and building
    the command line imports neither it nor LiteLLM (``explain`` imports the agent when it runs,
    and LiteLLM only to ask a model)."""
    probe = (
        "import sys, opguard.recorder, opguard.store\n"
        "def loaded(): return sorted(m for m in sys.modules if m.partition('.')[0] == 'litellm'"
        " or m.startswith('opguard.agent'))\n"
        "print(loaded())\n"
        "import opguard.cli; opguard.cli.build_parser()\n"
        "print(loaded())"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, cwd=tmp_path, timeout=120
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["[]", "[]"]
