"""``opguard hunt``: from two runs to the op where they part, in one command.

Recording every op of a long run costs too much, so the hunt goes in two passes. The first
records both runs at step level (``opguard record --steps-only``), cheap enough for the whole
run, and the step-level diff names the first step K (and rank) whose training state differs.
The second records both runs again, op by op in step K only (``--window K:K+1 --steps K+1``),
and the op-level diff of those windows names the op and its line.

Under ``--tolerant`` (runs expected to differ by rounding: another torch build, another GPU)
the first pass names the first step whose state goes beyond the rounding envelope
(:mod:`opguard.analysis.tolerant.envelope`; ``--noise CONTROL``: measured by a control run of
run A's script), and the second pass's diff is the op-level tolerant diff of that step, the
state entering it taken as the step-level records judged it. Where that diff finds every op
within rounding of its inputs, the step's growth was the training's amplification, not a
change, and the hunt says so (its verdict then ``within-rounding``).

The second pass must show the difference the first found, at the same step and rank. When it
does not (the state at K is equal this time, or the first difference moved), the cause is
nondeterministic (a race, a nondeterministic kernel, a hardware fault), and what catches it is
a flight recorder on the next run (``--keep-last``): the hunt says so rather than report the
window's diff as the answer.

Torch-free: each recording is an ordinary ``opguard record`` child process, whose output goes
to a log beside its run directory (never to this process's output, which an MCP client may be
reading); this module starts them and diffs what they wrote.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .analysis import RunDiff
from .analysis.contract import to_json
from .analysis.state_diff import StepDivergence, window_switches
from .analysis.tolerant.rule import Tolerance
from .children import refusal
from .distributed.driver import compare_runs

SCHEMA = "opguard.hunt/1"
# What a brief answer keeps of each diff's object: the diff tool on the runs gives the rest.
BRIEF_KEYS = ("verdict", "first_divergence", "step_level", "notes")
KEEP_LAST = 20  # the flight recorder suggested when the second pass does not reproduce
# The two passes: their directory suffix (DIR/a-steps, DIR/b-window) and how each says it.
STEP_PASS, WINDOW_PASS = "steps", "window"
PASSES = (STEP_PASS, WINDOW_PASS)
PASS_TEXT = {STEP_PASS: "at step level", WINDOW_PASS: "op by op in step {step}"}

Progress = Callable[[str], None]


class HuntError(Exception):
    """A hunt that cannot go on (bad input, a recording that failed): one line."""


def target_words(text: str, option: str) -> list[str]:
    """``'train.py ARGS'`` or ``'-m module ARGS'`` (one shell-quoted string, as ``--a`` takes
    it) as ``opguard record`` takes its target: ``-- train.py ARGS`` or ``-m module -- ARGS``."""
    try:
        words = shlex.split(text)
    except ValueError as exc:
        raise HuntError(f"{option} {text!r}: {exc}") from None
    if not words:
        raise HuntError(f"{option} is empty: give 'train.py ARGS' or '-m module ARGS'")
    if words[0] == "-m":
        if len(words) < 2:
            raise HuntError(f"{option} {text!r}: -m needs a module")
        # after --, the module's own options are not taken for opguard record's
        return [*words[:2], "--", *words[3 if words[2:3] == ["--"] else 2 :]]
    # A script, or a launcher opguard record knows (torchrun): refused now, not after the
    # other run's recording.
    if not (os.path.isfile(words[0]) or shutil.which(words[0])):
        raise HuntError(f"{option}: {words[0]}: no such script")
    return ["--", *words]


@dataclass(frozen=True, slots=True)
class Recording:
    """One run recorded in one pass: its run directory and the log of its output."""

    run: str  # "a" or "b"
    kind: str  # STEP_PASS or WINDOW_PASS
    path: Path
    log: Path

    @classmethod
    def of(cls, directory: Path, run: str, kind: str) -> Recording:
        name = f"{run}-{kind}"
        return cls(run, kind, directory / name, directory / f"{name}.log")

    @property
    def key(self) -> str:
        """Its key in the JSON's ``runs`` and ``logs``: ``a_steps``, ``b_window``."""
        return f"{self.run}_{self.kind}"


@dataclass(frozen=True)
class Hunter:
    """What to record: both runs' targets, where, and under which interpreter; and how to
    compare each pass's recordings."""

    directory: Path
    targets: dict[str, list[str]]  # "a"/"b": opguard record's target words
    python: str | None = None
    overwrite: bool = False
    progress: Progress | None = None
    tolerance: Tolerance | None = None  # --tolerant: the envelope, then the op-level rule
    ray: str | None = None  # the diffs on that Ray cluster (opguard.distributed)

    def record(
        self, run: str, kind: str, switches: list[str], step: int | None = None
    ) -> Recording:
        """``opguard record SWITCHES`` of one run into DIR/RUN-KIND, its output into
        DIR/RUN-KIND.log; a recording that fails ends the hunt (:class:`HuntError`)."""
        rec = Recording.of(self.directory, run, kind)
        how = PASS_TEXT[kind].format(step=step)
        if self.progress is not None:
            self.progress(f"opguard hunt: recording run {run.upper()} {how} into {rec.path}")
        command = [sys.executable, "-m", "opguard", "record", "-o", str(rec.path), *switches]
        if self.python:
            command += ["--python", self.python]
        if self.overwrite:
            command.append("--overwrite")
        command += self.targets[run]
        with rec.log.open("w") as log:
            # stdin closed: a child reading it would read an MCP client's requests
            code = subprocess.run(
                command, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT
            ).returncode
        if code != 0:
            raise HuntError(_failure(rec, how, code))
        return rec

    def diff(self, a: Recording, b: Recording) -> RunDiff:
        """Both runs' recordings of one pass compared (under the tolerance, on the Ray
        cluster, with ``ray``)."""
        return compare_runs(
            str(a.path), str(b.path), ray=self.ray, tolerance=self.tolerance, report=self.progress
        )


def _failure(rec: Recording, how: str, code: int) -> str:
    """One line: which run failed in which pass, why when OpGuard said why, and where its
    output is."""
    said = refusal(code, rec.log.read_text(errors="replace"))
    run = f"run {rec.run.upper()}"
    if said is not None:  # opguard record refused it
        return f"{run}: {said} (output: {rec.log})"
    return f"{run} failed while recorded {how} (exit status {code}); its output: {rec.log}"


def _entry(div: StepDivergence) -> str:
    """The state entry that differs first in a step; for the loss, with the first differing
    gradient (where in the backward the difference went first)."""
    if div.first.kind != "loss":
        return div.first.label
    grads = div.comparison.by_kind().get("grad")
    return "the loss" + (f" (first gradient: {grads[0].label})" if grads else "")


@dataclass
class Hunt:
    """A hunt's outcome: the step-level diff of the first pass and, when it found a step, the
    op-level diff of both runs recorded again op by op in that step."""

    directory: Path
    step_level: RunDiff
    recordings: list[Recording]  # both runs' first pass, then their second when there was one
    op_level: RunDiff | None = None
    tolerance: Tolerance | None = None  # --tolerant: the envelope, then the op-level rule

    @property
    def within_rounding(self) -> bool:
        """Under --tolerant: the step went beyond the envelope and, recorded again, every op of
        it is within rounding of its inputs (the training amplified the difference there)."""
        op_level = self.op_level
        return bool(self.reproduced) and op_level is not None and not op_level.diverged

    @property
    def found(self) -> StepDivergence | None:
        """The first differing step (and rank) of the first pass."""
        return self.step_level.state_first

    @property
    def again(self) -> StepDivergence | None:
        """The first differing step of the second pass (its step-level records)."""
        return self.op_level.state_first if self.op_level is not None else None

    @property
    def reproduced(self) -> bool | None:
        """Whether the second pass differs first where the first did (None: no second pass)."""
        found, again = self.found, self.again
        if found is None or self.op_level is None:
            return None
        return again is not None and (again.step, again.rank) == (found.step, found.rank)

    @property
    def verdict(self) -> str:
        if self.tolerance is not None and self.within_rounding:
            return "within-rounding"
        return self.step_level.verdict

    @property
    def found_by(self) -> str:
        """The report's first line: how step K was found, and what the second pass made of it."""
        found = self.found
        if found is None:
            counts = {r.states.compared for r in self.step_level.ranks if r.states is not None}
            compared = f" ({max(counts)} steps compared)" if counts else ""
            if self.step_level.verdict == "within-rounding":
                return (
                    f"within rounding: the step-level records of both runs stay within the "
                    f"rounding envelope{compared}; nothing to record op by op"
                )
            return (
                f"identical: the step-level records of both runs agree{compared}; "
                "nothing to record op by op"
            )
        parting = "go beyond the rounding envelope" if found.beyond else "differ"
        head = (
            f"step {found.step} (rank {found.rank}): the step-level records first {parting} at "
            f"{_entry(found)}"
        )
        if self.within_rounding:
            return (
                f"{head}; recorded its ops in both runs, every op of step {found.step} is within "
                "rounding of its inputs: the training amplified the difference there faster "
                "than the envelope allows (a control run, --noise, measures how fast), no change"
            )
        if self.reproduced:
            return f"{head}; recorded its ops in both runs:"
        again = self.again
        if again is None:
            moved = f"the runs' state is equal up to step {found.step}"
        else:
            moved = f"they first differ at step {again.step} (rank {again.rank}, {_entry(again)})"
        return (
            f"{head}, but recorded again {moved}: not reproduced, so the cause is "
            "nondeterministic (a race, a nondeterministic kernel, a hardware fault)"
        )

    @property
    def next_time(self) -> str | None:
        """What to run next when the second pass did not reproduce the difference."""
        if self.reproduced is not False:
            return None
        return (
            f"record the next runs with a flight recorder (opguard record --keep-last "
            f"{KEEP_LAST} …), which keeps the ops of the last {KEEP_LAST} steps: a run that "
            f"stops (or fails) within {KEEP_LAST} steps of the difference holds the ops that made it"
        )

    @property
    def exit_code(self) -> int:
        """As ``opguard diff``'s: 0 identical (or within rounding), 1 diverged."""
        return 1 if self.verdict == "diverged" else 0

    def to_json(self, *, brief: bool = False) -> dict[str, Any]:
        """The ``opguard.hunt/1`` object; ``brief``: of each diff's ``opguard.diff/1`` object
        only :data:`BRIEF_KEYS` (what an agent's answer has room for)."""
        found = self.found
        recorded: dict[str, Recording | None] = {
            Recording.of(self.directory, run, kind).key: None for kind in PASSES for run in "ab"
        }
        recorded |= {rec.key: rec for rec in self.recordings}
        return {
            "schema": SCHEMA,
            "verdict": self.verdict,
            "found_by": self.found_by,
            "step": found.step if found is not None else None,
            "rank": found.rank if found is not None else None,
            "reproduced": self.reproduced,
            "next": self.next_time,
            "directory": str(self.directory),
            "runs": {key: str(rec.path) if rec else None for key, rec in recorded.items()},
            "logs": {key: str(rec.log) if rec else None for key, rec in recorded.items()},
            "step_level": _diff_json(self.step_level, brief),
            "op_level": _diff_json(self.op_level, brief) if self.op_level is not None else None,
            "tolerance": self.tolerance.to_json() if self.tolerance is not None else None,
        }


def _diff_json(result: RunDiff, brief: bool) -> dict[str, Any]:
    whole = to_json(result)
    return {key: whole[key] for key in BRIEF_KEYS} if brief else whole


def hunt(
    directory: Path,
    target_a: str,
    target_b: str,
    *,
    python: str | None = None,
    overwrite: bool = False,
    progress: Progress | None = None,
    tolerance: Tolerance | None = None,
    ray: str | None = None,
) -> Hunt:
    """Both passes: both runs at step level, then, if they differ (beyond the rounding envelope
    under a ``tolerance``), both again op by op in the first such step; ``ray``: each pass's
    diff on that Ray cluster. Raises :class:`HuntError` (one line) for bad input and failed
    recordings, and the store's ``TraceError`` for traces the diff cannot read."""
    targets = {"a": target_words(target_a, "--a"), "b": target_words(target_b, "--b")}
    if not overwrite:  # before the first recording, not after it
        for kind in PASSES:
            for run in targets:
                path = Recording.of(directory, run, kind).path
                if path.exists():
                    raise HuntError(
                        f"{path} exists (an earlier hunt?): pass --overwrite to replace it"
                    )
    directory.mkdir(parents=True, exist_ok=True)
    hunter = Hunter(directory, targets, python, overwrite, progress, tolerance, ray)
    if tolerance is not None and tolerance.noise is not None and not Path(tolerance.noise).is_dir():
        raise HuntError(f"--noise {tolerance.noise}: no such run directory")
    steps = [hunter.record(run, STEP_PASS, ["--steps-only"]) for run in targets]
    result = Hunt(directory, hunter.diff(*steps), steps, tolerance=tolerance)
    found = result.found
    if found is None:
        return result
    switches = window_switches(found.step)
    windows = [hunter.record(run, WINDOW_PASS, switches, found.step) for run in targets]
    result.recordings += windows
    result.op_level = hunter.diff(*windows)
    return result
