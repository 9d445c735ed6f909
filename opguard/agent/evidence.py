"""The evidence bundle: what a model (or a person) needs to explain the first divergence, and
nothing else.

Built from the :class:`~opguard.analysis.RunDiff` and the two traces, deterministically (same
runs, same bytes), as compact text for a prompt and as JSON for scripts. It holds the verdict,
the op named in both runs with its call site and source, what differs going in and coming out
(leading values, raw bits, stats), the producer chain back to the cause, ops of that step found
in one run only, kernels when recorded, the run metadata that differ, and the rule-based
reading. Logs and full op dumps stay out: they cost tens of thousands of tokens and say less.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..analysis import Divergence, Link, RankDiff, RunDiff, TensorDiff
from ..analysis.align.steps import describe_runs
from ..analysis.contract import divergence_json, op_ref, rank_json, state_divergence_json
from ..analysis.state_diff import StepDivergence
from ..analysis.tolerant.envelope import envelope_text
from ..analysis.tolerant.judgement import Judgement, not_judged_text
from ..analysis.words.text import op_label, op_line, value_text
from ..store import OpRecord, RankTrace, Run
from .describe import (
    SOURCE_CONTEXT,
    kernel_lines,
    origin_lines,
    source_lines,
    source_rows,
    tensor_text,
)
from .llm import count_tokens
from .metadata import differing_metadata
from .reading import read_divergence, read_state_divergence, read_tolerant
from .tokens import estimate_tokens

SCHEMA = "opguard.evidence/1"
COUNT_MODEL = "groq/openai/gpt-oss-20b"  # the estimate approximates LiteLLM's count for it
TENSORS_SHOWN = 3
CHAIN_ENDS = 3  # a longer chain shows its first and last hops
UNALIGNED_SHOWN = 5
NOTES_SHOWN = 3
RANKS_SHOWN = 4


@dataclass(frozen=True)
class Evidence:
    """The bundle as prompt text and as JSON (``opguard.evidence/1``), with its size in tokens
    for ``token_model``: counted by LiteLLM, or ``estimated`` without it."""

    verdict: str
    text: str
    data: dict[str, Any]
    tokens: int
    token_model: str
    estimated: bool

    def to_json(self) -> dict[str, Any]:
        tokens = {"count": self.tokens, "model": self.token_model, "estimated": self.estimated}
        return {**self.data, "tokens": tokens}

    def size(self) -> str:
        """``866 tokens (counted for M)``, or ``about 866 tokens (estimated)``."""
        if self.estimated:
            return f"about {self.tokens:,} tokens (estimated)"
        return f"{self.tokens:,} tokens (counted for {self.token_model})"


def build_evidence(
    result: RunDiff, run_a: Run, run_b: Run, *, model: str | None = None
) -> Evidence:
    """The bundle of ``result``; its tokens are counted for ``model`` by LiteLLM, or without a
    model estimated (as LiteLLM would count them for COUNT_MODEL) and LiteLLM left unimported."""
    div = result.first
    # no op-level divergence to show (with --tolerant, states differing by rounding are not one)
    state = result.state_first if div is None and result.diverged else None
    meta = differing_metadata(result.meta_a, result.meta_b)
    reading = (
        read_state_divergence(state, meta) if state is not None else read_divergence(div, meta)
    )
    lines = [
        f"OpGuard evidence; run A: {Path(result.path_a).name}, run B: {Path(result.path_b).name}"
    ]
    unaligned: tuple[list[OpRecord], list[OpRecord]] = ([], [])
    if state is not None:
        lines += _state_lines(state)
    elif div is None:
        lines.append(f"verdict: {result.verdict} ({len(result.ranks)} rank(s) compared)")
    else:
        rank = next(r for r in result.ranks if r.rank == div.rank)
        traces = (run_a.rank(rank.trace_ranks[0]), run_b.rank(rank.trace_ranks[1]))
        unaligned = _unaligned_near(div, rank, traces)
        lines += _divergence_lines(div, traces, unaligned)
    judged = result.first_judgement
    if result.tolerance is not None:
        lines[2:2] = _tolerance_lines(result, judged)
        reading = read_tolerant(result.verdict, judged, reading)
    lines += _section("run metadata that differ", [m.text() for m in meta])
    lines += _section("alignment", list(_alignment_lines(result.ranks, div)))
    lines += _section("reading (rules)", [f"- {r}" for r in reading])
    text = "\n".join(lines) + "\n"
    data = {
        "schema": SCHEMA,
        "verdict": result.verdict,
        "runs": {"a": result.path_a, "b": result.path_b},
        "first_divergence": divergence_json(div)
        if div
        else state_divergence_json(state)
        if state
        else None,
        "kernels": _kernels_json(div) if div else {},
        "unaligned_near": {
            "a": [op_ref(op) for op in unaligned[0]],
            "b": [op_ref(op) for op in unaligned[1]],
        },
        "metadata_differs": [m.to_json() for m in meta],
        "alignment": [_rank_json(r) for r in result.ranks],
        "reading": reading,
    }
    if result.tolerance is not None:  # --tolerant: how differences were judged, and the distances
        data["tolerance"] = result.tolerance.to_json()
        data["distance"] = judged.to_json() if judged is not None else None
    if model is None:
        return Evidence(result.verdict, text, data, estimate_tokens(text), COUNT_MODEL, True)
    return Evidence(result.verdict, text, data, count_tokens(model, text=text), model, False)


def _tolerance_lines(result: RunDiff, judged: Judgement | None) -> list[str]:
    """--tolerant: the rule, and what rounding did not explain (distances, amplification)."""
    tolerance = result.tolerance
    assert tolerance is not None
    lines = [f"tolerant ({tolerance.mode}): differences within {tolerance.text()} are rounding"]
    unjudged = not_judged_text([r.tolerance for r in result.ranks if r.tolerance is not None])
    if unjudged:
        lines.append(f"not judged: {unjudged}")
    if any(not r.ops_compared for r in result.ranks):
        lines.append(f"step-level records: {envelope_text(tolerance)}")
    if judged is not None:
        measured = [
            f"{name} {distance.text()}"
            for name, distance in (
                ("output distance", judged.output),
                ("input distance", judged.input),
                (f"input '{judged.slot}' distance", judged.tensor),
            )
            if distance is not None
        ]
        family = f" {judged.family}" if judged.family else ""
        budget = (
            []
            if judged.limit is None
            else [f"rounding explains up to {judged.limit:.2g} ({judged.judged_by}{family} bound)"]
        )
        amplification = [f"amplification {judged.amplification_text()}"] if judged.output else []
        lines.append(
            f"not rounding ({judged.reason}): " + "; ".join(measured + amplification + budget)
        )
    return lines


def _section(title: str, body: list[str]) -> list[str]:
    return [f"## {title}", *body] if body else []


def _divergence_lines(
    div: Divergence,
    traces: tuple[RankTrace, RankTrace],
    unaligned: tuple[list[OpRecord], list[OpRecord]],
) -> list[str]:
    lines = [
        f"verdict: diverged at rank {div.rank}, step {div.step}; kind {div.kind}, cause {div.cause}",
        f"summary: {div.summary}",
    ]
    if div.hint:
        lines.append(f"hint: {div.hint}")
    lines += _section(
        "likely causes (most likely first)",
        [f"{n}. {c.cause}; evidence: {c.evidence}" for n, c in enumerate(div.likely_causes, 1)],
    )
    lines += _pair("op named (the cause)", (div.a, div.b), traces, SOURCE_CONTEXT)
    if (div.a, div.b) != (div.observed_a, div.observed_b):
        title = "first seen at (first aligned pair whose outputs differ)"
        lines += _pair(title, (div.observed_a, div.observed_b), traces, 0)
    lines += _section("what differs", _differences(div))
    lines += _section("producer chain in run A (first seen -> cause)", _chain(div.chain))
    lines += _section(
        f"ops in one run only, step {div.step} (first few)", _unaligned_lines(unaligned)
    )
    return lines


def _state_lines(div: StepDivergence) -> list[str]:
    """The first step whose state differs: the verdict, the entries that differ first with
    both runs' values, how many of each kind, and those recorded in one run only."""
    compared = div.comparison
    lines = [
        f"verdict: diverged at rank {div.rank}, step {div.step}; kind {div.kind}, cause "
        f"{div.cause} (from the step-level records: no op of that step was compared)",
        f"summary: {div.summary}",
        f"hint: {div.hint}",
    ]
    shown = []
    for pair in div.pairs[:TENSORS_SHOWN]:
        shown += [
            f"{pair.label}:",
            f"  A {tensor_text(pair.a.tensor)}",
            f"  B {tensor_text(pair.b.tensor)}",
        ]
    shown.append(f"differing entries of the step: {compared.kinds_text()}")
    if div.beyond:
        shown.append(f"beyond the rounding envelope: {len(div.beyond)}, the rest within it")
    beyond = " beyond rounding" if div.beyond else ""
    lines += _section(
        f"what differs{beyond} at the end of step {div.step} (in the order the step computed it)",
        shown,
    )
    if compared.only_a or compared.only_b:
        lines += _section(f"recorded in one run only, step {div.step}", [compared.only_text()])
    return lines


def _pair(
    title: str,
    ops: tuple[OpRecord | None, OpRecord | None],
    traces: tuple[RankTrace, RankTrace],
    context: int,
) -> list[str]:
    """Both runs' op with ``context`` source lines around the call (B's only when its text
    differs from A's), the script line it was reached from, the lines a kernel Inductor
    generated computes, and its kernels."""
    lines = [f"## {title}"]
    a = ops[0]
    for run, op, trace in zip("AB", ops, traces, strict=True):
        if op is None:
            lines.append(f"{run}: none (the op exists in run {'B' if run == 'A' else 'A'} only)")
            continue
        lines.append(f"{run}: {op_line(op)}")
        rows = source_rows(op.call_site, context, context)
        if (
            run == "B"
            and a is not None
            and _texts(rows) == _texts(source_rows(a.call_site, context, context))
        ):
            lines.append("  (same source as A)")
        else:
            lines += source_lines(rows, op.call_site.line)
            lines += _reached_from(op, trace) if context else []
        lines += origin_lines(op)
        lines += [f"  {line}" for line in kernel_lines(op, trace)]
    return lines


def _reached_from(op: OpRecord, trace: RankTrace) -> list[str]:
    """For a call site inside a library: the line of the user's script that led there (the
    innermost frame in the file of the outermost one)."""
    stack = trace.stack(op.stack_id)
    if not stack or stack[0].file == op.call_site.file:
        return []
    script = [site for site in stack if site.file == stack[0].file][-1]
    return [f"  reached from {script.short()}: {script.source_line() or ''}".rstrip()]


def _texts(rows: list[tuple[int, str]]) -> list[str]:
    return [text.strip() for _, text in rows]


def _differences(div: Divergence) -> list[str]:
    """Arguments and RNG state of the op named (marked with its index when it is not the first
    pair seen to differ), then the differing inputs and outputs of that first pair."""
    named = div.a or div.b
    of = f" of #{named.index}" if named is not None and named.index != div.observed_a.index else ""
    lines = []
    for d in div.arguments:
        a = value_text(d.a) if d.a_passed else "default (not passed)"
        b = value_text(d.b) if d.b_passed else "default (not passed)"
        lines.append(f"argument {d.name}{of}: {a} (A) vs {b} (B)")
    if div.rng_differs:
        lines.append(f"RNG state consumed{of}: differs")
    lines += _tensors("input", div.observed_a.index, div.inputs)
    lines += _tensors("output", div.observed_a.index, div.outputs)
    return lines


def _tensors(kind: str, index: int, diffs: list[TensorDiff]) -> Iterator[str]:
    for d in diffs[:TENSORS_SHOWN]:
        yield f"{kind} {d.slot} of #{index}:"
        yield f"  A {tensor_text(d.a)}"
        yield f"  B {tensor_text(d.b)}"
    if len(diffs) > TENSORS_SHOWN:
        yield f"… {len(diffs) - TENSORS_SHOWN} more {kind}s differ"


def _unaligned_lines(unaligned: tuple[list[OpRecord], list[OpRecord]]) -> list[str]:
    """One line per run and kind of op: ``A: #106, #108 aten::detach.default [...] site``."""
    lines = []
    for run, ops in zip("AB", unaligned, strict=True):
        groups: dict[str, list[int]] = {}
        for op in ops:
            groups.setdefault(op_label(op), []).append(op.index)
        lines += [
            f"{run}: {', '.join(f'#{i}' for i in found)} {label}" for label, found in groups.items()
        ]
    return lines


def _chain(chain: list[Link]) -> list[str]:
    if len(chain) < 2:
        return []
    hops = [f"{op_line(link.a)}" + (f" input `{link.slot}`" if link.slot else "") for link in chain]
    if len(hops) > 2 * CHAIN_ENDS:
        hops = [
            *hops[:CHAIN_ENDS],
            f"… {len(hops) - 2 * CHAIN_ENDS} more hops",
            *hops[-CHAIN_ENDS:],
        ]
    return [hops[0], *(f"<- {hop}" for hop in hops[1:])]


def _unaligned_near(
    div: Divergence, rank: RankDiff, traces: tuple[RankTrace, RankTrace]
) -> tuple[list[OpRecord], list[OpRecord]]:
    """The first ops of the divergent step found in one run only (the op named excepted: it
    is shown already)."""
    named = {("A", div.a.index) if div.a else None, ("B", div.b.index) if div.b else None}
    found: tuple[list[OpRecord], list[OpRecord]] = ([], [])
    for run, indices, trace, out in (
        ("A", rank.unaligned_a, traces[0], found[0]),
        ("B", rank.unaligned_b, traces[1], found[1]),
    ):
        for index in indices:
            op = trace.op(index)
            if op.step == div.step and (run, index) not in named and len(out) < UNALIGNED_SHOWN:
                out.append(op)
    return found


def _kernels_json(div: Divergence) -> dict[str, Any]:
    ops = {"named": (div.a, div.b), "observed": (div.observed_a, div.observed_b)}
    return {
        role: {
            run: [k.to_json() for k in op.kernels]
            for run, op in zip("ab", pair, strict=True)
            if op is not None and op.kernels
        }
        for role, pair in ops.items()
        if any(op is not None and op.kernels for op in pair)
    }


def _alignment_lines(ranks: list[RankDiff], first: Divergence | None) -> Iterator[str]:
    """Per-rank counts and notes; many ranks are summarised after the first few (the
    divergent rank leads), so a large job does not grow the bundle."""
    ordered = sorted(ranks, key=lambda r: (first is None or r.rank != first.rank, r.rank))
    for r in ordered[:RANKS_SHOWN]:
        counts = describe_runs(r.count_a, r.count_b)
        if r.ops_compared:
            yield (
                f"rank {r.rank}: {r.aligned} aligned, {r.only_a} only in A, {r.only_b} only in "
                f"B, {r.differing} aligned pairs differ; {counts}"
            )
        else:
            yield f"rank {r.rank}: compared by step-level records only; {counts}"
        if r.states is not None:
            yield f"rank {r.rank} step-level records: {r.states.describe()}"
        yield from (f"note: {n}" for n in r.notes[:NOTES_SHOWN])
    rest = ordered[RANKS_SHOWN:]
    if rest:
        differing = sum(1 for r in rest if r.differing)
        yield f"… {len(rest)} more ranks, {differing} of them with differing aligned pairs"


# The alignment summary of each rank, without the per-step table (the bundle stays small).
_RANK_KEYS = ("rank", "aligned", "unaligned_a", "unaligned_b", "differing", "notes")


def _rank_json(r: RankDiff) -> dict[str, Any]:
    summary = rank_json(r)
    return {key: summary[key] for key in _RANK_KEYS}
