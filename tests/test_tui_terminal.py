"""``opguard tui`` in a real terminal: tmux runs it on the demo runs, ``send-keys`` presses keys
and ``capture-pane`` reads back what a person would see. Skipped where tmux is not installed."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from conftest import opguard_cmd

pytestmark = pytest.mark.skipif(shutil.which("tmux") is None, reason="tmux is not installed")

SOCKET = f"opguard-test-{os.getpid()}"  # a tmux server of our own, never the user's
SESSION = "tui"


def tmux(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["tmux", "-L", SOCKET, *args], capture_output=True, text=True, check=check, timeout=30
    )


def screen() -> str:
    return tmux("capture-pane", "-p", "-t", SESSION).stdout


def wait_for(ready: Callable[[str], bool], what: str, timeout: float = 60) -> str:
    deadline = time.monotonic() + timeout
    shown = ""
    while time.monotonic() < deadline:
        shown = screen()
        if ready(shown):
            return shown
        time.sleep(0.2)
    raise AssertionError(f"the screen never showed {what}:\n{shown}")


def cursor_line(shown: str) -> str:
    return next((line for line in shown.splitlines() if line.startswith("▶")), "")


@pytest.fixture
def terminal(demo_runs: tuple[Path, Path]) -> Iterator[None]:
    # The app must size itself from the terminal, not from COLUMNS/LINES that pytest may set.
    command = shlex.join(
        [
            "env",
            "-u",
            "COLUMNS",
            "-u",
            "LINES",
            *opguard_cmd("tui", *map(str, demo_runs)),
        ]
    )
    tmux("new-session", "-d", "-s", SESSION, "-x", "160", "-y", "48", command)
    yield
    tmux("kill-server", check=False)


def test_opens_on_the_first_divergence_and_answers_keys(terminal: None) -> None:
    shown = wait_for(
        lambda s: "DIVERGED" in s and "FIRST" in cursor_line(s),
        "the cursor on the first divergence",
    )
    line = cursor_line(shown)
    assert "native_layer_norm" in line
    assert "eps" in shown  # the header names the argument that differs
    first = int(line.split()[1])

    tmux("send-keys", "-t", SESSION, "j")
    shown = wait_for(
        lambda s: cursor_line(s).split()[1:2] == [str(first + 1)], f"the cursor on op {first + 1}"
    )
    assert "FIRST" not in cursor_line(shown)

    tmux("send-keys", "-t", SESSION, "?")
    wait_for(lambda s: "follow the first differing input" in s, "the key help")
    tmux("send-keys", "-t", SESSION, "q")  # (Escape then q would read as alt+q)
    wait_for(lambda s: "follow the first differing input" not in s, "the help closed")
    tmux("send-keys", "-t", SESSION, "q")
    deadline = time.monotonic() + 30
    while tmux("has-session", "-t", SESSION, check=False).returncode == 0:
        assert time.monotonic() < deadline, f"q did not quit:\n{screen()}"
        time.sleep(0.2)
