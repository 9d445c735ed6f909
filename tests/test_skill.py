"""The coding agents' skill (skills/opguard/SKILL.md) loads and its commands are real: its front
matter is what skill loaders read, every command and option it writes parses, and every command
of its bash blocks runs, on the demo pair or (where it records a script) on a tiny script pair,
with an exit status and JSON the skill documents. An agent that follows the skill must never
meet a renamed flag or a subcommand that is gone."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path
from typing import Any

import pytest
import yaml
from conftest import REPO, run_cli

from opguard.cli import UsageError, build_parser, parse_command_line

SKILL = REPO / "skills" / "opguard" / "SKILL.md"
LONG = REPO / "tests" / "long_runs" / "train.py"  # a tiny MLP: seconds a recording
# The skill's placeholders for run A's and run B's scripts, made the tiny pair: run B scales
# step 1's loss, so the pair diverges within the `--steps 3` the skill records and hunt finds it.
SCRIPTS = {"train.py": ("--steps", "12"), "train_v2.py": ("--steps", "12", "--scale-at", "1")}
INDEX = "INDEX"  # the skill's placeholder for the first divergence's op index in run A
# What the skill tells an agent to read in each command's JSON: its schema, and the keys by path
# (a number indexes a list). The first divergence's keys are read on the demo, which diverges.
SCHEMAS = {
    "diff": "opguard.diff/1",
    "hunt": "opguard.hunt/1",
    "tensor": "opguard.tensor/1",
    "replay": "opguard.replay/1",
    "nan": "opguard.nan/1",
}
DIVERGENCE = tuple(
    f"first_divergence.{key}"
    for key in (
        *("summary", "kind", "cause", "a.index", "a.call_site.line", "b.index", "hint"),
        *("likely_causes", "arguments_differ", "inputs_differ", "outputs_differ", "chain"),
    )
)
KEYS: dict[str, tuple[str, ...]] = {
    "record": ("exit_code", "stdout_tail", "stderr_tail"),
    "diff": ("verdict", "scope", "unread", "notes", "nonfinite", "ranks.0.notes", *DIVERGENCE),
    "hunt": (
        *("verdict", "step", "rank", "found_by", "reproduced", "next"),
        *("runs.a_window", "runs.b_window", "op_level.first_divergence.summary"),
        "step_level.first_divergence.kind",
    ),
    "tensor": ("tensors.0.verdict",),
    "replay": ("deterministic", "matches_a", "matches_b"),
}
TOLERANT_KEYS = ("drift", "first_divergence.distance.reason", "first_divergence.distance.text")


def _skill() -> tuple[dict[str, Any], str]:
    """The skill's front matter, read as YAML as skill loaders read it, and its body."""
    match = re.match(r"---\n(.*?)\n---\n(.*)", SKILL.read_text(), re.S)
    assert match, "SKILL.md must open with YAML front matter between --- lines"
    return yaml.safe_load(match.group(1)), match.group(2)


def _bash_commands(body: str) -> list[list[str]]:
    """Every line of the skill's bash blocks, each an ``opguard`` command: its arguments."""
    blocks = re.findall(r"^```bash\n(.*?)^```", body, re.S | re.M)
    lines = [line for block in blocks for line in block.splitlines() if line.strip()]
    assert lines, "SKILL.md shows no command"
    commands = [shlex.split(line, comments=True) for line in lines]
    assert all(words[0] == "opguard" for words in commands), "a bash line that is not opguard's"
    return [words[1:] for words in commands]


def _prose_commands(body: str) -> list[list[str]]:
    """The ``opguard`` commands the skill writes in code spans outside its bash blocks."""
    prose = re.sub(r"```.*?```", "", body, flags=re.S)
    spans = re.findall(r"`([^`\n]+)`", prose)
    return [shlex.split(span)[1:] for span in spans if span.startswith("opguard ")]


def _at(value: Any, path: str) -> Any:
    """The value at a dotted path of a JSON object (a number indexes a list)."""
    for key in path.split("."):
        value = value[int(key)] if isinstance(value, list) else value[key]
    return value


def _filled(words: list[str], index: int) -> list[str]:
    """A command's arguments with the op index the skill's ``INDEX`` stands for."""
    return [str(index) if word == INDEX else word for word in words]


def test_front_matter_is_what_skill_loaders_read() -> None:
    """Agent Skills loaders (Claude Code among them) index a skill by its front matter: a name
    that is the directory's, in lowercase and hyphens, and a description of at most 1024
    characters without markup, which decides when the skill is loaded."""
    front, _ = _skill()
    assert front["name"] == SKILL.parent.name
    assert re.fullmatch(r"[a-z0-9]+(-[a-z0-9]+)*", front["name"]) and len(front["name"]) <= 64
    description = front["description"]
    assert isinstance(description, str) and 0 < len(description) <= 1024
    assert not re.search(r"[<>]", description)


def test_every_option_and_command_parses() -> None:
    """Every command the skill writes, in its bash blocks or in prose, and every option it
    names in passing (``--verify-inputs``, ``--side b``) is read by the CLI's own parser: a
    renamed flag or a subcommand gone fails here at once, before anything runs."""
    _, body = _skill()
    parser = build_parser()
    subparsers = parser._subparsers._group_actions[0].choices  # type: ignore[union-attr]
    options = {flag for sub in subparsers.values() for flag in sub._option_string_actions}
    named = set(re.findall(r"(?<![\w-])--[a-z][\w-]*", body))
    assert named <= options, f"not opguard options: {sorted(named - options)}"
    for words in _bash_commands(body) + _prose_commands(body):
        try:
            _, unknown = parse_command_line(parser, _filled(words, 0))
        except UsageError as error:
            pytest.fail(f"opguard {shlex.join(words)}: {error}")
        assert not unknown, f"opguard {shlex.join(words)}: unrecognized {unknown}"


def _script_pair(directory: Path) -> None:
    """The skill's two scripts in ``directory``: each runs the tiny long run with its options."""
    for name, options in SCRIPTS.items():
        (directory / name).write_text(
            f"import runpy, sys\nsys.argv += {list(options)!r}\n"
            f"runpy.run_path({str(LONG)!r}, run_name='__main__')\n"
        )


def _demo_pair(directory: Path, demo_runs: tuple[Path, Path]) -> int:
    """The demo pair as ``runs/a`` and ``runs/b`` in ``directory``; its first divergence's op
    index in run A, which the skill's ``INDEX`` stands for."""
    (directory / "runs").mkdir()
    for name, run in zip("ab", demo_runs, strict=True):
        (directory / "runs" / name).symlink_to(run)
    diff = run_cli("diff", "runs/a", "runs/b", "--json", cwd=directory)
    return int(json.loads(diff.stdout)["first_divergence"]["a"]["index"])


@pytest.mark.slow
def test_every_command_the_skill_shows_runs(demo_runs: tuple[Path, Path], tmp_path: Path) -> None:
    """The bash blocks' commands in the skill's order, as an agent follows them: those naming
    a script where the tiny pair is, the others where the demo pair is ``runs/a`` and
    ``runs/b`` (``capture`` writes ``runs/a-capture`` beside them for ``tensor`` and
    ``replay``). Exit status 2 is a command the skill got wrong; 3 (incomplete) cannot happen
    on whole runs; a traceback is a crash whatever its status."""
    scripts, demo = tmp_path / "scripts", tmp_path / "demo"
    scripts.mkdir()
    demo.mkdir()
    _script_pair(scripts)
    index = _demo_pair(demo, demo_runs)
    _, body = _skill()
    for words in _bash_commands(body):
        argv = _filled(words, index)
        where = scripts if SCRIPTS.keys() & set(argv) else demo
        done = run_cli(*argv, cwd=where)
        shown = f"opguard {shlex.join(argv)} (in {where.name})"
        assert done.returncode in (0, 1), f"{shown}: exit {done.returncode}\n{done.stderr}"
        assert "Traceback" not in done.stderr, f"{shown} crashed:\n{done.stderr}"
        if "--json" not in argv:
            continue
        answer = json.loads(done.stdout)
        command = argv[0]
        if command in SCHEMAS:
            assert answer["schema"] == SCHEMAS[command], shown
        paths = KEYS.get(command, ()) + (TOLERANT_KEYS if "--tolerant" in argv else ())
        for path in paths:
            try:
                _at(answer, path)
            except (KeyError, IndexError, TypeError):
                pytest.fail(f"{shown}: no {path} in its JSON")
