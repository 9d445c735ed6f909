"""Right and wrong answers of the mutation fuzzer: what a right answer says (:class:`Expected`,
made by the catalogue in ``fuzz_mutations.py``) and the scoring of one ``opguard.diff/1`` object
against it (:func:`score`), with the reason when it is wrong.

Only the JSON contract (docs/json-contract.md) is read: ``verdict``, and of
``first_divergence`` its ``step``, ``cause``, ``hint`` and the ops ``a`` and ``b`` (``op``,
``index``, ``call_site``). Which of several ops of one name, line and step was named is told by
its occurrence, counted over the trace by the caller (``occurrence``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

IDENTICAL = frozenset({"identical"})
ROUNDING = frozenset({"identical", "within-rounding"})  # exit 0 under --tolerant
DIVERGED = frozenset({"diverged"})
SIDES = ("a", "b")


@dataclass(frozen=True)
class Expected:
    """A right answer. Where it is a divergence: its step, the op (``op`` and ``occurrence``
    where the truth knows the very op; else any op on the lines), the lines the op named in
    each run may be on (empty: not checked on that side), the sides that must name an op, and
    the causes accepted (``cause`` of the JSON; empty: any). An ``origin`` is accepted for an
    unrecorded write only with ``origin_hint`` in its hint (how a plain recording says it)."""

    verdicts: frozenset[str]
    text: str  # the right answer in words, for reports
    step: int | None = None
    op: str | None = None
    occurrence: int | None = None
    lines_a: frozenset[int] = frozenset()
    lines_b: frozenset[int] = frozenset()
    named: frozenset[str] = frozenset()
    causes: frozenset[str] = frozenset()
    origin_hint: str | None = None

    def lines(self, side: str) -> frozenset[int]:
        return self.lines_a if side == "a" else self.lines_b


@dataclass(frozen=True)
class Score:
    right: bool
    answer: str  # what OpGuard said, in one line
    reason: str = ""  # why it is wrong


def said(result: dict[str, Any]) -> str:
    """An answer in one line: verdict, cause, step and the ops named with their lines."""
    first = result.get("first_divergence")
    if first is None:
        return result["verdict"]
    ops = ", ".join(
        f"{side.upper()}: {ref['op']} #{ref['index']} at line {ref['call_site']['line']}"
        for side in SIDES
        if (ref := first.get(side)) is not None
    )
    return f"{result['verdict']} {first['kind']}/{first['cause']} step {first['step']}: {ops}"


Occurrence = Callable[[str, int], int]  # (side, op index) -> occurrence of that op


def score(
    expected: Expected, result: dict[str, Any], scripts: dict[str, Path], occurrence: Occurrence
) -> Score:
    """Whether ``result`` (an ``opguard.diff/1`` object) is the right answer."""
    answer = said(result)
    reason = _wrong(expected, result, scripts, occurrence)
    return Score(reason is None, answer, reason or "")


def _wrong(
    expected: Expected, result: dict[str, Any], scripts: dict[str, Path], occurrence: Occurrence
) -> str | None:
    if result["verdict"] not in expected.verdicts:
        return f"verdict {result['verdict']}; right: {expected.text}"
    first = result.get("first_divergence")
    if result["verdict"] != "diverged" or first is None:
        return None
    if expected.step is not None and first["step"] != expected.step:
        return f"step {first['step']}; right: {expected.text}"
    cause = first["cause"]
    if expected.causes and cause not in expected.causes:
        return f"cause {cause}; right: {expected.text}"
    if (
        cause == "origin"
        and expected.origin_hint
        and expected.origin_hint not in (first["hint"] or "")
    ):
        return f"an origin without the hint {expected.origin_hint!r}; right: {expected.text}"
    named = [side for side in SIDES if first.get(side) is not None]
    if not named:
        return f"no op named; right: {expected.text}"
    missing = sorted(expected.named - set(named))
    if missing:
        return f"no op named in run {missing[0].upper()}; right: {expected.text}"
    for side in named:
        wrong = _wrong_op(expected, side, first[side], scripts[side], occurrence)
        if wrong is not None:
            return f"run {side.upper()}'s op {wrong}; right: {expected.text}"
    return None


def _wrong_op(
    expected: Expected, side: str, ref: dict[str, Any], script: Path, occurrence: Occurrence
) -> str | None:
    site = ref["call_site"]
    if Path(site["file"]).name != script.name:
        return f"is in {site['file']}"
    lines = expected.lines(side)
    if lines and site["line"] not in lines:
        return f"is at line {site['line']}"
    if expected.op is not None and ref["op"] != expected.op:
        return f"is {ref['op']}"
    if expected.occurrence is not None:
        seen = occurrence(side, ref["index"])
        if seen != expected.occurrence:
            return f"is occurrence #{seen} of {ref['op']} on its line and step"
    return None
