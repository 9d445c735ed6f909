"""Each thing said once (issue 29): the tool schemas every front offers come from the registry,
`opguard record`'s options from their one declaration, and no layer below the CLI imports it.
Fast, read-only checks of the package itself; the behaviour behind them is tested end to end in
test_tools.py, test_agent.py and test_long_runs.py."""

from __future__ import annotations

import argparse
import ast
import inspect
from dataclasses import fields
from pathlib import Path

from opguard.agent import TOOLS as AGENT_TOOLS
from opguard.agent.tools import FOLLOW_UPS
from opguard.capture_spec import CaptureSpec
from opguard.cli import build_parser
from opguard.cli.commands.record import parse_recorded
from opguard.record_options import RecordOptions, declared
from opguard.tools import BY_NAME, TOOLS

PACKAGE = Path(__file__).resolve().parent.parent / "opguard"


def test_the_agent_is_offered_the_registry_schemas() -> None:
    """The model sees each follow-up tool as MCP clients see the coding agents' tools: the
    registry's input schema, in the function-calling form."""
    assert [t["function"]["name"] for t in AGENT_TOOLS] == [t.name for t in FOLLOW_UPS]
    for offered, tool in zip(AGENT_TOOLS, FOLLOW_UPS, strict=True):
        assert offered["type"] == "function"
        assert offered["function"]["description"] == tool.purpose
        assert offered["function"]["parameters"] == tool.input_schema()
    for tool in TOOLS:  # the coding agents' tools, in either form, say the same
        assert tool.function_schema()["function"]["parameters"] == tool.input_schema()


def test_record_switches_are_the_declaration() -> None:
    """argparse's switches of opguard record and the record tool's parameters are the declared
    options, each with its flag and kind, and nothing else besides the command's own."""
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    actions = {a.option_strings[-1]: a for a in sub.choices["record"]._actions if a.option_strings}
    switches = {switch.flag: (f.name, switch) for f, switch in declared()}
    assert set(actions) - {"--output", "-m", "--python", "--json", "--help"} == set(switches)
    for flag, (name, switch) in switches.items():
        assert actions[flag].dest == name
        assert isinstance(actions[flag], argparse._StoreTrueAction) == (switch.kind == "boolean")
    params = {p.name: p for p in BY_NAME["record"].params}
    own = {"output", "python", "module", "script", "args"}
    assert set(params) - own == {name for name, _ in switches.values()}
    for name, switch in switches.values():
        assert (params[name].flag, params[name].kind) == (switch.flag, switch.kind)
        assert params[name].minimum == switch.minimum


def test_every_option_survives_its_switches() -> None:
    """Options written as switches (the command a run records, the argv of torchrun's workers)
    read back as the same options: none is lost or changed on the way."""
    every = RecordOptions(
        steps=9,
        overwrite=True,
        eager=True,
        verify_inputs=True,
        first_step=2,
        window=(3, 5),
        keep_last=2,
        capture=CaptureSpec.parse("3,7-9"),
        capture_limit=1 << 20,
        perturb_rounding=5,
    )
    # every option but --steps-only (which refuses the op-level ones) differs from its default
    unset = {f.name for f in fields(every) if getattr(every, f.name) == f.default}
    assert unset == {"steps_only"}
    read, target = parse_recorded(["opguard", "record", "-o", "r", *every.switches(), "--", "t.py"])
    assert read == every and target == ["--", "t.py"]
    steps_only = RecordOptions(steps_only=True, first_step=4)
    assert parse_recorded(["opguard", "record", "-o", "r", *steps_only.switches()])[0] == steps_only


def test_record_in_code_takes_the_declared_options() -> None:
    """``opguard.record()`` keeps its typed keywords (a user's editor shows them): they are the
    declared options, plus the rank."""
    from opguard.recorder.session import record

    keywords = [
        p.name for p in inspect.signature(record).parameters.values() if p.kind is p.KEYWORD_ONLY
    ]
    assert set(keywords) - {"rank"} == {f.name for f, _ in declared()}


def _imports(path: Path) -> set[str]:
    """The absolute names of the modules a file imports (relative imports resolved)."""
    module = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)
    package = (
        module.rsplit(".", 1)[0] if path.name != "__init__.py" else module[: -len(".__init__")]
    )
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")
            base = base[: len(base) - node.level + 1] if node.level else []
            name = ".".join([*base, *([node.module] if node.module else [])])
            found |= {name, *(f"{name}.{alias.name}" for alias in node.names)}
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and node.value.startswith("opguard.")
            and ":" in node.value  # a tool's handler, imported when called
        ):
            found.add(node.value.partition(":")[0])
    return found


def test_nothing_below_the_cli_imports_it() -> None:
    """The CLI is the top layer: the recorder, the tools, the agent, the hunt never import it
    (``python -m opguard`` alone starts it)."""
    from opguard.tools.catalog import ANSWERS

    offenders = {
        str(path.relative_to(PACKAGE)): sorted(
            n for n in _imports(path) if n == "opguard.cli" or n.startswith("opguard.cli.")
        )
        for path in PACKAGE.rglob("*.py")
        if path.relative_to(PACKAGE).parts[0] not in ("cli", "__main__.py")
    }
    assert {k: v for k, v in offenders.items() if v} == {}
    assert all(t.handler.startswith(f"{ANSWERS}.") for t in TOOLS)
