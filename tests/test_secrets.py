"""Secrets never leak: keys planted in the environment of a recording and in the agent's config
file are found in nothing OpGuard writes or prints: trace files (every byte of ``data.mdb``),
``meta.json``, stdout and stderr of ``record``, ``show``, ``diff`` and ``explain`` (text and
JSON, answers and provider errors), nor in what is sent to the model (only the request's
Authorization header carries the key). The recorded environment holds the allow-list only.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import cli_in_process as cli
from llm_stub import Answer, stub_provider

from opguard.store import Run
from opguard.store.meta import ENV_ALLOW_LIST

ENV_KEY = "sk-opguard-ENV-LEAKCHECK-3b9d7e21"  # in the recording's and the agent's environment
FILE_KEY = "gsk-opguard-FILE-LEAKCHECK-a41c08f5"  # in the config file
KEYS = (ENV_KEY, FILE_KEY)
PLANTED_ENV = {
    "OPENAI_API_KEY": ENV_KEY,
    "GROQ_API_KEY": ENV_KEY,
    "ANTHROPIC_API_KEY": ENV_KEY,
    "HF_TOKEN": ENV_KEY,
    "AWS_SECRET_ACCESS_KEY": ENV_KEY,
    "WANDB_API_KEY": ENV_KEY,
    "MY_SERVICE_PASSWORD": ENV_KEY,
}
ALLOWED = {"CUBLAS_WORKSPACE_CONFIG": ":4096:8", "OMP_NUM_THREADS": "1"}

SCRIPT = """
import sys
import torch

torch.manual_seed(0)
model = torch.nn.Linear(4, 2)
opt = torch.optim.SGD(model.parameters(), lr=float(sys.argv[1]))
for _ in range(2):
    loss = model(torch.ones(3, 4)).square().mean()
    opt.zero_grad()
    loss.backward()
    opt.step()
    print("loss", loss.item())
"""


def leaks(text: str | bytes) -> list[str]:
    data = text.encode() if isinstance(text, str) else text
    return [key for key in KEYS if key.encode() in data]


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path, list[str]]]:
    """Two recordings (different learning rates) made with the keys in their environment; and
    everything the recordings printed."""
    root = tmp_path_factory.mktemp("secrets")
    (root / "train.py").write_text(SCRIPT)
    env = {**os.environ, **PLANTED_ENV, **ALLOWED}
    printed = []
    runs = []
    for name, lr in (("a", "0.1"), ("b", "0.2")):
        command = ["record", "-o", str(root / name), "--", str(root / "train.py"), lr]
        result = subprocess.run(
            [sys.executable, "-m", "opguard", *command],
            cwd=root,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert result.returncode == 0, result.stderr
        printed += [result.stdout, result.stderr]
        runs.append(root / name)
    yield runs[0], runs[1], printed


@pytest.fixture
def agent_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    """The keys in this process's environment and in a config file that only its owner reads."""
    for name, value in PLANTED_ENV.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("XDG_CONFIG_HOME", str(tmp_path / "config"))
    monkeypatch.delenv("OPGUARD_MODEL", raising=False)
    monkeypatch.delenv("OPGUARD_API_BASE", raising=False)
    config = tmp_path / "config" / "opguard" / "config.toml"
    config.parent.mkdir(parents=True)
    config.write_text(f'[agent]\napi_key = "{FILE_KEY}"\ninput_price = 1\noutput_price = 2\n')
    config.chmod(0o600)
    return config


def test_recorded_environment_is_the_allow_list(recorded: tuple[Path, Path, list[str]]) -> None:
    run_a, _, _ = recorded
    with Run(run_a) as run:
        env = run.meta["env"]
    assert set(env) <= set(ENV_ALLOW_LIST)
    assert {k: env[k] for k in ALLOWED} == ALLOWED  # what changes numerics is kept
    assert not set(PLANTED_ENV) & set(env)


def test_planted_keys_are_in_nothing_written_or_printed(
    recorded: tuple[Path, Path, list[str]], agent_env: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    run_a, run_b, printed = recorded
    a, b = str(run_a), str(run_b)
    outputs = list(printed)
    commands = [
        ("show", a),
        ("show", a, "--json"),
        ("show", a, "--ops", "0:40", "--json"),
        ("diff", a, b),
        ("diff", a, b, "--json"),
        ("explain", a, b),  # no model: the bundle and how to enable the agent
        ("explain", a, b, "--json"),
        ("diff", a, str(agent_env)),  # an error message naming a path
    ]
    codes = []
    for command in commands:
        code, out, err = cli(*command)
        codes.append(code)
        outputs += [out, err]
    assert codes == [0, 0, 0, 1, 1, 1, 1, 2]

    with stub_provider(
        Answer(tool_calls=(("source", {"run": "a", "index": 0}),)),
        Answer(text=("The learning rate differs.",)),
        Answer(error=(401, f"Incorrect API key provided: {FILE_KEY}")),
    ) as stub:
        monkeypatch.setenv("OPGUARD_MODEL", "openai/stub")
        monkeypatch.setenv("OPGUARD_API_BASE", stub.url)
        for extra in (("--json",), ()):  # an answer after a tool call; a provider error
            code, out, err = cli("explain", a, b, *extra)
            codes.append(code)
            outputs += [out, err]
    assert codes[-2:] == [1, 2]
    assert "The learning rate differs." in outputs[-4]
    assert "Incorrect API key provided" in outputs[-1] and "[redacted]" in outputs[-1]

    # The key was used (the config file's: a provider's own variable is LiteLLM's fallback)...
    headers = [{k.lower(): v for k, v in r["headers"].items()} for r in stub.requests]
    assert {h["authorization"] for h in headers} == {f"Bearer {FILE_KEY}"}
    sent = [json.dumps(r["body"]) for r in stub.requests]
    assert not [leaks(body) for body in sent if leaks(body)]
    # ... and is nowhere else.
    assert not [(n, leaks(text)) for n, text in enumerate(outputs) if leaks(text)]
    for run in (run_a, run_b):
        files = [p for p in run.rglob("*") if p.is_file()]
        assert {p.name for p in files} >= {"meta.json", "data.mdb"}
        assert not [(str(p), leaks(p.read_bytes())) for p in files if leaks(p.read_bytes())]


def test_config_errors_do_not_quote_the_key(
    recorded: tuple[Path, Path, list[str]], agent_env: Path
) -> None:
    run_a, run_b, _ = recorded
    agent_env.write_text(f'[agent]\napi_key = "{FILE_KEY}\n')  # unterminated: a parse error
    code, out, err = cli("explain", str(run_a), str(run_b))
    assert code == 2 and "unreadable" in err
    agent_env.write_text(f'[agent]\napi_key = "{FILE_KEY}"\nbudget = "{FILE_KEY}"\n')
    code2, out2, err2 = cli("explain", str(run_a), str(run_b))
    assert code2 == 2 and "budget" in err2
    agent_env.write_text(f'[agent]\napi_key = "{FILE_KEY}"\n')
    agent_env.chmod(0o644)
    code3, out3, err3 = cli("explain", str(run_a), str(run_b))
    assert code3 == 2 and "chmod 600" in err3
    assert not leaks(out + err + out2 + err2 + out3 + err3)
