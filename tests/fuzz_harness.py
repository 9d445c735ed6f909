"""One pair of the mutation fuzzer, end to end: its two scripts written, the oracle's truth
(``fuzz_oracle.py``) turned into right answers by the catalogue (``fuzz_mutations.py``), both
scripts recorded with OpGuard, diffed bit for bit and with ``--tolerant``, and each answer
scored (``fuzz_answers.py``).

Everything runs in this process, many pairs per process: ``import torch`` costs seconds, a
generated program well under one. Recording is ``opguard.record()`` around the script run as
``__main__`` (``runpy.run_path``, as ``opguard record`` runs it, so call sites are the
generated file's lines; ``tests/test_fuzz.py`` checks the traces are the CLI's), and the diff is
``opguard diff --json`` through the CLI's entry point: the ``opguard.diff/1`` object, the one
promise the fuzzer reads.
"""

from __future__ import annotations

import contextlib
import io
import json
import runpy
import shutil
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fuzz_answers import SIDES, Expected, Occurrence, Score, score
from fuzz_mutations import Answers, CatalogueError, Pair
from fuzz_oracle import Truth, compare, observe
from fuzz_programs import Script, render

MODES = {"bitwise": (), "tolerant": ("--tolerant",)}  # each diff a pair is scored by


@contextlib.contextmanager
def as_main(script: Path) -> Iterator[None]:
    """What ``python SCRIPT`` sets up, as ``opguard record`` does: argv, the script's directory
    first on the path, its printing kept out of the caller's output."""
    saved_argv, saved_path = sys.argv[:], sys.path[:]
    sys.argv = [str(script)]
    sys.path.insert(0, str(script.parent))
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            yield
    finally:
        sys.argv, sys.path[:] = saved_argv, saved_path


def record(script: Path, run_dir: Path) -> None:
    """Records ``script`` into ``run_dir`` with ``opguard.record()`` in this process."""
    import opguard

    with as_main(script), opguard.record(run_dir):
        runpy.run_path(str(script), run_name="__main__")


def diff_json(run_a: Path, run_b: Path, *options: str) -> dict[str, Any]:
    """``opguard diff RUN_A RUN_B --json [OPTIONS]`` through the CLI's entry point."""
    from opguard.cli import main

    out, err = io.StringIO(), io.StringIO()
    code = 0
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            main(["diff", str(run_a), str(run_b), "--json", *options])
        except SystemExit as exit_:
            code = int(exit_.code or 0)
    if code not in (0, 1, 3):  # 3: incomplete, an answer (scored: never a right one here)
        raise RuntimeError(f"opguard diff {' '.join(options)} exited {code}: {err.getvalue()}")
    return json.loads(out.getvalue())


def occurrences(runs: dict[str, Path]) -> Occurrence:
    """Which of the ops of one name, line and step an op index is, in each recorded run (the
    trace read up to that op)."""

    def occurrence(side: str, index: int) -> int:
        from opguard.store import Run

        with Run(runs[side]) as run:
            ops = [(o.op, o.call_site.line, o.step) for o in run.rank(0).ops(0, index + 1)]
        return ops[:-1].count(ops[-1])

    return occurrence


@dataclass
class Outcome:
    """One pair's result: the right answers, OpGuard's answers scored, or the error that kept
    the pair from being scored (a :class:`CatalogueError` is the fuzzer's own)."""

    name: str
    mutation: str
    family: str
    seed: int
    expected: dict[str, str] = field(default_factory=dict)  # "bitwise"/"tolerant" -> text
    scores: dict[str, Score] = field(default_factory=dict)
    results: dict[str, dict[str, Any]] = field(default_factory=dict)  # the diff objects
    scripts: dict[str, str] = field(default_factory=dict)  # "a"/"b" -> text
    truth: str = ""
    error: str = ""
    seconds: float = 0.0

    def right(self, mode: str) -> bool:
        return not self.error and self.scores[mode].right


def _truth_text(truth: Truth) -> str:
    source = truth.source.describe() if truth.source is not None else "none"
    state = (
        "bit for bit equal" if truth.state_step is None else f"differs from step {truth.state_step}"
    )
    return f"training {state}; same ops: {truth.same_ops}; first divergence: {source}" + "".join(
        f"; {note}" for note in truth.notes
    )


def run_pair(pair: Pair, root: Path, *, keep: bool = False) -> Outcome:
    """Runs ``pair`` in ``root/NAME`` (removed afterwards unless ``keep``) and scores it."""
    started = time.perf_counter()
    outcome = Outcome(pair.name, pair.mutation.name, pair.mutation.family, pair.seed)
    where = root / pair.name
    where.mkdir(parents=True, exist_ok=True)
    scripts: dict[str, Script] = {
        side: render(program, f"Pair {pair.name}, run {side.upper()}.")
        for side, program in zip(SIDES, (pair.a, pair.b), strict=True)
    }
    paths = {side: where / f"{side}.py" for side in SIDES}
    for side in SIDES:
        paths[side].write_text(scripts[side].text)
        outcome.scripts[side] = scripts[side].text
    try:
        truth = compare(*(observe(paths[s], ops=not pair.a.compile) for s in SIDES))
        outcome.truth = _truth_text(truth)
        answers = pair.mutation.rule.answers(truth, scripts["a"], scripts["b"])
        _score(outcome, answers, paths, where)
    except CatalogueError as exc:
        outcome.error = f"catalogue: {exc} ({outcome.truth})"
    except Exception as exc:  # a crash of a recording or a diff: reported, never a pass
        outcome.error = f"{type(exc).__name__}: {exc}"
    finally:
        if not keep:
            shutil.rmtree(where, ignore_errors=True)
    outcome.seconds = time.perf_counter() - started
    return outcome


def _score(outcome: Outcome, answers: Answers, paths: dict[str, Path], where: Path) -> None:
    runs = {side: where / f"run_{side}" for side in SIDES}
    for side in SIDES:
        record(paths[side], runs[side])
    occurrence = occurrences(runs)
    expected: dict[str, Expected] = {"bitwise": answers.bitwise, "tolerant": answers.tolerant}
    for mode, options in MODES.items():
        result = diff_json(runs["a"], runs["b"], *options)
        outcome.results[mode] = result
        outcome.expected[mode] = expected[mode].text
        outcome.scores[mode] = score(expected[mode], result, paths, occurrence)
