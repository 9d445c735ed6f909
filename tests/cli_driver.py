"""Runs many ``opguard`` command lines in one process, for tests/test_bad_input.py.

``python cli_driver.py CASES.json RESULTS.jsonl``: CASES is a list of ``[id, argv]``; for each,
the id is first appended to ``RESULTS.jsonl.started`` (so that a process killed by a signal in a
case names it), then ``opguard.cli.main(argv)`` runs with stdout and stderr captured, and one
line ``{"id", "code", "stdout", "stderr", "escaped"}`` is appended to RESULTS (``escaped``: an
exception that got out of ``main``, with its traceback). One process for all cases: interpreter
and import start-up would otherwise be most of the time.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import traceback

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

from opguard.cli import main


def run_case(argv: list[str]) -> dict[str, object]:
    out, err = io.StringIO(), io.StringIO()
    code: object = 0
    escaped = None
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(argv)
        except SystemExit as exit_:
            code = exit_.code if exit_.code is not None else 0
        except BaseException:
            escaped = traceback.format_exc()
    return {"code": code, "stdout": out.getvalue(), "stderr": err.getvalue(), "escaped": escaped}


def run_all(cases_path: str, results_path: str) -> None:
    with open(cases_path) as f:
        cases = json.load(f)
    with open(results_path, "a") as results, open(results_path + ".started", "a") as started:
        for case_id, argv in cases:
            started.write(case_id + "\n")
            started.flush()
            results.write(json.dumps({"id": case_id, **run_case(argv)}) + "\n")
            results.flush()


if __name__ == "__main__":
    run_all(sys.argv[1], sys.argv[2])
