"""Comparing two runs rank by rank: stream both traces step by step, align each step, and
stop judging at the first aligned pair whose outputs differ (counting continues, so the
alignment summary and the per-step picture cover the whole run).

Memory holds one step of light ops per side (as columns, :class:`~opguard.store.light.OpColumns`), plus a
small cache of re-aligned steps for the producer chain; it does not grow with the length of the
trace. The walk compares runs of aligned ops as slices, so an op costs little more than reading
its record (see :mod:`opguard.store.light`).
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Iterator, Sequence
from concurrent.futures import ProcessPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from ..store import RankTrace, Run, TraceError
from ..store.light import LightReader, OpColumns
from .align.keys import KeyTable, OpKeys
from .align.layouts import LayoutKeys, layout_degree, rank_pairs
from .align.passes import align_step, pairs_of, records_of
from .align.step_pairs import StepAlignments, step_columns
from .align.steps import (
    add_to_ranges,
    compared_steps_note,
    count_steps,
    op_level_limits,
    ops_held,
    range_text,
)
from .divergence.explainer import Explainer
from .divergence.nonfinite import NonfiniteWatch, resolve, same_in_both
from .divergence.reach import ABSORBED_SHOWN, Absorbed, Reach
from .result import RankDiff, RunDiff, StepSummary
from .state_diff import StateComparison, compare_states, window_command
from .tolerant.envelope import EnteringState, StepEnvelope
from .tolerant.judge import Judge
from .tolerant.layout_judge import LayoutAlignment, LayoutCounts, LayoutJudge
from .tolerant.noise import NoiseFloor
from .tolerant.rule import Tolerance

UNALIGNED_EXAMPLES = 5


def diff_rank(
    trace_a: RankTrace,
    trace_b: RankTrace,
    *,
    step: int | None = None,
    tolerance: Tolerance | None = None,
    layout: tuple[int, int] | None = None,
    control: RankTrace | None = None,
    states: StateComparison | None = None,
) -> RankDiff:
    """One rank of both runs: op by op where both recorded ops, step by step where either run
    recorded step-level records only; the step-level records, where both runs hold them, are
    compared as well (the first differing step, and whether the state already differed when
    the op records began). ``tolerance``: differences rounding explains are not divergences
    (:mod:`.tolerant`: ops by their bounds, step-level records by the rounding envelope,
    :mod:`.tolerant.envelope`). ``layout`` (with a tolerance): (degree, rank reported) of two
    ranks of runs in parallel layouts that differ by that degree: ops align by call site and
    the rank of shapes, and tensors compare by logical value (:mod:`.tolerant.layout_judge`;
    their step-level records are compared bit for bit). ``control`` (with a tolerance): this
    rank of a control run of run A's script, whose distances from run A are the measured noise
    floor (:mod:`.tolerant.noise`) and the step-level envelope. ``states``: the step-level
    records' comparison bit for bit, already made by a first pass over every rank
    (:func:`states_first`; a comparison without a tolerance: under one the envelope judges
    the states as the ops are judged, in this one pass)."""
    envelope = None
    if tolerance is not None and layout is None:
        envelope = StepEnvelope(tolerance, control)
    if by_steps_only(trace_a, trace_b):
        result = _diff_steps_only(trace_a, trace_b, step, envelope, states)
        if tolerance is not None and envelope is None:
            result.notes.append(
                "--tolerant across parallel layouts judges op records: this rank holds "
                "step-level records only, compared bit for bit"
            )
        return result
    entering = None
    if trace_a.has_steps and trace_b.has_steps:
        if states is None:
            states = compare_states(trace_a, trace_b, step=step, envelope=envelope)
        entering = _entering(trace_a, trace_b, states) if envelope is not None else None
    result = _diff_ops(trace_a, trace_b, step, tolerance, layout, control, entering)
    if states is not None:
        result.states = states
        result.notes.extend(states.notes)
        _end_of_reading(result, trace_a, trace_b)  # a damaged step record as well
        if tolerance is None or envelope is not None:  # else bit for bit: rounding differs
            result.notes.extend(_before_the_ops(result))
    return result


def _entering(
    trace_a: RankTrace, trace_b: RankTrace, states: StateComparison
) -> EnteringState | None:
    """The state entering the first step both runs recorded op by op, where the step-level
    records found it within the rounding envelope (the op-level judge then takes it as
    explained where the ops read it); None where none was (the first step, or a state beyond
    the envelope before it: those leaves are judged op by op, and a note says where the state
    parted)."""
    firsts = [trace.first_op() for trace in (trace_a, trace_b)]
    if any(first is None for first in firsts):
        return None
    start = max(first[1] for first in firsts if first is not None)
    parted = states.first
    if start == 0 or (parted is not None and parted.step < start):
        return None
    return EnteringState.of(trace_a, trace_b, start)


def by_steps_only(trace_a: RankTrace, trace_b: RankTrace) -> bool:
    """Whether a rank is compared by its step-level records alone: a run recorded no ops
    (``--steps-only``) and step-level records exist."""
    with_ops = len(trace_a) > 0 and len(trace_b) > 0
    return not with_ops and (trace_a.has_steps or trace_b.has_steps)


def _diff_steps_only(
    trace_a: RankTrace,
    trace_b: RankTrace,
    step: int | None,
    envelope: StepEnvelope | None,
    states: StateComparison | None,
) -> RankDiff:
    """A rank where a run recorded no ops (``--steps-only``): its step-level records alone
    (under ``--tolerant``, by the rounding ``envelope``; ``states``: as :func:`diff_rank`'s)."""
    traces = (("A", trace_a), ("B", trace_b))
    for (name, trace), (other, _) in zip(traces, traces[::-1], strict=True):
        if not trace.has_steps:
            raise TraceError(
                f"rank {trace.rank}: run {name} holds no step-level records and run {other} no "
                "op records: nothing to compare (record both runs the same way)"
            )
    with_ops = [name for name, trace in traces if len(trace)]
    note = (
        [
            f"run {with_ops[0]} holds op records, the other run step-level records only: "
            "compared step by step"
        ]
        if with_ops
        else []
    )
    return _by_states(
        trace_a,
        trace_b,
        states
        if states is not None
        else compare_states(trace_a, trace_b, step=step, envelope=envelope),
        note,
    )


def _by_states(
    trace_a: RankTrace, trace_b: RankTrace, states: StateComparison, notes: list[str]
) -> RankDiff:
    """A rank's diff made of its step-level records' comparison alone, with ``notes``."""
    result = RankDiff(rank=trace_a.rank, ops_compared=False)
    result.count_a, result.count_b = count_steps(trace_a), count_steps(trace_b)
    result.states = states
    result.notes.extend([*states.notes, *notes])
    _end_of_reading(result, trace_a, trace_b)
    return result


def states_first(
    trace_a: RankTrace, trace_b: RankTrace, step: int | None
) -> StateComparison | None:
    """The first pass of a comparison in two passes, over a rank that both runs recorded op
    by op and at step level: its step-level records alone, compared bit for bit (None for any
    other rank, which :func:`diff_rank` compares whole in one pass, as it does every rank
    under a tolerance: the envelope judges the states with the ops). Where no rank's state
    differs the op records of every rank are compared after it; where some do, only theirs
    (the ranks the divergence reached: its origin and its receivers), and the others' diff is
    :func:`states_alone`."""
    if by_steps_only(trace_a, trace_b) or not (trace_a.has_steps and trace_b.has_steps):
        return None
    return compare_states(trace_a, trace_b, step=step)


def states_alone(trace_a: RankTrace, trace_b: RankTrace, states: StateComparison) -> RankDiff:
    """The diff of a rank whose op records were left uncompared after :func:`states_first`
    (its state never differed, so the divergence did not reach it): its step-level records'."""
    return _by_states(trace_a, trace_b, states, [])


def _before_the_ops(result: RankDiff) -> list[str]:
    """Says when the step-level records differ before the op-level records do: when the op
    records began (a window, the last steps of a flight recorder), or before the first
    op-level difference."""
    first = result.state_first
    if first is None:
        return []
    where = f"first at step {first.step} ({first.first.label})"
    beyond = " beyond the rounding envelope" if first.beyond else ""
    start = result.steps[0].step if result.steps else None
    if start is not None and first.step < start:
        return [
            f"the state already differed{beyond} when the op-level records began (step "
            f"{start}): {where}; record that step op by op: {window_command(first.step)}"
        ]
    if result.first is not None and first.step < result.first.step:
        return [
            f"the step-level records differ{beyond} before the first op-level difference (step "
            f"{result.first.step}): {where}"
        ]
    return []


def _diff_ops(
    trace_a: RankTrace,
    trace_b: RankTrace,
    step: int | None,
    tolerance: Tolerance | None,
    layout: tuple[int, int] | None,
    control: RankTrace | None,
    entering: EnteringState | None,
) -> RankDiff:
    table = KeyTable()
    # NaN/Inf origins come with the same scan; with --step the scan covers part of the runs.
    watches = (NonfiniteWatch(trace_a), NonfiniteWatch(trace_b)) if step is None else (None, None)
    layout = layout if tolerance is not None else None  # layouts are judged by --tolerant
    keys = OpKeys if layout is None else LayoutKeys
    reader_a = LightReader(trace_a, keys(trace_a, table), watches[0])
    reader_b = LightReader(trace_b, keys(trace_b, table), watches[1])
    result = RankDiff(rank=trace_a.rank)
    alignments = StepAlignments(reader_a, reader_b)
    traces = (trace_a, trace_b)
    judge: Judge | LayoutJudge | None = None
    explainer = Explainer(trace_a, trace_b, alignments, reorders=tolerance is None)
    noise = NoiseFloor(trace_a, control) if tolerance is not None and control is not None else None
    if tolerance is not None and layout is not None:
        result.rank = layout[1]
        result.layout = LayoutCounts(layout[0], trace_a.rank, trace_b.rank)
        by_layout = LayoutAlignment(alignments, traces, result.layout)
        explainer = Explainer(trace_a, trace_b, by_layout)
        judge = LayoutJudge(tolerance, traces, by_layout, noise)
    elif tolerance is not None:
        judge = Judge(tolerance, traces, alignments, noise, entering)
    result.count_a, result.count_b = count_steps(trace_a), count_steps(trace_b)
    steps_a, steps_b = step_columns(reader_a, step), step_columns(reader_b, step)
    next_a, next_b = next(steps_a, None), next(steps_b, None)
    # A run that kept ops of some steps only (--window, --keep-last) is compared on the steps
    # both runs hold ops for, and one note says which.
    limited = op_level_limits(trace_a.meta) or op_level_limits(trace_b.meta)
    compared = 0
    only: dict[str, list[list[int]]] = {"A": [], "B": []}  # steps with ops in one run only
    while next_a is not None and next_b is not None:
        (sa, ops_a), (sb, ops_b) = next_a, next_b
        if sa != sb:  # a step that has no ops on the other side
            if not limited:  # else one note below says which steps were compared
                add_to_ranges(only["A" if sa < sb else "B"], min(sa, sb))
            if sa < sb:
                next_a = next(steps_a, None)
            else:
                next_b = next(steps_b, None)
            continue
        compared += 1
        next_a, next_b = next(steps_a, None), next(steps_b, None)
        last_of_a, last_of_b = next_a is None, next_b is None
        _compare_step(
            result,
            sa,
            ops_a,
            ops_b,
            alignments,
            explainer,
            judge,
            cut_a=last_of_b and not trace_b.finished,
            cut_b=last_of_a and not trace_a.finished,
        )
    result.notes.extend(
        f"{range_text(first, last)} {'exists' if first == last else 'exist'} only in run {run}"
        for run, ranges in only.items()
        for first, last in ranges
    )
    counts = (("A", result.count_a, next_a, steps_a), ("B", result.count_b, next_b, steps_b))
    for (name, mine, rest, remaining), (other, theirs, _, _) in (counts, counts[::-1]):
        if rest is None:
            continue
        for _ in remaining:  # this run goes on: read it to its end, for the NaN/Inf scan
            pass
        if limited:
            continue  # said below
        if mine.steps > theirs.steps:
            result.notes.append(
                f"run {name} has {mine.steps - theirs.steps} more step(s) than run {other}; "
                f"compared the first {compared}"
            )
        else:  # as many steps, and ops after the last that the other run lacks
            result.notes.append(
                f"run {name} has {mine.ops_after} op(s) after its last step, run {other} none: "
                "not compared"
            )
    if limited:
        result.notes.append(compared_steps_note(result.steps, trace_a, trace_b))
    if watches[0] is not None and watches[1] is not None:
        result.nonfinite_a = resolve(trace_a, watches[0])
        result.nonfinite_b = resolve(trace_b, watches[1])
        result.nonfinite_scanned = True
        result.nonfinite_same = same_in_both(
            result.nonfinite_a, result.nonfinite_b, alignments.b_of
        )
    reordered = [pair for s in result.steps for pair in s.reordered_pairs]
    if reordered:
        result.notes.append(_reordered_note(trace_a, reordered))
    result.notes.extend(absorbed.text() for absorbed in result.absorbed)
    if result.absorbed_count > len(result.absorbed):
        more = result.absorbed_count - len(result.absorbed)
        result.notes.append(f"absorbed: {more} more difference(s) that no reader saw")
    _end_of_reading(result, trace_a, trace_b)
    if judge is not None:
        result.tolerance = judge.found
    if result.first is not None:
        result.first.rank = result.rank  # across layouts: not run A's rank
    return result


def _reordered_note(trace_a: RankTrace, pairs: list[tuple[int, int]]) -> str:
    """One sentence for the aligned pairs that were steps of a computation the runs take in
    another order, with the call sites they are at."""
    sites = dict.fromkeys(trace_a.op(a).call_site.short() for a, _ in pairs[:50])
    return (
        f"reordered: {len(pairs)} aligned op pair(s) at {', '.join(sites)} compute the same "
        "things in another order (their partial results differ; what they make is compared "
        "where it is read)"
    )


def _end_of_reading(result: RankDiff, trace_a: RankTrace, trace_b: RankTrace) -> None:
    """Notes how each run's recording ended and where reading it stopped, when that limits
    what was compared, and keeps what could not be read (the verdict is then incomplete).
    Said again once the step-level records are read (they may stop at a damaged one): each
    note once."""
    result.notes.extend(n for n in _trace_notes(trace_a, trace_b) if n not in result.notes)
    result.unread = _unread(trace_a, trace_b)
    result.unfinished = [
        name for name, trace in (("A", trace_a), ("B", trace_b)) if not trace.finished
    ]


def _unread(trace_a: RankTrace, trace_b: RankTrace) -> list[tuple[str, str]]:
    """What could not be read of each run, where reading stopped short (the verdict is then
    incomplete)."""
    return [
        (name, trace.damage) for name, trace in (("A", trace_a), ("B", trace_b)) if trace.damage
    ]


def _trace_notes(trace_a: RankTrace, trace_b: RankTrace) -> list[str]:
    """How each run's recording ended, and where reading it stopped."""
    notes = []
    for name, trace in (("A", trace_a), ("B", trace_b)):
        if not trace.finished:
            notes.append(
                f"run {name} did not finish (killed, crashed or still recording): "
                f"compared up to its last recorded "
                f"{'step' if not len(trace) and trace.has_steps else 'op'}"
            )
        if trace.failure:
            notes.append(
                f"run {name}: recording stopped at op {trace.failure['at_op']}: "
                f"{trace.failure['error']}"
            )
        if trace.damage:
            notes.append(f"run {name}: {trace.damage}")
        if trace.unreached_window:
            notes.append(f"run {name}: {trace.unreached_window}")
    return notes


def _compare_step(
    result: RankDiff,
    step: int,
    ops_a: OpColumns,
    ops_b: OpColumns,
    alignments: StepAlignments,
    explainer: Explainer,
    judge: Judge | LayoutJudge | None,
    *,
    cut_a: bool,
    cut_b: bool,
) -> None:
    """Aligns one step and counts it; ``cut_a``/``cut_b``: the other run ended inside this
    step, so this side's ops after the last aligned pair were never reached there.

    Ops are visited in execution order of both runs (as :func:`~.align.merge` interleaves
    them: the unaligned ops of A, then of B, before each aligned pair), a run of aligned pairs
    at a time: its outputs are compared as slices, and one by one only when they differ.
    With a ``judge`` (--tolerant), a differing pair is the divergence only when rounding does
    not explain it; pairs are judged until the drift series is complete."""
    runs = align_step(ops_a, ops_b, records_of(explainer.trace_a, explainer.trace_b))
    alignments.add(step, ops_a, ops_b, runs)
    n_a, n_b = len(ops_a), len(ops_b)
    # Unaligned ops are counted before these positions: past the last aligned pair when cut.
    last_i, last_j, last_n = runs[-1] if runs else (0, 0, 0)
    stop_a = last_i + last_n if cut_a else n_a
    stop_b = last_j + last_n if cut_b else n_b
    summary = StepSummary(step)
    out_a, out_b = ops_a.outputs, ops_b.outputs
    traces = (explainer.trace_a, explainer.trace_b)
    reach: Reach | None = None  # made when a difference is first judged in this step
    made: list[set[Any]] = []  # each run's outputs in this step, gathered when first asked

    def elsewhere(i: int, j: int) -> bool:
        """Whether each op's outputs are made, bit for bit, by an op of the other run's step
        (a call it makes elsewhere), read from the light columns already in memory."""
        if not made:
            made.extend((set(out_a), set(out_b)))
        return out_a[i] in made[1] and out_b[j] in made[0]

    prev_i = prev_j = 0
    for i, j, n in [*runs, (n_a, n_b, 0)]:
        if i > prev_i:
            summary.only_a += _unaligned(result.unaligned_a, ops_a.index, prev_i, min(i, stop_a))
        if j > prev_j:
            summary.only_b += _unaligned(result.unaligned_b, ops_b.index, prev_j, min(j, stop_b))
        if n:
            summary.aligned += n
            if out_a[i : i + n] != out_b[j : j + n]:
                for k in range(n):
                    if out_a[i + k] == out_b[j + k]:
                        continue
                    if result.first is None or (judge is not None and judge.measuring(step)):
                        op_a, op_b = (
                            t.op(o.index[p])
                            for t, o, p in zip(traces, (ops_a, ops_b), (i + k, j + k), strict=True)
                        )
                        judged = judge.judge(op_a, op_b) if judge is not None else None
                        if judge is None and explainer.reordered(
                            op_a, op_b, outputs_elsewhere=elsewhere(i + k, j + k)
                        ):
                            summary.reordered_pairs.append((op_a.index, op_b.index))
                            continue
                        # --tolerant: a tensor of unknown distance no measured output
                        # judged yet is judged by what it feeds, if its difference reaches
                        # anything
                        unjudged = judge is not None and judged is None and judge.left_open
                        if result.first is None and (
                            judge is None or judged is not None or unjudged
                        ):
                            if reach is None:
                                reach = Reach(traces, (ops_a, ops_b), dict(pairs_of(runs)))
                            absorbed = reach.absorbed(i + k, j + k, op_a, op_b)
                            if absorbed is not None:
                                if judge is not None and unjudged:
                                    judge.reached_nothing()
                                summary.absorbed_pairs.append((op_a.index, op_b.index))
                                _note_absorbed(result, explainer, absorbed)
                                continue
                            if judge is None:
                                result.first = explainer.explain(op_a, op_b)
                            elif judged is not None:
                                result.first = judge.divergence(explainer, op_a, op_b, judged)
                    summary.differing += 1
        prev_i, prev_j = i + n, j + n
    result.steps.append(summary)
    result.aligned += summary.aligned
    result.only_a += summary.only_a
    result.only_b += summary.only_b
    result.differing += summary.differing


def _note_absorbed(result: RankDiff, explainer: Explainer, absorbed: Absorbed) -> None:
    """Keeps an absorbed difference for the report, and tells the explainer, so that a later
    divergence is not traced back through it."""
    result.absorbed_count += 1
    if len(result.absorbed) < ABSORBED_SHOWN:
        result.absorbed.append(absorbed)
    explainer.absorb(absorbed)


def _unaligned(examples: list[int], index: list[int], lo: int, hi: int) -> int:
    """Counts unaligned ops ``[lo, hi)`` and keeps the first few as examples."""
    if hi <= lo:
        return 0
    room = UNALIGNED_EXAMPLES - len(examples)
    if room > 0:
        examples.extend(index[lo : min(hi, lo + room)])
    return hi - lo


def diff_runs(
    run_a: Run,
    run_b: Run,
    *,
    rank: int | None = None,
    step: int | None = None,
    tolerance: Tolerance | None = None,
) -> RunDiff:
    pairs = compared_ranks(run_a.ranks, run_b.ranks, rank, tolerance)
    if tolerance is not None and tolerance.noise is not None:
        with Run(tolerance.noise) as control:
            check_control(tolerance.noise, control.ranks, pairs)
    if len(pairs) == 1:
        with _control(tolerance) as control:
            outcomes = [compare_pair(run_a, run_b, pairs[0], step, tolerance, control)]
    else:
        outcomes = _diff_in_parallel(str(run_a.path), str(run_b.path), pairs, step, tolerance)
    return run_diff_of(
        (str(run_a.path), str(run_b.path)),
        (run_a.meta, run_b.meta),
        (run_a.ranks, run_b.ranks),
        pairs,
        outcomes,
        rank=rank,
        step=step,
        tolerance=tolerance,
    )


@dataclass
class RankOutcome:
    """One pair of ranks compared: its diff, and what the checks of the whole run need to
    know of its traces, read beside them (whoever gathers the outcomes reads no trace: a
    process pool's parent, or the driver of a comparison on a cluster's nodes)."""

    result: RankDiff
    # With --step, where this rank did not compare the step: whether each run holds it.
    held_step: tuple[bool, bool] | None = None
    # Where runs that kept ops of some steps only compared none here: the steps each holds.
    ops_held: str | None = None


def compare_pair(
    run_a: Run,
    run_b: Run,
    pair: RankPair,
    step: int | None,
    tolerance: Tolerance | None,
    control: Run | None,
    states: StateComparison | None = None,
) -> RankOutcome:
    """:func:`diff_rank` of one pair of ranks (``states``: as there), with the facts
    :func:`run_diff_of` needs of their traces."""
    trace_a, trace_b = run_a.rank(pair.rank_a), run_b.rank(pair.rank_b)
    result = diff_rank(
        trace_a,
        trace_b,
        step=step,
        tolerance=tolerance,
        layout=pair.layout,
        control=control.rank(pair.rank_a) if control is not None else None,
        states=states,
    )
    return outcome_of(result, trace_a, trace_b, step)


def outcome_of(
    result: RankDiff, trace_a: RankTrace, trace_b: RankTrace, step: int | None
) -> RankOutcome:
    """``result`` with the facts of its traces that :func:`run_diff_of` checks."""
    outcome = RankOutcome(result)
    if step is not None and not _compared(result, step):
        outcome.held_step = (_has_step(trace_a, step), _has_step(trace_b, step))
    limited = op_level_limits(trace_a.meta) or op_level_limits(trace_b.meta)
    if limited and not result.steps and not (trace_a.has_steps and trace_b.has_steps):
        outcome.ops_held = ops_held(trace_a, trace_b)
    return outcome


def run_diff_of(
    paths: tuple[str, str],
    metas: tuple[dict[str, Any], dict[str, Any]],
    ranks: tuple[Sequence[int], Sequence[int]],
    pairs: Sequence[RankPair],
    outcomes: Sequence[RankOutcome],
    *,
    rank: int | None,
    step: int | None,
    tolerance: Tolerance | None,
    not_compared: Sequence[tuple[int, str]] = (),
) -> RunDiff:
    """The comparison of two runs from its ranks' outcomes: refused where nothing was
    compared (a step no rank holds, no common step of runs that kept ops of some steps, no op
    in common); ``ranks``: the ranks each run recorded, ``pairs`` those compared
    (:func:`compared_ranks`), ``outcomes`` theirs; ``not_compared``: ranks whose traces
    could not be reached, and why (a comparison on a cluster: a node lost)."""
    results = [o.result for o in outcomes]
    if not results:
        raise TraceError(
            "no rank could be compared: "
            + "; ".join(f"rank {k}: {why}" for k, why in not_compared[:3])
            + (f" (and {len(not_compared) - 3} more)" if len(not_compared) > 3 else "")
        )
    if step is not None and not any(_compared(r, step) for r in results):
        # Nothing compared is not "identical": say which run lacks the step.
        has = [
            name
            for side, name in enumerate("AB")
            if any(o.held_step is not None and o.held_step[side] for o in outcomes)
        ]
        where = f"only in run {has[0]}" if len(has) == 1 else "in neither run"
        raise TraceError(f"step {step} was recorded {where}: nothing to compare")
    if (op_level_limits(metas[0]) or op_level_limits(metas[1])) and not any(
        r.steps for r in results
    ):
        held = outcomes[0].ops_held
        if held is not None:  # else their step-level records were compared
            raise TraceError(f"the runs hold ops of no common step ({held}): nothing to compare")
    for r in results:
        if r.aligned == 0 and r.only_a and r.only_b:
            # No first difference to name when nothing corresponds: not "identical" either.
            raise TraceError(
                f"rank {r.rank}: the runs have no op in common ({r.only_a} compared ops in A, "
                f"{r.only_b} in B): traces of two different programs?"
            )
    compared_all = rank is None and pairs[0].layout is None  # across layouts: every rank
    return RunDiff(
        paths[0],
        paths[1],
        metas[0],
        metas[1],
        results,
        only_in_a=sorted(set(ranks[0]) - set(ranks[1])) if compared_all else [],
        only_in_b=sorted(set(ranks[1]) - set(ranks[0])) if compared_all else [],
        tolerance=tolerance,
        not_compared=sorted(not_compared),
    )


@dataclass(frozen=True, slots=True)
class RankPair:
    """The rank of each run one comparison reads; across layouts, (degree, rank reported)."""

    rank_a: int
    rank_b: int
    layout: tuple[int, int] | None = None

    @property
    def ranks(self) -> tuple[int, int]:
        return self.rank_a, self.rank_b

    @property
    def reported(self) -> int:
        """The rank the comparison is reported as: across layouts the larger run's."""
        return self.layout[1] if self.layout is not None else self.rank_a


def compared_ranks(
    ranks_a: Sequence[int], ranks_b: Sequence[int], rank: int | None, tolerance: Tolerance | None
) -> list[RankPair]:
    """The ranks compared: rank by rank (``rank`` alone when given); with a tolerance, runs
    whose world sizes differ by a layout's degree (TP=N against TP=1) pair each rank of the
    larger run with the single rank of the other (``rank``: of the larger run)."""
    degree = layout_degree(ranks_a, ranks_b) if tolerance is not None else None
    paired = rank_pairs(ranks_a, ranks_b) if degree is not None and degree > 1 else None
    if degree is not None and paired is not None:
        wide = 0 if len(ranks_a) > len(ranks_b) else 1
        found = [
            RankPair(a, b, (degree, (a, b)[wide]))
            for a, b in paired
            if rank is None or (a, b)[wide] == rank
        ]
        if not found:
            ranks = (ranks_a, ranks_b)[wide]
            raise TraceError(f"rank {rank} is not in run {'AB'[wide]} (ranks {ranks})")
        return found
    if rank is not None:
        return [RankPair(rank, rank)]
    ranks = sorted(set(ranks_a) & set(ranks_b))
    if not ranks:
        raise TraceError(
            f"no rank recorded in both runs (A: {ranks_a or 'none'}, B: {ranks_b or 'none'})"
        )
    return [RankPair(k, k) for k in ranks]


def _diff_in_parallel(
    path_a: str,
    path_b: str,
    pairs: list[RankPair],
    step: int | None,
    tolerance: Tolerance | None,
) -> list[RankOutcome]:
    """One process per rank (as many at a time as there are cores): ranks are independent
    until their roles are compared, and a large job's traces take long to walk one by one.
    Spawned, not forked: a forked child would share the parent's LMDB handles and threads."""
    workers = min(len(pairs), os.cpu_count() or 1)
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(max_workers=workers, mp_context=context) as pool:
        futures = [pool.submit(_diff_rank_of, path_a, path_b, p, step, tolerance) for p in pairs]
        return [f.result() for f in futures]


def _diff_rank_of(
    path_a: str, path_b: str, pair: RankPair, step: int | None, tolerance: Tolerance | None
) -> RankOutcome:
    """:func:`compare_pair` in a worker process, which opens the traces itself."""
    with Run(path_a) as run_a, Run(path_b) as run_b, _control(tolerance) as control:
        return compare_pair(run_a, run_b, pair, step, tolerance, control)


@contextmanager
def _control(tolerance: Tolerance | None) -> Iterator[Run | None]:
    """The control run of ``--noise``, open while the ranks are compared; None without one."""
    if tolerance is None or tolerance.noise is None:
        yield None
        return
    with Run(tolerance.noise) as control:
        yield control


def check_control(path: str, ranks: Sequence[int], pairs: list[RankPair]) -> None:
    """Refuses a control run (at ``path``, holding ``ranks``) that lacks a rank of run A that
    is compared (one line)."""
    missing = sorted({p.rank_a for p in pairs} - set(ranks))
    if missing:
        raise TraceError(
            f"--noise {path}: the control run has no rank {missing[0]} (ranks "
            f"{list(ranks) or 'none'}): record it as run A was recorded"
        )


def _compared(result: RankDiff, step: int) -> bool:
    """Whether step ``step`` of the rank was compared, op by op or by its step-level records."""
    compared_states = result.states is not None and result.states.compared > 0
    return compared_states or any(summary.step == step for summary in result.steps)


def _has_step(trace: RankTrace, step: int) -> bool:
    if trace.step_state(step) is not None:
        return True
    for raw in trace.raw_ops():  # steps only grow along a trace
        if raw.get("s", 0) >= step:
            return bool(raw.get("s", 0) == step)
    return False
