"""The offline reading of a divergence: what a person would say on seeing the evidence, by rule.

This is the answer when no model is configured, and part of the prompt when one is (a model
reasons better from "argument `eps` differs: 1e-05 vs 1e-06" than from two records). Every
sentence is derived from recorded facts, never from file or script names.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from ..analysis import Divergence, TensorDiff
from ..analysis.divergence.causes import ENVIRONMENT, STREAM_RACE
from ..analysis.divergence.gpu_work import kernel_names
from ..analysis.divergence.summary import producer_text
from ..analysis.state_diff import StepDivergence
from ..analysis.tolerant.judgement import Judged, Judgement, Reason
from ..analysis.words.text import number, op_line, value_text
from ..analysis.words.verdict import WORDS, Cause
from ..store import OpRecord
from .metadata import MetaDiff

# Machine epsilon per floating dtype: differences within a few ulps are rounding, not a bug.
EPSILON = {"float64": 2.2e-16, "float32": 1.2e-7, "float16": 9.8e-4, "bfloat16": 7.8e-3}
ROUNDING_ULPS = 16


def read_divergence(div: Divergence | None, meta: list[MetaDiff]) -> list[str]:
    """Findings, most telling first."""
    if div is None:
        return [
            "identical: every aligned op produced bit-identical outputs; ops found in one run "
            "only (logging, refactoring) changed no result"
        ]
    findings = CAUSES.get(div.cause, _unexplained)(div)
    if div.hint:
        findings.append(f"hint: {div.hint}")
    findings += _magnitude(div.outputs)
    if not any(c.kind == ENVIRONMENT for c in div.likely_causes):
        lead = (
            "equal inputs yet different outputs, and the runs ran in different environments"
            if div.cause is Cause.ORIGIN
            else "the runs also ran in different environments"
        )
        findings += _environment(meta, lead)
    return findings


def read_tolerant(verdict: str, judged: Judgement | None, findings: list[str]) -> list[str]:
    """The findings of a --tolerant diff (``findings``: the bitwise reading of its divergence):
    that rounding explains every difference; or what rounding did not explain, then the
    findings about the cause, except for an op that amplified its inputs' difference, where
    those of an origin (equal inputs) do not hold."""
    if judged is None:
        if verdict != "within-rounding":
            return findings
        return [
            "within rounding: every aligned op's outputs differ by no more than what its op "
            "family allows from its inputs' difference and its own rounding (or a control run "
            "measured); nothing else changed"
        ]
    lead = f"not rounding: {judged.what}"
    if judged.reason is not Reason.AMPLIFIED:
        return [lead, *findings]
    return [
        lead,
        "the op itself made the difference larger than its inputs' and its own rounding "
        "explain: its implementation or a constant inside it changed (another algorithm, a "
        "bug), or it is ill-conditioned there (a division by a small number, cancellation)",
        *(
            []
            if judged.judged_by is not Judged.ANALYTIC
            else [
                "if the runs should differ by rounding alone, a control run measures what "
                "rounding does at this op in this model: record run A's script with opguard "
                "record --perturb-rounding 1 and diff again with --noise CONTROL"
            ]
        ),
    ]


def read_state_divergence(div: StepDivergence, meta: list[MetaDiff]) -> list[str]:
    """Findings about the first step whose state differs (step-level records: no op was
    recorded there), most telling first: which part of the step, what differs, what next."""
    grads = [pair for pair in div.pairs if pair.kind == "grad"]
    alike, beyond = div.alike, " beyond rounding" if div.beyond else ""
    findings = [div.meaning]
    if div.cause is Cause.LOSS:
        findings.append(
            f"{len(grads)} gradient(s) differ{beyond} as well, the first {grads[0].a.name}"
            if grads
            else f"every gradient is {alike}: the difference in the loss did not reach them"
        )
    elif div.cause is Cause.OPTIMIZER:
        same = "the same up to rounding" if div.beyond else "the same"
        findings.append(
            f"the loss and every gradient recorded in both runs are {alike}, so the forward "
            f"and backward computed {same}: the update differs (learning rate, its schedule, "
            "momentum, weight decay, or the optimizer's state)"
        )
    first = div.first
    findings += _magnitude([TensorDiff(first.label, first.a.tensor, first.b.tensor)], "state")
    if div.comparison.only_a or div.comparison.only_b:
        findings.append(f"recorded in one run only: {div.comparison.only_text()}")
    findings.append(f"next: {div.hint}")
    return findings + _environment(meta, "the runs also ran in different environments")


def _environment(meta: list[MetaDiff], lead: str) -> list[str]:
    environmental = [m for m in meta if m.environmental]
    return [f"{lead}: " + "; ".join(m.text() for m in environmental)] if environmental else []


def _arguments(div: Divergence) -> list[str]:
    found = []
    for d in div.arguments:
        text = WORDS[Cause.ARGUMENT].reading.format(
            name=d.name, a=_passed(d.a, d.a_passed), b=_passed(d.b, d.b_passed)
        )
        if not (d.a_passed and d.b_passed):
            text += (
                f" (run {'A' if not d.a_passed else 'B'} did not pass it: the op's default applied)"
            )
        found.append(text)
    op = div.a or div.observed_a
    if op.phase == "optimizer":
        found.append(
            "the op belongs to the optimizer step: an optimizer setting differs (learning rate, "
            "momentum, weight decay; SGD applies the learning rate as alpha=-lr)"
        )
    if div.rng_differs:
        found.append("the op's RNG state differs as well")
    return found


def _passed(value: object, passed: bool) -> str:
    return value_text(value) if passed else "default"


def _rng(div: Divergence) -> list[str]:
    op = div.a or div.observed_a
    return [WORDS[Cause.RNG].reading.format(op=op_line(op))]


def _origin(div: Divergence) -> list[str]:
    if div.likely_causes:  # their evidence is in the bundle's "likely causes"
        first, *rest = div.likely_causes
        return [
            f"equal inputs and arguments, different outputs; most likely {first.cause}",
            *(f"also possible: {c.cause}" for c in rest),
        ]
    names_a, names_b = kernel_names(div.observed_a), kernel_names(div.observed_b)
    if names_a and names_b and div.kernels_differ:
        return [
            f"equal inputs, different kernels chosen: run A ran {value_text(names_a)}, run B ran "
            f"{value_text(names_b)} (library heuristics, TF32 or precision settings, "
            "deterministic algorithms off)"
        ]
    kernels = "same kernels" if names_a else "no kernels recorded"
    return [WORDS[Cause.ORIGIN].reading.format(kernels=kernels)]


def _structure(div: Divergence) -> list[str]:
    seen = f"first seen at #{div.observed_a.index} {div.observed_a.op}"
    words = WORDS[div.cause].reading
    if div.cause is Cause.REPLACED and div.a is not None and div.b is not None:
        return [words.format(index=div.a.index, name=div.a.op, b=op_line(div.b), seen=seen)]
    if div.cause is Cause.REORDERED and div.chain:
        link = div.chain[-1]
        a, b = (producer_text(op, link.slot) for op in (link.a, link.b))
        return [words.format(op=op_line(link.a), source=_quoted(link.a), a=a, b=b, seen=seen)]
    op = div.b if div.cause is Cause.INSERTED else div.a
    assert op is not None
    return [words.format(op=op_line(op), source=_quoted(op), seen=seen)]


def _quoted(op: OpRecord) -> str:
    """`` `the source line` `` of an op's call site, or nothing where it cannot be read."""
    source = op.call_site.source_line()
    return f" `{source}`" if source else ""


def _last_slot(div: Divergence) -> str:
    link = div.chain[-1] if div.chain else None
    return f"input `{link.slot}` of {op_line(link.a)}" if link else "an input"


def _leaf(div: Divergence) -> list[str]:
    return [WORDS[Cause.LEAF].reading.format(input=_last_slot(div))]


def _unrecorded(div: Divergence) -> list[str]:
    races = [c for c in div.likely_causes if c.kind == STREAM_RACE]
    return [
        *(c.cause for c in races),
        WORDS[Cause.UNRECORDED_WRITE].reading.format(input=_last_slot(div)),
        *(w.text() for w in div.windows),
    ]


def _earlier(div: Divergence) -> list[str]:
    return [WORDS[Cause.EARLIER_STEP].reading.format(input=_last_slot(div), step=div.step)]


def _unexplained(div: Divergence) -> list[str]:
    return [f"outputs of {op_line(div.observed_a)} differ"]


# The reading of each op-level cause (the step-level ones: read_state_divergence).
CAUSES: dict[Cause, Callable[[Divergence], list[str]]] = {
    Cause.ARGUMENT: _arguments,
    Cause.RNG: _rng,
    Cause.ORIGIN: _origin,
    Cause.INSERTED: _structure,
    Cause.REMOVED: _structure,
    Cause.REPLACED: _structure,
    Cause.REORDERED: _structure,
    Cause.LEAF: _leaf,
    Cause.UNRECORDED_WRITE: _unrecorded,
    Cause.EARLIER_STEP: _earlier,
}


def _magnitude(outputs: list[TensorDiff], what: str = "output") -> list[str]:
    """How far apart the first differing output (or ``what``) is: rounding-level or real,
    NaN or Inf."""
    if not outputs or outputs[0].a is None or outputs[0].b is None:
        return []
    d = outputs[0]
    assert d.a is not None and d.b is not None
    found = []
    for name, column in (("NaN", 4), ("Inf", 5)):
        counts = [t.stats[column] if t.stats is not None else 0 for t in (d.a, d.b)]
        if bool(counts[0]) != bool(counts[1]):
            run = "A" if counts[0] else "B"
            found.append(
                f"{name} appears in run {run}'s {what} `{d.slot}` ({max(counts)} values), not in the other's"
            )
    eps = EPSILON.get(d.a.dtype)
    pairs = [
        (x, y)
        for x, y in zip(d.a.values(), d.b.values(), strict=False)
        if isinstance(x, float) and isinstance(y, float) and math.isfinite(x) and math.isfinite(y)
    ]
    if eps is None or not pairs or d.a.shape != d.b.shape:
        return found
    worst = max(abs(x - y) / max(abs(x), abs(y), 1e-30) for x, y in pairs)
    if worst == 0:
        found.append(
            f"{what} `{d.slot}`: the leading values are equal; the difference lies further in"
        )
    elif worst <= ROUNDING_ULPS * eps:
        found.append(
            f"{what} `{d.slot}` differs at rounding level (relative {number(worst)} in the leading "
            "values): a change in the order or precision of arithmetic, not in the math"
        )
    else:
        found.append(
            f"{what} `{d.slot}` differs by up to {number(worst)} (relative) in the leading values"
        )
    return found
