"""The tests' warm commands (tests/warm.py) end as ``python`` would: a harness that waits
forever, or exits with another status or output, would pass or hang tests for reasons of its own.
Each script runs forked from the warm server and with :mod:`subprocess`; both must agree."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import warm

SCRIPTS = {
    # a module keeps its pool (Inductor's compile workers do): python's exit stops its threads
    "a thread pool a module holds": """
        import concurrent.futures, sys
        sys.pool = concurrent.futures.ThreadPoolExecutor(2)
        print(sys.pool.submit(lambda: 41 + 1).result())
        sys.exit(3)
    """,
    "a non-daemon thread, then atexit": """
        import atexit, threading, time
        atexit.register(lambda: print("atexit ran"))
        threading.Thread(target=lambda: (time.sleep(0.2), print("thread ran"))).start()
        print("main done")
    """,
    "an exception out of the script": """
        import sys
        print("before", file=sys.stderr)
        raise ValueError("raised by the script")
    """,
    "sys.exit with a message": """
        import sys
        sys.exit("stopped")
    """,
}


def _last_line(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[-1] if lines else ""


@pytest.mark.parametrize("name", SCRIPTS)
def test_a_warm_command_ends_as_python_does(name: str, tmp_path: Path) -> None:
    script = tmp_path / "script.py"
    script.write_text(textwrap.dedent(SCRIPTS[name]))
    command = [sys.executable, str(script)]
    cold = subprocess.run(command, capture_output=True, text=True, timeout=60, cwd=tmp_path)
    forked = warm.run(command, timeout=60, cwd=tmp_path)
    assert (forked.returncode, forked.stdout) == (cold.returncode, cold.stdout)
    assert _last_line(forked.stderr) == _last_line(cold.stderr)


def test_commands_started_and_ended_from_several_threads_keep_their_status(tmp_path: Path) -> None:
    """A test's thread pool starts commands while others end (multiprocessing polls every
    child when it starts one): each keeps its own exit status, never the 255 of an exit status
    read twice."""
    script = tmp_path / "script.py"
    script.write_text("import sys\nsys.exit(int(sys.argv[1]))\n")
    statuses = list(range(3, 19))
    with ThreadPoolExecutor(8) as pool:
        done = list(
            pool.map(
                lambda s: warm.run([sys.executable, str(script), str(s)], timeout=120), statuses
            )
        )
    assert [d.returncode for d in done] == statuses
