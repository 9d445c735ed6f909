"""Work done once per pytest run, however many pytest-xdist workers ask for it.

``pytest`` runs the tests in parallel worker processes (pytest-xdist, ``addopts`` in
pyproject.toml), each with a session of its own: a session-scoped fixture is computed once per
worker that uses it. Recordings that several test modules read are made here instead, in a
directory every worker of the run sees, under a file lock: the first worker to ask makes it,
the others wait for it and read what it made (the pattern pytest-xdist documents). Without
xdist it is the session's own base directory, and the work is done once as before.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from pathlib import Path

import pytest
from filelock import FileLock

DONE, FAILED = ".done", ".failed"  # beside a directory: made, or why making it failed
# Seconds a batch of recordings started together may take: each takes seconds alone, but a
# batch runs all at once, on cores shared with the other test worker (and other work).
BATCH_TIMEOUT = 900


def run_dir(factory: pytest.TempPathFactory) -> Path:
    """The directory of this pytest run that all its workers share: the parent of a worker's
    base directory (``pytest-N/popen-gwK``), or the base directory itself without xdist."""
    base = factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def run_lock(path: Path) -> FileLock:
    """The lock that guards ``path`` between the workers of a run."""
    return FileLock(f"{path}.lock")


def made_once(factory: pytest.TempPathFactory, name: str, make: Callable[[Path], object]) -> Path:
    """The run's directory ``name``, filled by ``make(directory)`` in the first worker that
    asks; the others wait, then get it. A failure is kept beside it and fails every later
    asker with the same message, rather than making it again."""
    path = run_dir(factory) / name
    done, failed = path.with_name(name + DONE), path.with_name(name + FAILED)
    with run_lock(path):
        if failed.exists():
            pytest.fail(f"making {name} failed earlier in this run:\n{failed.read_text()}")
        if not done.exists():
            shutil.rmtree(path, ignore_errors=True)  # left half made by a worker that died
            path.mkdir(parents=True)
            try:
                make(path)
            except BaseException as error:  # pytest.fail is a BaseException too
                failed.write_text(f"{type(error).__name__}: {error}")
                raise
            done.touch()
    return path
