"""``opguard diff --html`` and ``opguard hunt --html``: the report as one self-contained HTML file.

Each report is parsed with the standard library's parser and read as a person reads it: the
verdict and the first divergence say what ``diff --json`` says, nothing is fetched from
anywhere, the plots are drawn (a line a run), the rows around the first divergence mark those
that differ as the ``ops`` tool calls them, and the bitwise, tolerant, step-level, hunt and
multi-rank reports each show their own facts. On the session's demo pair (recorded once) and on
small runs the real writer writes (tests/state_runs.py), so the reports take seconds.
"""

from __future__ import annotations

import errno
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from html.parser import HTMLParser
from pathlib import Path
from typing import Any

import pytest
from conftest import cli_in_process
from state_runs import hunt_of, write_state_run
from traces import TraceBuilder, tensor

from opguard.analysis.browse.rows import Status
from opguard.report.content import HowRecorded

VOID = {"meta", "br", "link", "img", "input", "hr", "col", "area", "base", "source", "wbr"}
DIFFERS = {s.value for s in Status if s.differs}


@dataclass
class Element:
    tag: str
    attrs: dict[str, str]
    within: tuple[str, ...]  # the ids of the elements it is in, outermost first


class Report(HTMLParser):
    """A parsed report: every element with the ids it sits in, the text of each element that
    has an id (``text["verdict"]``), and every table row with the text of its cells."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.elements: list[Element] = []
        self.text: dict[str, str] = {}
        self.rows: list[tuple[Element, list[str]]] = []
        self._heads: set[int] = set()  # rows of header cells only (by their place in rows)
        self._open: list[tuple[str, str]] = []

    @property
    def ids(self) -> tuple[str, ...]:
        return tuple(ident for _, ident in self._open if ident)

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        values = {k: v or "" for k, v in attrs}
        element = Element(tag, values, self.ids)
        self.elements.append(element)
        if tag == "tr":
            self._heads.add(len(self.rows))
            self.rows.append((element, []))
        elif tag in ("td", "th") and self.rows:
            self.rows[-1][1].append("")
            if tag == "td":
                self._heads.discard(len(self.rows) - 1)
        if tag not in VOID:
            self._open.append((tag, values.get("id", "")))
            if values.get("id"):
                self.text.setdefault(values["id"], "")

    def handle_startendtag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.elements.append(Element(tag, {k: v or "" for k, v in attrs}, self.ids))

    def handle_endtag(self, tag: str) -> None:
        while self._open:
            if self._open.pop()[0] == tag:
                break

    def handle_data(self, data: str) -> None:
        for ident in self.ids:
            self.text[ident] += data
        if any(tag in ("td", "th") for tag, _ in self._open):
            cells = self.rows[-1][1]
            cells[-1] = squeeze(cells[-1] + " " + data)

    def within(self, ident: str, tag: str) -> list[Element]:
        return [e for e in self.elements if e.tag == tag and ident in e.within]

    def table(self, ident: str) -> list[tuple[Element, list[str]]]:
        """The rows of the tables in element ``ident``, header rows left out."""
        return [
            (row, cells)
            for at, (row, cells) in enumerate(self.rows)
            if ident in row.within and at not in self._heads
        ]


def read_report(path: Path) -> Report:
    report = Report()
    report.feed(path.read_text(encoding="utf-8"))
    report.close()
    return report


def squeeze(text: str) -> str:
    return " ".join(text.split())


def diff_with_html(tmp: Path, *args: str) -> tuple[int, dict[str, Any], Report, str]:
    """``opguard diff ARGS --json --html FILE``: the exit status, the JSON, the report."""
    path = tmp / "report.html"
    code, out, err = cli_in_process("diff", *args, "--json", "--html", str(path))
    assert code in (0, 1), err
    return code, json.loads(out), read_report(path), path.read_text(encoding="utf-8")


def assert_self_contained(report: Report, raw: str) -> None:
    """Nothing is fetched from anywhere: no link, no script, no source or reference but a
    place in the page itself, no stylesheet import."""
    assert not [e for e in report.elements if e.tag == "link"]
    assert not [e for e in report.elements if e.tag == "script"]
    for element in report.elements:
        for name in ("src", "href", "xlink:href", "action", "data"):
            value = element.attrs.get(name, "")
            assert not value or value.startswith("#"), (element.tag, name, value)
    style = raw[raw.index("<style>") : raw.index("</style>")]
    assert "@import" not in style and "url(" not in style


def assert_says_what_json_says(report: Report, answer: dict[str, Any]) -> None:
    """The verdict, and the first divergence's summary, ops and call lines, as the JSON."""
    assert answer["verdict"].upper() in report.text["verdict"]
    first = answer["first_divergence"]
    said = squeeze(report.text["first-divergence"])
    assert squeeze(first["summary"]) in said
    for side in ("a", "b"):
        op = first[side]
        if op is None:
            continue
        site = op["call_site"]
        assert f"#{op['index']} {op['op']}" in said
        assert f"{site['file']}:{site['line']}" in said
        if op.get("source"):
            assert op["source"] in said  # the call line, among the source lines shown


def plot_lines(report: Report, ident: str) -> list[Element]:
    return report.within(ident, "polyline")


# -- the demo pair, bit for bit and under --tolerant --------------------------------------------


@pytest.fixture(scope="module")
def demo_report(
    demo_runs: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory
) -> tuple[dict[str, Any], Report, str]:
    code, answer, report, raw = diff_with_html(
        tmp_path_factory.mktemp("html"), *map(str, demo_runs)
    )
    assert code == 1
    return answer, report, raw


def test_the_report_says_what_the_json_says(
    demo_report: tuple[dict[str, Any], Report, str],
) -> None:
    answer, report, raw = demo_report
    assert_says_what_json_says(report, answer)
    assert_self_contained(report, raw)
    first = answer["first_divergence"]
    said = squeeze(report.text["first-divergence"])
    for argument in first["arguments_differ"]:  # eps: 1e-05 (A) vs 1e-06 (B)
        assert argument["name"] in said and str(argument["a"]) in said
    for output in first["outputs_differ"]:  # values and raw bits of both runs
        for side in ("a", "b"):
            assert output[side]["fingerprint"] in said
            assert output[side]["bits"][0] in said
    ((_, alignment),) = report.table("alignment")
    rank = answer["ranks"][0]
    counts = ("rank", "aligned", "unaligned_a", "unaligned_b", "differing")
    assert alignment[:5] == [str(rank[count]) for count in counts]


def test_every_section_has_its_id(demo_report: tuple[dict[str, Any], Report, str]) -> None:
    """The ids a browser test finds the sections by."""
    _, report, _ = demo_report
    for ident in ("verdict", "first-divergence", "neighbourhood", "loss-plot", "drift-plot"):
        assert ident in report.text, ident
    assert {"alignment", "reproduce"} <= set(report.text)


def test_the_plots_draw_a_line_a_run(demo_report: tuple[dict[str, Any], Report, str]) -> None:
    """The loss of run A and of run B (four steps each), the share of ops that differ, the
    first divergence's step marked on both."""
    answer, report, _ = demo_report
    losses = plot_lines(report, "loss-plot")
    assert [line.attrs["data-series"] for line in losses] == ["run A", "run B"]
    assert all(len(line.attrs["points"].split()) == 4 for line in losses)
    assert len(plot_lines(report, "drift-plot")) == 1
    step = answer["first_divergence"]["step"]
    for ident in ("loss-plot", "drift-plot"):
        assert report.within(ident, "svg") and report.within(ident, "line")
        assert f"first divergence, step {step}" in report.text[ident]


def test_the_neighbourhood_marks_the_rows_that_differ(
    demo_runs: tuple[Path, Path], demo_report: tuple[dict[str, Any], Report, str]
) -> None:
    """Run A beside run B around the first divergence: its row marked first, every row
    marked as differing exactly where the ``ops`` tool calls it so."""
    answer, report, _ = demo_report
    observed = answer["first_divergence"]["observed"]
    body = [
        (row, cells) for row, cells in report.table("neighbourhood") if "data-status" in row.attrs
    ]
    assert len(body) > 10
    first = [cells for row, cells in body if "first" in row.attrs["class"].split()]
    assert len(first) == 1 and str(observed["a"]["index"]) == first[0][1]
    for row, _ in body:
        marked = "differs" in row.attrs["class"].split()
        assert marked == (row.attrs["data-status"] in DIFFERS), row.attrs
    code, out, err = cli_in_process(
        "ops", *map(str, demo_runs), str(observed["a"]["index"]), "--json", "--limit", "30"
    )
    assert code == 0, err
    status = {a: s for a, _, s, *_ in json.loads(out)["rows"] if a is not None}
    shown = {int(cells[1]): row.attrs["data-status"] for row, cells in body if cells[1]}
    common = set(status) & set(shown)
    assert len(common) > 10
    assert all(shown[a] == status[a] for a in common)
    assert any(status[a] in DIFFERS for a in common)


def test_the_report_says_how_to_reproduce(
    demo_runs: tuple[Path, Path], demo_report: tuple[dict[str, Any], Report, str]
) -> None:
    """Both record commands, as the runs' metadata keeps them, and the diff that wrote it."""
    _, report, _ = demo_report
    said = report.text["reproduce"]
    for run in demo_runs:
        meta = json.loads((run / "meta.json").read_text())
        assert " ".join(meta["command"]) in said and f"cd {meta['cwd']}" in said
    assert f"opguard diff {demo_runs[0]} {demo_runs[1]} --html" in said


def test_a_run_is_recorded_again_where_and_as_it_was() -> None:
    """In its directory, with the variables that change numerics (a launcher sets the job's
    own), quoted for the shell."""
    meta = {
        "command": ["opguard", "record", "-o", "runs/a", "--", "train.py", "--name", "a b"],
        "cwd": "/work/my runs",
        "env": {"RANK": "0", "OMP_NUM_THREADS": "1", "MASTER_PORT": "29500"},
    }
    assert HowRecorded.of("run A", "runs/a", meta).lines() == [
        "cd '/work/my runs'",
        "OMP_NUM_THREADS=1 opguard record -o runs/a -- train.py --name 'a b'",
    ]


def test_identical_runs_give_an_identical_report(
    demo_runs: tuple[Path, Path], tmp_path: Path
) -> None:
    code, answer, report, raw = diff_with_html(tmp_path, str(demo_runs[0]), str(demo_runs[0]))
    assert code == 0 and answer["verdict"] == "identical"
    assert "IDENTICAL" in report.text["verdict"] and "DIVERGED" not in raw
    assert "None" in report.text["first-divergence"]
    assert not report.table("neighbourhood")  # nothing to show around
    assert len(plot_lines(report, "loss-plot")) == 2
    assert_self_contained(report, raw)


def test_a_tolerant_report_says_how_it_judged(demo_runs: tuple[Path, Path], tmp_path: Path) -> None:
    """--tolerant: the rule, how many differences rounding explained, the distances of the op
    named, and the drift per step on a log scale: a point a step of the JSON's drift."""
    code, answer, report, raw = diff_with_html(tmp_path, *map(str, demo_runs), "--tolerant")
    assert code == 1
    assert_says_what_json_says(report, answer)
    tolerance = squeeze(report.text["tolerance"])
    assert "d_out ≤" in tolerance
    assert str(answer["ranks"][0]["rounding"]["explained"]) in tolerance
    distance = answer["first_divergence"]["distance"]
    assert squeeze(distance["text"]) in squeeze(report.text["distance"])
    (drift,) = plot_lines(report, "drift-plot")
    assert len(drift.attrs["points"].split()) == len(answer["drift"])
    assert "log scale" in report.text["drift-plot"]
    assert_self_contained(report, raw)


# -- step-level, multi-rank and hunt reports ---------------------------------------------------


def test_a_step_level_report_shows_the_differing_step(tmp_path: Path) -> None:
    """A --steps-only pair: the first differing step and its entry, the step's state entries
    side by side with the differing ones marked, the loss from the step-level records."""
    a = write_state_run(tmp_path / "a")
    b = write_state_run(tmp_path / "b", differ={"grad fc2.weight": 5, "param": 5, "state": 5})
    code, answer, report, raw = diff_with_html(tmp_path, str(a), str(b))
    assert code == 1
    first = answer["first_divergence"]
    assert first["kind"] == "state"
    said = squeeze(report.text["first-divergence"])
    assert squeeze(first["summary"]) in said and first["hint"] in said
    assert "First differing step" in said
    statuses = {cells[0]: row.attrs["data-status"] for row, cells in report.table("neighbourhood")}
    assert statuses["grad fc2.weight"] == "differing" and statuses["grad fc1.weight"] == "equal"
    assert len(plot_lines(report, "loss-plot")) == 2
    assert "step-level records" in report.text["loss-plot"]
    assert "no op was compared" in report.text["drift-plot"]
    assert_self_contained(report, raw)


GROUP = {"group": "0", "size": 2, "ranks": [0, 1], "backend": "gloo"}


@pytest.fixture
def two_ranks(tmp_path: Path) -> tuple[Path, Path]:
    """Rank 1 computes otherwise in run B (an origin); rank 0 receives the difference through
    an all-reduce (a receiver)."""
    for run, shift in (("a", 0), ("b", 1)):
        for rank in (0, 1):
            with TraceBuilder(tmp_path / run, rank=rank) as trace:
                made = 2 + shift * rank
                mm = trace.op("aten::mm.default", [tensor("self", 1)], [tensor("0", made)])
                trace.op(
                    "c10d::allreduce_.default",
                    [tensor("self", made, mm)],
                    [tensor("0", 10 + shift)],
                    a=[["process_group", GROUP]],
                )
    return tmp_path / "a", tmp_path / "b"


@pytest.fixture
def one_rank(tmp_path: Path) -> tuple[Path, Path]:
    """One rank recorded op by op, differing from step 2 on."""
    a = write_state_run(tmp_path / "a", op_steps=range(4), steps=range(4))
    b = write_state_run(tmp_path / "b", op_steps=range(4), steps=range(4), ops_differ_from=2)
    return a, b


def test_a_multi_rank_report_names_each_ranks_role(
    two_ranks: tuple[Path, Path], tmp_path: Path
) -> None:
    code, answer, report, raw = diff_with_html(tmp_path, *map(str, two_ranks))
    assert code == 1
    assert_says_what_json_says(report, answer)
    receiver, origin = (cells for _, cells in report.table("ranks"))
    assert [r["role"] for r in answer["ranks"]] == ["receiver", "origin"]
    assert receiver[:2] == ["0", "receiver"]
    assert "c10d::allreduce_.default" in receiver[2] and "received from rank(s) 1" in receiver[2]
    assert origin == ["1", "origin", squeeze(answer["ranks"][1]["divergence"]["summary"])]
    assert answer["origin_ranks"] == [1] and "origin rank(s): 1" in report.text["ranks"]
    alignment = [cells[:5] for _, cells in report.table("alignment")]
    assert alignment == [
        [str(r[key]) for key in ("rank", "aligned", "unaligned_a", "unaligned_b", "differing")]
        for r in answer["ranks"]
    ]
    assert_self_contained(report, raw)


def test_brief_json_and_the_report_together(one_rank: tuple[Path, Path], tmp_path: Path) -> None:
    """--json --brief prints the tool's answer as before, and the report is written too."""
    path = tmp_path / "brief.html"
    code, out, err = cli_in_process(
        "diff", *map(str, one_rank), "--json", "--brief", "--html", str(path)
    )
    assert code == 1, err
    assert "observed" not in json.loads(out)["first_divergence"]  # brief, as without --html
    assert "DIVERGED" in read_report(path).text["verdict"]


def test_a_hunt_report_says_how_the_step_was_found(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``opguard hunt --html``: the first line of the hunt's report, its passes' recordings,
    the loss over the whole run (the step-level pass), and the hunt's output unchanged."""
    hunt = hunt_of(tmp_path / "hunt", {"grad": 4}, {"grad": 4})
    monkeypatch.setattr("opguard.cli.commands.hunt.run_hunt", lambda args, **_: hunt)
    path = tmp_path / "hunt.html"
    code, out, err = cli_in_process(
        "hunt", "-o", str(tmp_path / "hunt"), "--a", "a.py", "--b", "b.py", "--html", str(path)
    )
    assert code == 1, err
    report, raw = read_report(path), path.read_text(encoding="utf-8")
    assert squeeze(hunt.found_by) in squeeze(report.text["verdict"])
    assert squeeze(hunt.found_by) in squeeze(out)  # the terminal report, as ever
    said = report.text["reproduce"]
    assert hunt.op_level is not None
    for diff in (hunt.step_level, hunt.op_level):
        assert diff.path_a in said and diff.path_b in said
    assert "opguard hunt -o" in said
    (loss_a, _) = plot_lines(report, "loss-plot")
    assert len(loss_a.attrs["points"].split()) == 8  # every step of the step-level pass
    assert_self_contained(report, raw)


# -- what is escaped, and what is refused -----------------------------------------------------


def test_text_from_the_traces_is_escaped(tmp_path: Path) -> None:
    """A path with markup in it is shown as text, never as markup."""
    a = write_state_run(tmp_path / "<b>run&a")
    b = write_state_run(tmp_path / "<b>run&b", differ={"grad": 2})
    code, _, report, raw = diff_with_html(tmp_path, str(a), str(b))
    assert code == 1
    assert "<b>run" not in raw and "&lt;b&gt;run&amp;a" in raw
    assert str(a) in report.text["verdict"]


@pytest.mark.parametrize(
    "where",
    [
        lambda tmp: tmp / "missing" / "report.html",  # no such directory
        lambda tmp: tmp,  # a directory
        lambda tmp: "",  # no name
    ],
    ids=["no-directory", "a-directory", "empty"],
)
@pytest.mark.parametrize("command", ["diff", "hunt"])
def test_a_report_that_cannot_be_written_is_one_line(
    command: str, where: Callable[[Path], Any], one_rank: tuple[Path, Path], tmp_path: Path
) -> None:
    """Refused before anything runs (a hunt records for minutes): exit 2, one line, no
    traceback, nothing written."""
    runs = (
        [*map(str, one_rank)]
        if command == "diff"
        else ["-o", str(tmp_path / "h"), "--a", "a.py", "--b", "b.py"]
    )
    code, out, err = cli_in_process(command, *runs, "--html", str(where(tmp_path)))
    assert code == 2 and not out
    assert len(err.strip().splitlines()) == 1 and "--html" in err, err
    assert "Traceback" not in err
    assert not (tmp_path / "h").exists()


def test_a_write_that_fails_late_is_one_line(
    one_rank: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A disk that fills up after the check: the report is printed, the write refused in one
    line, exit 2."""

    def full(*_: Any, **__: Any) -> None:
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(Path, "write_text", full)
    target = tmp_path / "report.html"
    code, out, err = cli_in_process("diff", *map(str, one_rank), "--html", str(target))
    assert code == 2 and "DIVERGED" in out
    assert err.strip().splitlines() == [
        f"opguard: error: cannot write {target}: No space left on device"
    ]


# -- in a browser --------------------------------------------------------------------------------


def test_the_report_renders_in_a_browser(
    demo_report: tuple[dict[str, Any], Report, str], tmp_path: Path, browser_page: Any
) -> None:
    """Opened from disk in headless Chromium, as an attachment is: no console error, nothing
    asked of another machine, the verdict and the first divergence visible with the op the JSON
    names, and each plot's lines drawn (its screenshot changes when they are hidden)."""
    answer, _, raw = demo_report
    page_file = tmp_path / "report.html"
    page_file.write_text(raw)
    page = browser_page.page
    page.goto(page_file.as_uri())
    for ident in ("verdict", "first-divergence", "loss-plot", "drift-plot", "neighbourhood"):
        assert page.locator(f"#{ident}").is_visible(), ident
    assert "DIVERGED" in page.locator("#verdict").inner_text().upper()
    first = page.locator("#first-divergence").inner_text()
    assert answer["first_divergence"]["a"]["op"] in first
    for ident in ("loss-plot", "drift-plot"):
        plot = page.locator(f"#{ident} svg").first
        plot.scroll_into_view_if_needed()
        drawn = plot.screenshot()
        lengths = page.eval_on_selector_all(
            f"#{ident} polyline", "lines => lines.map(line => line.getTotalLength())"
        )
        assert lengths and all(length > 0 for length in lengths), (ident, lengths)
        page.eval_on_selector_all(
            f"#{ident} polyline", "lines => lines.forEach(line => line.style.display = 'none')"
        )
        assert plot.screenshot() != drawn, f"{ident}: its lines draw nothing"
    assert browser_page.errors == []
    assert browser_page.offsite == []
