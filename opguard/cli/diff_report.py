"""The human report of ``opguard diff``: verdict, the divergent op in both runs with its
source line, what differs and how (values and raw bits), and the alignment summary."""

from __future__ import annotations

import os
import shlex
from typing import Any

from rich.markup import escape

from ..analysis import Divergence, RankDiff, RunDiff, TensorDiff
from ..analysis.align.steps import describe_runs
from ..analysis.divergence.causes import STREAM_RACE
from ..analysis.divergence.compilation import mode_note
from ..analysis.divergence.nonfinite import Nonfinite, nonfinite_tensors
from ..analysis.state_diff import ENTRIES_SHOWN, StepDivergence, window_command
from ..analysis.tolerant.envelope import envelope_text
from ..analysis.tolerant.judgement import Judgement, not_judged_text
from ..analysis.words.text import (
    KERNELS_REPORTED,
    ORIGINS_SHOWN,
    kernel_line,
    leading_bits,
    leading_values,
    sparkline,
    stats_text,
)
from ..store import CallSite, OpRecord, TensorRecord
from .render import console


def _tensor_line(label: str, t: TensorRecord | None) -> str:
    if t is None:
        return f"      {label}: (absent)"
    text = f"      {label}: {t.describe_shape()} fp {t.fingerprint_text()}"
    if t.head:
        values, bits = ", ".join(leading_values(t)), " ".join(leading_bits(t))
        text += f"\n         values [{values}]  bits [{bits}]"
    stats = stats_text(t)
    if stats is not None:
        text += f"\n         {stats}"
    return text


def _tensor_diffs(title: str, diffs: list[TensorDiff]) -> None:
    for d in diffs[:3]:
        console.print(f"    {title} [bold]{escape(d.slot)}[/] differs:")
        console.print(escape(_tensor_line("A", d.a)))
        console.print(escape(_tensor_line("B", d.b)))
    if len(diffs) > 3:
        console.print(f"    … and {len(diffs) - 3} more {title}s differ")


def _op_block(label: str, op: OpRecord | None) -> None:
    if op is None:
        console.print(f"  {label}: (no such op in this run)")
        return
    site = op.call_site
    console.print(
        f"  {label}: #{op.index} [bold]{escape(op.op)}[/] ({op.phase}, step {op.step}) "
        f"at {escape(site.file)}:{site.line} in {escape(site.function)}"
    )
    _source_line(site, "       ")
    for origin in op.origins[:ORIGINS_SHOWN]:  # a generated kernel: the lines it computes
        console.print(
            f"       from: {escape(origin.file)}:{origin.line} in {escape(origin.function)}"
        )
        _source_line(origin, "         ")
    if len(op.origins) > ORIGINS_SHOWN:
        console.print(f"       … and {len(op.origins) - ORIGINS_SHOWN} more source lines")


def _source_line(site: CallSite, indent: str) -> None:
    line = site.source_line()
    if line:
        console.print(f"{indent}{site.line} │ {escape(line)}")


def print_divergence(div: Divergence, known: str = "") -> None:
    console.print(
        f"\n[bold]First observed difference[/] — rank {div.rank}, step {div.step}, "
        f"kind: [bold]{div.kind}[/] ({div.cause})"
    )
    console.print(f"  {escape(div.summary)}")
    if known:
        console.print(f"  [bold]known difference:[/] {escape(known)}")
    if div.hint:
        console.print(f"  [bold]hint:[/] {escape(div.hint)}")
    _likely_causes(div)
    _op_block("A", div.a)
    _op_block("B", div.b)
    if (div.a, div.b) != (div.observed_a, div.observed_b):
        console.print("  first seen at:")
        _op_block("A", div.observed_a)
        _op_block("B", div.observed_b)
    for arg in div.arguments:
        a = repr(arg.a) if arg.a_passed else "default (not passed)"
        b = repr(arg.b) if arg.b_passed else "default (not passed)"
        console.print(
            f"    argument [bold]{escape(arg.name)}[/]: {escape(a)} (A) vs {escape(b)} (B)"
        )
    if div.rng_differs:
        console.print("    RNG state consumed by the op differs")
    _tensor_diffs("input", div.inputs)
    _tensor_diffs("output", div.outputs)
    if len(div.chain) > 1:
        hops = " ← ".join(f"#{link.a.index} {link.a.op}[{link.slot}]" for link in div.chain)
        console.print(f"    producer chain (A): {escape(hops)}")
    _kernels(div)
    if div.race and not any(c.kind == STREAM_RACE for c in div.likely_causes):
        console.print(f"    [bold]stream race[/]: {escape(div.race)}")


def _likely_causes(div: Divergence) -> None:
    """The ranked likely causes, each with its evidence."""
    if not div.likely_causes:
        return
    console.print("  [bold]likely causes[/] (most likely first):")
    for rank, cause in enumerate(div.likely_causes, 1):
        console.print(f"    {rank}. {escape(cause.cause)}")
        console.print(f"       [dim]evidence: {escape(cause.evidence)}[/]")


def print_diff(result: RunDiff) -> None:
    verdict = result.verdict
    colour = {"diverged": "red", "incomplete": "yellow"}.get(verdict, "green")
    console.print(
        f"[bold {colour}]{verdict.upper()}[/]  A: {escape(result.path_a)}  "
        f"B: {escape(result.path_b)}"
    )
    scope = result.scope()
    if scope:
        console.print(f"  [bold {colour}]{escape(scope)}[/]")
    note = mode_note(result.meta_a, result.meta_b)
    if note:
        console.print(f"  note: {escape(note)}")
    if result.tolerance is not None:
        _print_tolerance(result)
    if result.first is not None:
        print_divergence(result.first, result.known_difference)
        judged = result.first_judgement
        if judged is not None:
            _print_judgement(judged)
    elif result.diverged and result.state_first is not None:
        print_state_divergence(result.state_first, result)
    if len(result.ranks) > 1 and result.first is not None:
        _print_roles(result)
    _print_nonfinite_section(result.ranks)
    console.print("\n[bold]Alignment[/]")
    for r in result.ranks:
        if r.ops_compared:
            console.print(
                f"  rank {r.rank}: {r.aligned} aligned, {r.only_a} only in A, "
                f"{r.only_b} only in B, {r.differing} aligned ops differ; "
                f"{describe_runs(r.count_a, r.count_b)}"
            )
        else:
            console.print(
                f"  rank {r.rank}: step-level records; {describe_runs(r.count_a, r.count_b)}"
            )
        if r.layout is not None:
            console.print(f"    layouts: {escape(r.layout.text())}")
        if r.states is not None:
            console.print(f"    step-level records: {escape(r.states.describe())}")
        for note in r.notes:
            console.print(f"    note: {escape(note)}")
    for note in result.uncompared:
        console.print(f"  note: {escape(note)}")


def _print_tolerance(result: RunDiff) -> None:
    """How differences were judged, how many rounding explained, and the drift per step."""
    tolerance = result.tolerance
    assert tolerance is not None
    found = [r.tolerance for r in result.ranks if r.tolerance is not None]
    explained, flips = sum(t.explained for t in found), sum(t.flips for t in found)
    measured = sum(t.measured for t in found)
    flipped = f", {flips} of them integer/bool flips" if flips else ""
    floor = f", {measured} by the control run's measured floor" if tolerance.noise else ""
    if any(r.ops_compared for r in result.ranks):
        console.print(
            f"  tolerant ({tolerance.mode}: {escape(tolerance.text())}): {explained} differing "
            f"aligned op(s) explained by rounding{flipped}{floor}"
        )
    unjudged = not_judged_text(found)
    if unjudged:
        console.print(f"  not judged: {escape(unjudged)}")
    steps = [r.states.tolerance for r in result.ranks if not r.ops_compared and r.states]
    within = [t for t in steps if t is not None]
    if within:
        by_control = sum(t.by_control for t in within)
        control = f", {by_control} by the control run's" if tolerance.noise else ""
        console.print(
            f"  tolerant (step level: {escape(envelope_text(tolerance))}): "
            f"{sum(t.explained for t in within)} differing state entries within the "
            f"rounding envelope{control}"
        )
    layouts = [r.layout for r in result.ranks if r.layout is not None]
    if layouts:
        console.print(
            f"  parallel layouts of degree {layouts[0].degree}: {len(layouts)} rank pair(s) "
            f"compared by logical value; {sum(c.sharded for c in layouts)} shard(s) NOT "
            "compared by value (judged through the comparable tensors they feed)"
        )
    drift = result.drift()
    if not drift:
        return
    marked = result.first.step if result.first is not None else None
    known = [d for _, d in drift if d is not None]
    largest = f", max {max(known):.1e}" if known else ""
    unknown = ", ? unknown" if len(known) < len(drift) else ""
    where = "" if marked is None else f"; [ ] step {marked}, the first divergence"
    console.print(
        f"  drift, largest relative distance per step (log scale{where}{unknown}): "
        f"{escape(sparkline(drift, marked))}  steps {drift[0][0]}–{drift[-1][0]}{largest}"
    )


def _print_judgement(judged: Judgement) -> None:
    """The first divergence's distances (the summary said what rounding did not explain)."""
    output, tensor = judged.output, judged.tensor
    limit = "?" if judged.limit is None else f"{judged.limit:.1e}"
    unit = f" (u = {judged.unit:.1e})" if judged.unit else ""
    family = f" {judged.family}" if judged.family else ""
    limit += f" (the {judged.judged_by}{family} bound)"
    if output is not None:
        source = judged.input.text() if judged.input is not None else "unknown"
        norms = (
            ""
            if output.norm_a is None or output.norm_b is None
            else (f"; norms {output.norm_a:.4g} (A), {output.norm_b:.4g} (B)")
        )
        console.print(
            f"    distance: outputs {escape(output.text())}, inputs {escape(source)}; "
            f"amplification {escape(judged.amplification_text())}; rounding explains up to "
            f"{limit}{unit}{norms}"
        )
    elif tensor is not None:
        console.print(
            f"    distance: input {escape(judged.slot)} {escape(tensor.text())}; rounding "
            f"explains up to {limit}{unit}"
        )


def print_state_divergence(div: StepDivergence, result: RunDiff) -> None:
    """The first step whose state differs: the entry that differs first in the order the
    step computed them, both runs' values, what that means, the step's other differing
    entries, and how to see that step op by op."""
    title = "First step beyond the rounding envelope" if div.beyond else "First differing step"
    console.print(
        f"\n[bold]{title}[/] — rank {div.rank}, step {div.step}, "
        f"kind: [bold]{div.kind}[/] ({div.cause})"
    )
    console.print(f"  {escape(div.meaning)}")
    first = div.first
    console.print(f"  [bold]{escape(first.label)}[/] differs:")
    console.print(escape(_tensor_line("A", first.a.tensor)))
    console.print(escape(_tensor_line("B", first.b.tensor)))
    if div.judged is not None:
        console.print(f"    distance: {escape(div.judged.text())}")
        beyond = ", ".join(dict.fromkeys(j.label for j in div.beyond[1:ENTRIES_SHOWN]))
        more = len(div.beyond) - ENTRIES_SHOWN
        if beyond:
            tail = f" and {more} more" if more > 0 else ""
            console.print(f"  also beyond the rounding envelope: {escape(beyond)}{tail}")
    console.print(f"  differing in step {div.step}: {escape(div.comparison.kinds_text())}")
    for pair in div.comparison.differing[1:ENTRIES_SHOWN] if not div.beyond else ():
        a, b = _values(pair.a.tensor), _values(pair.b.tensor)
        console.print(f"    {escape(pair.label)}: {a} (A) vs {b} (B)")
    if div.comparison.only_a or div.comparison.only_b:
        console.print(
            f"  recorded in one run only (not compared): {escape(div.comparison.only_text())}"
        )
    console.print(f"\n  Next: see step {div.step} op by op, each run recorded again as it was:")
    outputs = [f"{path.rstrip('/')}-step{div.step}" for path in (result.path_a, result.path_b)]
    for path, meta, output in zip(
        (result.path_a, result.path_b), (result.meta_a, result.meta_b), outputs, strict=True
    ):
        record = f"{window_command(div.step)} -o {shlex.quote(output)} {_target(meta, path)}"
        console.print(f"    {escape(record)}")
    console.print(f"    opguard diff {escape(shlex.join([*outputs, *_tolerant_switches(result)]))}")
    hunt = _hunt_command(result)
    if hunt:
        console.print(
            "  or in one command, both runs recorded again (step level, then the first "
            f"differing step op by op):\n    {escape(hunt)}"
        )


def _values(t: TensorRecord) -> str:
    """The first values of a tensor, or its fingerprint when none were kept."""
    if not t.head:
        return f"fp {t.fingerprint_text()}"
    return "[" + ", ".join(leading_values(t)) + "]"


def _target(meta: dict[str, Any], path: str) -> str:
    """What ``opguard record`` ran for a run (``-- train.py ARGS``) to record it again in
    another window, or a placeholder for a run recorded from code."""
    from .commands.base import CommandError
    from .commands.capture import target_of

    try:
        return shlex.join(target_of(meta, path, new_window=True))
    except CommandError:
        return "-- SCRIPT ARGS"


def _hunt_command(result: RunDiff) -> str | None:
    """The ``opguard hunt`` that records both runs again as they were recorded, or None when a
    run was not recorded by ``opguard record`` or was recorded with switches the hunt does not
    take (``--eager``, ``--verify-inputs``, ``--first-step``)."""
    from .commands.base import CommandError
    from .commands.record import parse_recorded

    targets = []
    for meta in (result.meta_a, result.meta_b):
        command = [str(c) for c in meta.get("command", [])]
        if command[:2] != ["opguard", "record"]:
            return None
        try:
            options, target = parse_recorded(command)
        except CommandError:
            return None
        if options.eager or options.verify_inputs or options.first_step:
            return None
        targets.append(shlex.join(target[1:] if target[0] == "--" else target))
    directory = shlex.quote(os.path.join(os.path.dirname(result.path_a.rstrip("/")), "hunt"))
    tolerant = "".join(f" {shlex.quote(word)}" for word in _tolerant_switches(result))
    return (
        f"opguard hunt -o {directory} --a {shlex.quote(targets[0])} --b {shlex.quote(targets[1])}"
        f"{tolerant}"
    )


def _tolerant_switches(result: RunDiff) -> list[str]:
    """``--tolerant[=REL] [--noise CONTROL]`` as this diff was made (none: bit for bit)."""
    tolerance = result.tolerance
    if tolerance is None:
        return []
    noise = ["--noise", tolerance.noise] if tolerance.noise is not None else []
    value = tolerance.argument()
    return ["--tolerant" if value == "auto" else f"--tolerant={value}", *noise]


def _counts_text(tensors: list[tuple[str, int, int]]) -> str:
    return ", ".join(
        f"{slot}: "
        + " ".join(f"{count} {name}" for count, name in ((n, "NaN"), (i, "Inf")) if count)
        for slot, n, i in tensors
    )


def _nonfinite_op(title: str, op: OpRecord) -> None:
    console.print(
        f"    {title}: #{op.index} [bold]{escape(op.op)}[/] at {escape(op.call_site.short())}, "
        f"{op.phase}, step {op.step}: outputs {escape(_counts_text(nonfinite_tensors(op.outputs)))}"
    )


def _print_nonfinite_section(ranks: list[RankDiff]) -> None:
    """Where NaN/Inf values appeared, for the ranks whose runs differ in them; one line for
    the values both runs met alike (an attention mask's intended ``-inf``): not a difference."""
    met = [r for r in ranks if r.nonfinite_a is not None or r.nonfinite_b is not None]
    if not met:
        return
    if all(r.nonfinite_same for r in met):
        alike = "; ".join(_alike(r.rank, n) for r in met if (n := r.nonfinite_a) is not None)
        console.print(f"\n[bold]NaN / Inf[/]: the same in both runs ({escape(alike)})")
        return
    console.print("\n[bold]NaN / Inf[/]")
    for r in met:
        if r.nonfinite_same and r.nonfinite_a is not None:
            console.print(f"  the same in both runs ({escape(_alike(r.rank, r.nonfinite_a))})")
            continue
        for run, n in (("A", r.nonfinite_a), ("B", r.nonfinite_b)):
            if n is None:
                console.print(f"  run {run} rank {r.rank}: no NaN or Inf")
            else:
                print_nonfinite(f"run {run} rank {n.rank}", n)


def _alike(rank: int, n: Nonfinite) -> str:
    """NaN/Inf values that both runs of a rank met alike, as run A (``n``) met them."""
    op: OpRecord | None = n.origin
    how = "first made by"
    if op is None and n.first_seen is not None:
        op, how = n.first_seen, "first read by"
    elif op is None:
        op, how = n.first_intended, f"all intended ({INTENDED}), first made by"
    assert op is not None  # a rank without NaN or Inf has no Nonfinite
    return (
        f"rank {rank}: {n.ops} op(s) output NaN or Inf, {how} #{op.index} {op.op} at "
        f"{op.call_site.short()}"
    )


# Why NaN/Inf values are intended (analysis.divergence.nonfinite), as the reports say it.
INTENDED = "every op that read them made finite values"


def print_nonfinite(label: str, n: Nonfinite) -> None:
    """Where NaN/Inf first appeared in one rank of one run, and the intended ones."""
    all_intended = "" if n.found else ", all intended"
    console.print(f"  {escape(label)}: {n.ops} op(s) output NaN or Inf{all_intended}")
    if n.first_intended is not None:
        _nonfinite_op(f"intended ({INTENDED}): {n.intended} op(s), first", n.first_intended)
    if n.origin is not None:
        _nonfinite_op("first made (inputs finite)", n.origin)
    if n.nan_origin is not None and n.nan_origin != n.origin:
        _nonfinite_op("first NaN (inputs without NaN)", n.nan_origin)
    if n.from_outside and (op := n.first_seen) is not None:
        console.print(
            f"    already in the inputs of #{op.index} {escape(op.op)} at "
            f"{escape(op.call_site.short())}: "
            f"{escape(_counts_text(nonfinite_tensors(op.inputs)))} (data, parameters, or a "
            "write OpGuard did not record)"
        )


def _print_roles(result: RunDiff) -> None:
    """One line per rank: where its first divergence is, and whether it started there."""
    origins = ", ".join(str(k) for k in result.origin_ranks) or "none compared"
    console.print(f"\n[bold]Ranks[/] — origin: {origins}")
    for r in result.ranks:
        role, div = r.role, r.first
        if role is None or div is None:
            console.print(f"  rank {r.rank}: identical")
            continue
        op = div.a or div.observed_a
        where = f"{op.op} at {op.call_site.short()}, step {div.step}"
        if role.collective is not None:
            others = role.senders(r.rank)
            peers = f" from rank(s) {', '.join(map(str, others))}" if others else ""
            console.print(f"  rank {r.rank}: [bold]receiver[/] — {escape(where)}: received{peers}")
        else:
            console.print(f"  rank {r.rank}: [bold]origin[/] — {escape(div.summary)}")


def _kernels(div: Divergence) -> None:
    """The GPU work of the observed op in both runs, and whether the runs chose differently."""
    a, b = div.observed_a.kernels, div.observed_b.kernels
    if not a and not b:
        return
    verdict = "[bold]different kernels[/]" if div.kernels_differ else "same kernels"
    console.print(f"    GPU work of the op ({verdict}):")
    for label, kernels in (("A", a), ("B", b)):
        for kernel in kernels[:KERNELS_REPORTED]:
            console.print(f"      {label}: {escape(kernel_line(kernel))}")
        if len(kernels) > KERNELS_REPORTED:
            console.print(f"      {label}: … {len(kernels) - KERNELS_REPORTED} more")
