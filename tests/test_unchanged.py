"""Recording never changes the training: every script of the scenario suite prints the same
output recorded and unrecorded, and every value its lines read with ``.item()`` (the losses)
is the same to the last bit.

The recorded runs are the scenario suite's own recordings (tests/scenario_runs.py, shared with
tests/test_scenarios.py); each script is also run plainly under tests/scripts/item_values.py,
which reports its ``.item()`` values exactly. The recorded values come from the traces. (On
the GPU, tests/test_cuda.py checks that recording adds no host synchronisation.)
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path
from typing import Any

import pytest
import warm
from scenario_runs import ENV, RECORDINGS, SCRIPT_ARGS, Recordings, session_recordings

from opguard.store import Run

pytestmark = pytest.mark.slow  # long in all: started first (conftest.py)

ITEM_VALUES = Path(__file__).resolve().parent / "scripts" / "item_values.py"
# Every scenario script once, to its end (not the reruns, nor the one stopped by --steps).
SCRIPTS = [name for name, (_, options) in RECORDINGS.items() if not options and "rerun" not in name]


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Recordings:
    recordings = session_recordings(tmp_path_factory)
    recordings(*SCRIPTS)  # all at once, in parallel
    return recordings


def recorded_item_values(run_dir: Path, script: Path, lines: set[int]) -> list[list[Any]]:
    """``[line, value]`` of each ``.item()`` on those lines of the script, as the trace holds
    them (other lines' scalar reads, such as the optimizer's inside ``opt.step()``, are not
    the script's own ``.item()`` calls)."""
    with Run(run_dir) as run:
        return [
            [op.call_site.line, float(op.returned).hex()]
            for op in run.rank(0).ops()
            if op.op == "aten::_local_scalar_dense.default"
            and op.call_site.line in lines
            and Path(op.call_site.file).resolve() == script.resolve()
        ]


@pytest.mark.parametrize("name", SCRIPTS)
def test_recording_changes_nothing_the_training_computes(
    runs: Recordings, name: str, tmp_path: Path
) -> None:
    (run_dir,) = runs(name)
    script, _ = RECORDINGS[name]
    plain = warm.run(
        [sys.executable, str(ITEM_VALUES), str(script), *SCRIPT_ARGS.get(name, ())],
        cwd=tmp_path,
        env={**os.environ, **ENV},
        timeout=300,
    )
    assert plain.returncode == 0, plain.stderr
    marked = [line for line in plain.stderr.splitlines() if line.startswith("ITEM_VALUES ")]
    plain_values = json.loads(marked[-1].split(" ", 1)[1])
    recorded_stdout = (run_dir.parent / f"{name}.stdout").read_text()
    assert plain.stdout == recorded_stdout
    assert "loss" in plain.stdout
    assert plain_values, "the script read no value with .item()"
    lines = {line for line, _ in plain_values}
    assert recorded_item_values(run_dir, script, lines) == plain_values
