"""The documentation a user reads holds: every relative link in README.md, docs/ and the agents'
skill resolves (to a file, and to a heading where it names one), the README stays a first-time
user's page, and every key ``opguard diff --json`` writes is specified in docs/json-contract.md."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from sketch_reference import stored_sketch
from traces import TraceBuilder, chain_run, tensor

from opguard.analysis import diff_runs
from opguard.analysis.contract import to_json
from opguard.analysis.tolerant.rule import Tolerance
from opguard.store import Run

ROOT = Path(__file__).resolve().parent.parent
PAGES = [
    ROOT / "README.md",
    *sorted((ROOT / "docs").glob("*.md")),
    ROOT / "skills/opguard/SKILL.md",
]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
README_LIMIT = 12 * 1024  # bytes: what a first-time user reads; the manual is in docs/

# Keys whose values are free-form (argument values, kernel entries as CUPTI gives them, maps
# keyed by data): their insides are not keys of the contract.
FREE_FORM = {"kernels", "by_kind", "group"}


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


def _keys(value: Any, into: set[str]) -> set[str]:
    if isinstance(value, dict):
        for key, inner in value.items():
            into.add(key)
            if key not in FREE_FORM and key != "arguments_differ":
                _keys(inner, into)
            elif key == "arguments_differ":
                for argument in inner:
                    into.update(argument)  # its a and b are the arguments' own values
    elif isinstance(value, list):
        for inner in value:
            _keys(inner, into)
    return into


def test_every_key_the_diff_writes_is_specified(tmp_path: Path) -> None:
    base = [("aten::randn.default", None, 10), ("aten::mm.default", 0, 20)]
    a = [*base, ("aten::gelu.default", 1, 30)]
    b = [*base, ("aten::div.Tensor", 1, 21), ("aten::gelu.default", 2, 31)]  # inserted
    args = {2: [["approximate", "none"]]}
    run_a, run_b = chain_run(tmp_path / "a", a, args=args), chain_run(tmp_path / "b", b)
    written: set[str] = set()
    with Run(run_a) as one, Run(run_b) as other:
        for tolerance in (None, Tolerance()):
            _keys(to_json(diff_runs(one, other, tolerance=tolerance)), written)
    # --tolerant's distances of a leaf that differs beyond rounding (runs with sketches)
    leaf = np.linspace(-1.0, 1.0, 64)
    sketched = []
    for fingerprint, values in enumerate((leaf, leaf * 1.01)):
        name = "cd"[fingerprint]
        with TraceBuilder(tmp_path / name) as run:
            x = tensor("self", fingerprint, w=stored_sketch(values))
            run.op("aten::relu.default", [x], [tensor("0", fingerprint, w=stored_sketch(values))])
        sketched.append(tmp_path / name)
    with Run(sketched[0]) as one, Run(sketched[1]) as other:
        _keys(to_json(diff_runs(one, other, tolerance=Tolerance())), written)
    spec = (ROOT / "docs" / "json-contract.md").read_text()
    named = set(re.findall(r'`"?([A-Za-z_]+)"?', spec)) | set(re.findall(r'"([A-Za-z_]+)"', spec))
    assert written - named == set(), (
        "keys opguard diff --json writes that docs/json-contract.md does not specify"
    )
