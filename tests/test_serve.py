"""``opguard serve`` in a real browser: the server runs as a user starts it, on the demo runs,
headless Chromium (tests/browser.py) opens the URL it prints, and the screen is read back from
the page's terminal (xterm.js's buffer: the text a person sees) while keys are pressed into it.
It proves the debugger works there, that the server refuses what it must (a missing or wrong
token off loopback, another site's page, a rebound name), and that closing the page ends the
debugger's processes. Without Playwright, a chromium or textual-serve, the tests that need
them skip, saying what to install.

``OPGUARD_SCREENSHOTS=docs/images pytest tests/test_serve.py -k answers_keys`` writes the
screenshots the docs show.
"""

from __future__ import annotations

import importlib.util
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import pytest
from browser import BrowserPage
from conftest import cli_in_process, opguard_cmd, run_cli

if TYPE_CHECKING:
    from playwright.sync_api import Route

needs_textual_serve = pytest.mark.skipif(
    importlib.util.find_spec("textual_serve") is None,
    reason="textual-serve is not installed (bash tools/install.sh serve)",
)
STARTUP_SECONDS = 30
# About 155 x 45 cells: the debugger shows its list, detail and agent panel side by side from
# 150 columns on (narrower, the agent panel pushes the detail pane and itself off the screen).
FONT_SIZE = 12  # pixels (textual-serve's page takes it in its query): small screenshots
VIEWPORT = {"width": 1060, "height": 650}
TEST_NET = "192.0.2.1"  # TEST-NET-1: an address no machine has, so none can listen on it
# textual-serve's page keeps its xterm.js terminal to itself: the test's copy of the page's script
# also hands it to the window, where the test reads the screen.
TERMINAL = re.compile(r"this\.terminal=new (\w+)\.Terminal\(")
SCREEN = """() => {
    const terminal = window.opguardTerminal;
    if (!terminal) return "";
    const buffer = terminal.buffer.active, lines = [];
    for (let y = 0; y < terminal.rows; y++)
        lines.push(buffer.getLine(buffer.viewportY + y).translateToString(true));
    return lines.join("\\n");
}"""

PAINTED = "() => new Promise(done => requestAnimationFrame(() => requestAnimationFrame(done)))"


def until(ready: Callable[[], object], what: str, timeout: float = 60) -> None:
    """Waits until ``ready()`` is true (polling), failing with ``what`` after ``timeout``."""
    deadline = time.monotonic() + timeout
    while not ready():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


def descendants(pid: int) -> set[int]:
    """The live processes below ``pid`` (read from /proc; an exited child not yet reaped is
    not live)."""
    children: dict[int, list[int]] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue  # it just ended
        state, parent = stat.rpartition(")")[2].split()[:2]
        if state != "Z":
            children.setdefault(int(parent), []).append(int(entry.name))
    found: set[int] = set()
    todo = [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def command_lines(pids: set[int]) -> list[list[str]]:
    """The command lines of those of ``pids`` still running."""
    lines = []
    for pid in pids:
        try:
            lines.append(Path(f"/proc/{pid}/cmdline").read_text().split("\0")[:-1])
        except OSError:
            continue  # it just ended
    return lines


@dataclass
class Served:
    """A running ``opguard serve``: the process, what it said on starting, and its URL."""

    process: subprocess.Popen[str]
    said: str
    url: str

    def at(self, path: str, host: str = "127.0.0.1") -> str:
        """A URL of this server reached through ``host``, for ``path`` (query included)."""
        port = re.search(r":(\d+)/", self.url)
        assert port, self.url
        return f"http://{host}:{port[1]}{path}"


@contextmanager
def serving(runs: tuple[Path, Path], tmp: Path, *options: str) -> Iterator[Served]:
    """``opguard serve RUNS --port 0 OPTIONS`` until the block ends (then Ctrl+C, which must
    stop it), with no model configured (the agent panel reads offline). The runs are named as
    ``opguard demo`` names them, which the debugger's header shows."""
    folder = runs[0].parent
    assert runs[1].parent == folder
    (tmp / "opguard-demo").symlink_to(folder, target_is_directory=True)
    log = tmp / "serve.log"
    env = {k: v for k, v in os.environ.items() if k not in ("OPGUARD_MODEL", "OPGUARD_API_BASE")}
    with log.open("w") as out:
        process = subprocess.Popen(
            opguard_cmd(
                "serve", *(f"opguard-demo/{run.name}" for run in runs), "--port", "0", *options
            ),
            cwd=tmp,
            stdout=out,
            stderr=subprocess.STDOUT,
            text=True,
            env={**env, "XDG_CONFIG_HOME": str(tmp / "config")},
        )
    try:
        until(
            lambda: "http" in log.read_text() or process.poll() is not None,
            "opguard serve to print its URL",
            STARTUP_SECONDS,
        )
        said = log.read_text()
        found = re.search(r"http://\S+", said)
        assert found and process.poll() is None, said
        yield Served(process, said, found[0])
        process.send_signal(signal.SIGINT)
        assert process.wait(STARTUP_SECONDS) == 0, log.read_text()
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()


@pytest.fixture(scope="module")
def served(
    demo_runs: tuple[Path, Path], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Served]:
    """The demo runs served on loopback, as ``opguard serve`` does by default."""
    with serving(demo_runs, tmp_path_factory.mktemp("serve")) as server:
        yield server


class Debugger:
    """The served debugger in a browser page: its screen as the page's terminal holds it, and
    keys typed into it."""

    def __init__(self, tab: BrowserPage, url: str) -> None:
        self.page = tab.page
        self.page.set_viewport_size(VIEWPORT)
        self.page.route("**/static/js/textual.js", self._expose_terminal)
        response = self.page.goto(f"{url}{'&' if '?' in url else '?'}fontsize={FONT_SIZE}")
        assert response is not None and response.ok, response

    @staticmethod
    def _expose_terminal(route: Route) -> None:
        response = route.fetch()
        script, found = TERMINAL.subn(
            r"this.terminal=window.opguardTerminal=new \1.Terminal(", response.text()
        )
        assert found == 1, "textual-serve's textual.js no longer creates its terminal so"
        route.fulfill(response=response, body=script)

    def screen(self) -> str:
        return self.page.evaluate(SCREEN)

    def wait_for(self, ready: Callable[[str], bool], what: str) -> str:
        """The screen, once ``ready(screen)`` holds; on a timeout the error shows the last."""
        shown = ""

        def drawn() -> bool:
            nonlocal shown
            shown = self.screen()
            return ready(shown)

        try:
            until(drawn, f"the screen to show {what}")
        except AssertionError as timeout:
            raise AssertionError(f"{timeout}:\n{shown}") from None
        return shown

    def focus(self) -> None:
        self.page.locator(".xterm-helper-textarea").focus()  # where xterm.js takes keys

    def press(self, key: str) -> None:
        self.focus()
        self.page.keyboard.press(key)

    def cursor_line(self) -> str:
        return next((line for line in self.screen().splitlines() if line.startswith("▶")), "")

    def screenshot(self, name: str, tmp: Path) -> None:
        """A screenshot for the docs (into $OPGUARD_SCREENSHOTS when set)."""
        folder = Path(os.environ.get("OPGUARD_SCREENSHOTS") or tmp)
        # xterm.js paints what it was sent on the next animation frames
        self.page.evaluate(PAINTED)
        self.page.screenshot(path=folder / name)


def op_index(line: str) -> int:
    return int(line.split()[1])


def ready(screen: str) -> bool:
    """The diff has landed: the detail pane shows the first divergence and both losses (the
    background comparison's last result) are drawn."""
    return "[first divergence]" in screen and screen.count(", last ") == 2


def status(url: str, headers: dict[str, str] | None = None) -> int:
    """The HTTP status of a GET of ``url``."""
    try:
        with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}), timeout=10):
            return 200
    except urllib.error.HTTPError as error:
        return error.code


@needs_textual_serve
def test_the_debugger_answers_keys_in_a_browser(
    served: Served, browser_page: BrowserPage, tmp_path: Path
) -> None:
    debugger = Debugger(browser_page, served.url)
    shown = debugger.wait_for(ready, "the first divergence")
    assert "DIVERGED" in shown and "eps: 1e-05 (A) vs 1e-06 (B)" in shown
    first = debugger.cursor_line()
    assert "FIRST" in first and "native_layer_norm" in first
    debugger.focus()  # the footer lists the keys while the page has the focus
    debugger.wait_for(lambda s: "? help  q quit" in s, "the keys in the footer")
    debugger.screenshot("serve.png", tmp_path)

    debugger.press("n")
    debugger.wait_for(lambda _: "differs" in debugger.cursor_line(), "the next difference")
    assert op_index(debugger.cursor_line()) > op_index(first)

    debugger.press("a")
    shown = debugger.wait_for(lambda s: "Agent: offline reading" in s, "the agent panel")
    assert "Ask about op" in shown  # the question box, about the op under the cursor
    debugger.screenshot("serve-agent.png", tmp_path)
    assert browser_page.errors == []

    apps = descendants(served.process.pid)
    assert apps, "no debugger process runs for the page"
    browser_page.page.close()
    until(lambda: not descendants(served.process.pid), "closing the page to end the debugger")


@needs_textual_serve
def test_off_loopback_every_request_needs_the_token(
    demo_runs: tuple[Path, Path], browser_page: BrowserPage, tmp_path: Path
) -> None:
    with serving(demo_runs, tmp_path, "--host", "0.0.0.0", "--tolerant") as server:
        assert "token=" in server.url and "no login of its own" in server.said
        token = server.url.partition("token=")[2]
        for path in ("/", "/?token=wrong", f"/?token={token[:-1]}", "/static/js/textual.js", "/ws"):
            assert status(server.at(path)) == 403, path
        assert descendants(server.process.pid) == set()  # and nothing started

        # The page, then its script, styles and websocket, which carry the cookie it set.
        debugger = Debugger(browser_page, server.at(f"/?token={token}"))
        debugger.wait_for(lambda s: "A #  B #" in s, "the op list")
        assert browser_page.errors == []
        # Closed early (its diff still running, on most machines): every process ends.
        apps = command_lines(descendants(server.process.pid))
        assert ["tui", "opguard-demo/baseline", "opguard-demo/refactored", "--tolerant=auto"] in [
            app[-4:] for app in apps
        ], apps
        browser_page.page.close()
        until(lambda: not descendants(server.process.pid), "closing the page to end the debugger")


@needs_textual_serve
def test_on_loopback_other_sites_and_names_are_refused(served: Served) -> None:
    assert "token" not in served.said
    page = served.at("/")
    assert status(page) == 200
    assert status(served.at("/", host="localhost")) == 200
    # A page of another site, and a DNS-rebinding one (its own name, resolved to 127.0.0.1).
    assert status(page, {"Origin": "http://evil.example"}) == 403
    assert status(page, {"Origin": served.at("")}) == 200  # the page's own
    assert status(page, {"Host": "evil.example"}) == 403


@pytest.mark.parametrize(
    ("options", "said"),
    [
        (["--port", "70000"], "a port is a number from 0 to 65535, not '70000'"),
        (["--host", TEST_NET], f"cannot listen on {TEST_NET}:8000: "),
        (["--port", "{busy}"], "cannot listen on 127.0.0.1:{busy}: "),
    ],
    ids=["port", "host", "busy"],
)
@needs_textual_serve
def test_bad_options_are_one_line(
    demo_runs: tuple[Path, Path], options: list[str], said: str
) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        argv = [option.format(busy=busy) for option in options]
        # (a process of its own: Playwright keeps an event loop running in this one)
        result = run_cli("serve", *map(str, demo_runs), *argv, timeout=STARTUP_SECONDS)
    assert result.returncode == 2 and result.stdout == ""
    err = result.stderr
    assert err.count("\n") == 1 and said.format(busy=busy) in err, err


def test_bad_runs_and_a_missing_extra_are_one_line(
    demo_runs: tuple[Path, Path], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    code, _, err = cli_in_process("serve", str(tmp_path / "missing"), str(demo_runs[1]))
    assert code == 2 and err.startswith("opguard: error: ") and err.count("\n") == 1, err

    for name in [name for name in sys.modules if name.startswith("textual_serve")]:
        monkeypatch.setitem(sys.modules, name, None)  # as where it is not installed
    monkeypatch.setitem(sys.modules, "textual_serve", None)
    monkeypatch.delitem(sys.modules, "opguard.cli.serving", raising=False)
    # (on an address no machine of this test has: were it served, it would fail, not run on)
    code, out, err = cli_in_process("serve", *map(str, demo_runs), "--host", TEST_NET)
    assert (code, out) == (2, "")
    assert err == (
        "opguard: error: opguard serve needs textual-serve (textual_serve is not installed): "
        "pip install textual-serve (or bash tools/install.sh serve)\n"
    )
