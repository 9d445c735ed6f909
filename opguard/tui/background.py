"""Comparing two runs in a child process.

Diffing a pair of million-op traces is tens of seconds of pure Python. In a thread it would hold
the GIL that the UI needs for every key press, and scrolling would stall until it finished; in
its own interpreter it costs the UI nothing. The child (``python -m opguard.tui.background``)
imports only the store and the analysis and writes pickled results to its stdout, in order:
the rank's diff, then both runs' loss curves, or one error line.
"""

from __future__ import annotations

import pickle
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

from ..analysis import diff_runs
from ..analysis.browse.rows import Side
from ..analysis.browse.series import item_losses
from ..analysis.tolerant.rule import Tolerance, parse_tolerance
from ..store import Run


def compare(
    path_a: str, path_b: str, rank: int, out: IO[bytes], tolerance: Tolerance | None = None
) -> None:
    """The child's work: never raises, every outcome is a result on ``out``."""

    def send(kind: str, payload: Any) -> None:
        pickle.dump((kind, payload), out)
        out.flush()

    try:
        with Run(path_a) as run_a, Run(path_b) as run_b:
            result = diff_runs(run_a, run_b, rank=rank, tolerance=tolerance).ranks[0]
            send("diff", result)
            runs = {Side.A: run_a, Side.B: run_b}
            traces = {side: run.rank(result.trace_ranks[side.value]) for side, run in runs.items()}
            send("loss", {side: item_losses(trace) for side, trace in traces.items()})
    except Exception as exc:
        send("error", f"{type(exc).__name__}: {exc}")


class Comparison:
    """One rank's comparison, running in a child process from construction on."""

    def __init__(
        self, path_a: Path, path_b: Path, rank: int, tolerance: Tolerance | None = None
    ) -> None:
        tolerant = [] if tolerance is None else [tolerance.argument()]
        if tolerance is not None and tolerance.noise is not None:
            tolerant.append(str(Path(tolerance.noise).resolve()))
        self._process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                __name__,
                str(path_a.resolve()),
                str(path_b.resolve()),
                str(rank),
                *tolerant,
            ],
            # `python -m` puts the working directory first on sys.path: a source checkout there
            # must not shadow the installed package.
            cwd=tempfile.gettempdir(),
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL,
        )

    def results(self) -> Iterator[tuple[str, Any]]:
        """("diff", RankDiff), ("loss", {Side: {step: value}}) or ("error", text), as they
        arrive; ends when the child is done or :meth:`stop` was called."""
        stdout = self._process.stdout
        assert stdout is not None
        while True:
            try:
                yield pickle.load(stdout)  # our own child's output: trusted
            except (EOFError, OSError, ValueError, pickle.UnpicklingError):
                code = self._process.wait()
                if code not in (0, -signal.SIGTERM):  # SIGTERM: stopped by us
                    yield ("error", f"the comparing process exited with status {code}")
                return

    def stop(self) -> None:
        """Ends the child now (a rank switch or quitting makes its answer useless)."""
        if self._process.poll() is None:
            self._process.terminate()
        self._process.wait()
        if self._process.stdout is not None:
            self._process.stdout.close()


if __name__ == "__main__":
    noise = sys.argv[5] if len(sys.argv) > 5 else None
    tolerance = parse_tolerance(sys.argv[4], noise) if len(sys.argv) > 4 else None
    compare(sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.stdout.buffer, tolerance)
