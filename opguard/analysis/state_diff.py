"""Comparing two runs' step-level records (:mod:`opguard.store.states`): the first step whose
training state differs, and what differs first in it.

A step's record holds the state at its end in the order the step computed it: the loss, each
parameter's gradient, the parameters and optimizer states after the update, the buffers, the
RNG states. The first kind that differs in the first differing step says which part of that
step to look at: the loss (its forward), a gradient (its forward or backward), a parameter or
optimizer state while the gradients are equal (the optimizer), a buffer, an RNG state. Entries
are matched by (kind, name, slot); one recorded in one run only is said, never a crash.

Speed: a 10,000-step GPT-2 run holds over seven million entries per side. Two runs of one
program intern their state names alike, so equal records are equal bytes: the walk compares
each step's stored bytes. Where they differ, the records are unpacked and compared without
their stats and with names mapped (stats computed on another device, names interned in another
order; natively, ``opguard._C.step_contents``); only a step that still differs is decoded in
full and compared entry by entry. The walk stops at the first step whose content differs.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any

from ..store import RankTrace, TraceError
from ..store.states import KIND_ORDER, StateEntry, StepState, comparable_entries, expand_step
from .align.steps import add_to_ranges, range_text
from .divergence.model import content_of
from .tolerant.envelope import EntryJudgement, StepEnvelope, StepTolerance
from .words.text import leading_values
from .words.verdict import WORDS, Cause, Kind

# What a differing entry of each kind points at (the divergence's ``cause``).
CAUSE_OF_KIND = {
    "loss": Cause.LOSS,
    "grad": Cause.GRADIENT,
    "param": Cause.OPTIMIZER,
    "state": Cause.OPTIMIZER,
    "buffer": Cause.BUFFER,
    "rng": Cause.RNG,
}
ENTRIES_SHOWN = 5  # differing entries and entries in one run only listed by name


def window_switches(step: int) -> list[str]:
    """The ``opguard record`` switches that record step ``step`` op by op and stop after it."""
    return ["--window", f"{step}:{step + 1}", "--steps", str(step + 1)]


def window_command(step: int) -> str:
    """The recording that shows step ``step`` op by op and stops after it."""
    return " ".join(["opguard", "record", *window_switches(step)])


@dataclass(frozen=True, slots=True)
class StatePair:
    """One state entry as each run recorded it (same kind, name and slot)."""

    a: StateEntry
    b: StateEntry

    @property
    def kind(self) -> str:
        return self.a.kind

    @property
    def label(self) -> str:
        return self.a.label

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.a.kind,
            "name": self.a.name,
            "slot": self.a.slot,
            "a": self.a.tensor.to_json(),
            "b": self.b.tensor.to_json(),
        }


@dataclass(frozen=True, slots=True)
class StepComparison:
    """One step's records compared: the entries whose content differs (in the order the step
    computed them), and those recorded in one run only."""

    step: int
    differing: tuple[StatePair, ...]
    only_a: tuple[StateEntry, ...]
    only_b: tuple[StateEntry, ...]

    @property
    def equal(self) -> bool:
        return not self.differing

    def by_kind(self) -> dict[str, list[StatePair]]:
        """The differing entries of each kind, kinds in the order the step computed them."""
        kinds: dict[str, list[StatePair]] = {}
        for pair in self.differing:
            kinds.setdefault(pair.kind, []).append(pair)
        return kinds

    def kinds_text(self) -> str:
        """``5 grad (first fc1.weight), 10 state (first fc1.weight exp_avg)``: how many
        entries of each kind differ, and the first of each."""
        parts = []
        for kind, pairs in self.by_kind().items():
            which = pairs[0].label.removeprefix(kind).strip()  # "" for the loss
            parts.append(f"{len(pairs)} {kind}" + (f" (first {which})" if which else ""))
        return ", ".join(parts)

    def only_text(self) -> str:
        """``grad fc.bias (A), buffer bn.running_mean (B)``: the first few entries in one run
        only, with how many more there are."""
        named = [(e, "A") for e in self.only_a] + [(e, "B") for e in self.only_b]
        text = ", ".join(f"{e.label} ({run})" for e, run in named[:ENTRIES_SHOWN])
        more = len(named) - ENTRIES_SHOWN
        return text + (f" and {more} more" if more > 0 else "")


def compare_step(a: StepState, b: StepState) -> StepComparison:
    """Both runs' records of one step, entry by entry; run A's order within a kind."""
    by_key = b.by_key()
    differing, only_a = [], []
    for entry in a.entries:
        other = by_key.get(entry.key)
        if other is None:
            only_a.append(entry)
        elif content_of(entry.tensor) != content_of(other.tensor):
            differing.append(StatePair(entry, other))
    keys_a = {entry.key for entry in a.entries}
    only_b = [entry for entry in b.entries if entry.key not in keys_a]
    differing.sort(key=lambda pair: KIND_ORDER[pair.kind])  # stable: A's order within a kind
    return StepComparison(a.step, tuple(differing), tuple(only_a), tuple(only_b))


@dataclass(frozen=True, slots=True)
class StepDivergence:
    """The first step of a rank whose state differs, as its records show it; under
    ``--tolerant``, the first whose state differs beyond the rounding envelope (``beyond``:
    the entries past it, in the order the step computed them, :mod:`.tolerant.envelope`)."""

    rank: int
    comparison: StepComparison
    beyond: tuple[EntryJudgement, ...] = ()

    @property
    def kind(self) -> Kind:
        return Kind.STATE

    @property
    def step(self) -> int:
        return self.comparison.step

    @property
    def first(self) -> StatePair:
        """The first differing entry in the order the step computed them (under
        ``--tolerant``, the first beyond the envelope)."""
        if self.beyond:
            return StatePair(self.beyond[0].a, self.beyond[0].b)
        return self.comparison.differing[0]

    @property
    def pairs(self) -> tuple[StatePair, ...]:
        """The entries that make the divergence, in the order the step computed them: under
        ``--tolerant`` those beyond the envelope, else every differing one."""
        if self.beyond:
            return tuple(StatePair(judged.a, judged.b) for judged in self.beyond)
        return self.comparison.differing

    @property
    def alike(self) -> str:
        """How the entries that do not make it compare: ``equal``, or under ``--tolerant``
        ``within rounding``."""
        return "within rounding" if self.beyond else "equal"

    @property
    def judged(self) -> EntryJudgement | None:
        """Under ``--tolerant``, why the first entry is beyond the envelope."""
        return self.beyond[0] if self.beyond else None

    @property
    def cause(self) -> Cause:
        return CAUSE_OF_KIND[self.first.kind]

    @property
    def meaning(self) -> str:
        """Which part of the step made the difference, as a sentence."""
        what = "parameters" if self.first.kind == "param" else "optimizer states"
        beyond = " beyond rounding" if self.beyond else ""
        text = WORDS[self.cause].state.format(
            step=self.step, what=what, alike=self.alike, beyond=beyond
        )
        missing = [
            e for e in (*self.comparison.only_a, *self.comparison.only_b) if e.kind == "grad"
        ]
        if self.cause is Cause.OPTIMIZER and missing:
            text += f" (and {len(missing)} gradient(s) recorded in one run only)"
        return text

    @property
    def summary(self) -> str:
        if self.beyond:
            count = len(self.beyond)
            more = f" (and {count - 1} more entries beyond it)" if count > 1 else ""
            return f"step {self.step}: {self.beyond[0].text()}{more}: {self.meaning}"
        count = len(self.comparison.differing)
        more = f" (and {count - 1} more entries)" if count > 1 else ""
        return f"{self.first.label} differs at step {self.step}{more}: {self.meaning}"

    @property
    def hint(self) -> str:
        """What to run next: the step op by op, in both runs."""
        return (
            f"record step {self.step} op by op in both runs ({window_command(self.step)} … "
            "SCRIPT), then diff those recordings"
        )


@dataclass
class StateComparison:
    """One rank's step-level records compared, up to the first differing step."""

    rank: int
    records_a: int  # step-level records each run holds
    records_b: int
    compared: int = 0  # steps compared, the first differing one included
    first: StepDivergence | None = None
    # Steps recorded in one run only (before the walk stopped), as [first, last] ranges.
    only_in_a: list[list[int]] = field(default_factory=list)
    only_in_b: list[list[int]] = field(default_factory=list)
    # The first compared step (equal up to it) with entries recorded in one run only.
    entries_only: StepComparison | None = None
    # The first step whose loss alone differed (:func:`reached_nothing`): not a divergence.
    loss_only: StepComparison | None = None
    notes: list[str] = field(default_factory=list)
    # Under --tolerant: what the rounding envelope found (the steps' differences it explained)
    tolerance: StepTolerance | None = None
    differs: bool = False  # a compared step's state differed (within the envelope or not)

    def describe(self) -> str:
        """The rank's step-level verdict in one line, as every front end says it."""
        first = self.first
        if first is None:
            but = " but a loss that reached nothing" if self.loss_only is not None else ""
            alike = "all equal"
            if self.tolerance is not None and self.differs:
                alike = "within the rounding envelope"
            return f"{self.compared} steps compared, {alike}{but}"
        if first.beyond:
            return (
                f"first beyond the rounding envelope at step {first.step} in "
                f"{first.first.label}, {self.compared - 1} steps within it before"
            )
        # The entry's kind says its cause, except that parameters and optimizer states point
        # at the update, with their gradients equal.
        update = " (the optimizer's update)" if first.cause == CAUSE_OF_KIND["param"] else ""
        return (
            f"first differ at step {first.step} in {first.first.label}{update}, "
            f"{self.compared - 1} steps equal before it"
        )


def compare_states(
    trace_a: RankTrace,
    trace_b: RankTrace,
    *,
    step: int | None = None,
    envelope: StepEnvelope | None = None,
) -> StateComparison:
    """Walks both runs' step-level records in step order (only step ``step`` when given) to
    the first step whose content differs; with an ``envelope`` (``--tolerant``), to the first
    whose content differs beyond it."""
    result = StateComparison(trace_a.rank, trace_a.step_count(), trace_b.step_count())
    if envelope is not None:
        result.tolerance = envelope.found
    stop = None if step is None else step + 1
    walks = (trace_a.raw_steps(step or 0, stop), trace_b.raw_steps(step or 0, stop))
    try:
        _walk(result, trace_a, trace_b, walks, envelope)
    finally:
        for walk in walks:
            walk.close()
    _add_notes(result)  # a damaged record the walk met is the trace's damage (the diff says it)
    return result


def _walk(
    result: StateComparison,
    trace_a: RankTrace,
    trace_b: RankTrace,
    walks: tuple[Generator[tuple[int, bytes], None, None], ...],
    envelope: StepEnvelope | None,
) -> None:
    names_a, names_b = trace_a.state_names, trace_b.state_names
    # Equal bytes are equal state when no name id means one name in A and another in B;
    # else B's ids are mapped to A's before entries are compared.
    same_names = all(names_b.get(i, name) == name for i, name in names_a.items())
    ids_a = {name: i for i, name in names_a.items()}
    rename = None
    if not same_names:
        rename = [-1] * (max(names_b, default=-1) + 1)
        for i, name in names_b.items():
            rename[i] = ids_a.get(name, -1)
    next_a, next_b = next(walks[0], None), next(walks[1], None)
    while next_a is not None and next_b is not None:
        (sa, raw_a), (sb, raw_b) = next_a, next_b
        if sa != sb:  # a step recorded in one run only
            if sa < sb:
                add_to_ranges(result.only_in_a, sa)
                next_a = next(walks[0], None)
            else:
                add_to_ranges(result.only_in_b, sb)
                next_b = next(walks[1], None)
            continue
        result.compared += 1
        equal = (same_names and raw_a == raw_b) or _alike(raw_a, raw_b, rename)
        if not equal and _judge(result, trace_a, trace_b, sa, envelope):
            return
        next_a, next_b = next(walks[0], None), next(walks[1], None)
    for current, rest, ranges in (
        (next_a, walks[0], result.only_in_a),
        (next_b, walks[1], result.only_in_b),
    ):
        if current is not None:
            add_to_ranges(ranges, current[0])
        for recorded, _ in rest:
            add_to_ranges(ranges, recorded)


def _alike(raw_a: bytes, raw_b: bytes, rename: list[int] | None) -> bool:
    """Whether two step records whose bytes differ hold equal states all the same, as far as
    a quick look tells (stats apart, names mapped); False sends the step to :func:`_judge`."""
    contents = _step_contents or comparable_entries
    content_a = contents(expand_step(raw_a))  # the recorder stores entries compressed
    return content_a is not None and content_a == contents(expand_step(raw_b), rename)


def _native_step_contents() -> Any:
    try:
        from .._C import step_contents
    except ImportError:  # an extension built before it: the Python reading
        return None
    return step_contents


_step_contents: Any = _native_step_contents()


def _judge(
    result: StateComparison,
    trace_a: RankTrace,
    trace_b: RankTrace,
    step: int,
    envelope: StepEnvelope | None,
) -> bool:
    """Decodes and compares step ``step``; True when the walk ends there (the state differs,
    beyond the ``envelope`` where there is one, or a record is damaged)."""
    try:
        state_a, state_b = trace_a.step_state(step), trace_b.step_state(step)
    except TraceError:  # the trace's damage: the diff notes it where reading ended
        return True
    assert state_a is not None and state_b is not None  # the walk just read both
    compared = compare_step(state_a, state_b)
    result.differs = result.differs or not compared.equal
    if not compared.equal and reached_nothing(compared, state_a):
        result.loss_only = result.loss_only or compared
    elif not compared.equal:
        pairs = [(pair.a, pair.b) for pair in compared.differing]
        beyond = envelope.judge(state_a, state_b, pairs) if envelope is not None else []
        if envelope is None or beyond:
            result.first = StepDivergence(result.rank, compared, tuple(beyond))
            return True
    if (compared.only_a or compared.only_b) and result.entries_only is None:
        result.entries_only = compared
    return False


def reached_nothing(compared: StepComparison, state_a: StepState) -> bool:
    """Whether only the loss given to ``backward()`` differs in a step whose gradients were
    recorded equal: a difference the backward pass never read (the gradient of a loss does
    not depend on its value), as where ``loss / 3`` and ``loss * (1.0 / 3)`` round apart or a
    constant is added. The training state is the same; it is said, not a divergence."""
    kinds = {pair.kind for pair in compared.differing}
    recorded = {entry.kind for entry in state_a.entries}
    return kinds == {"loss"} and "grad" in recorded


def _leading(entry: StateEntry) -> str:
    return ", ".join(leading_values(entry.tensor)[:2]) or "?"


def _add_notes(result: StateComparison) -> None:
    for run, ranges in (("A", result.only_in_a), ("B", result.only_in_b)):
        for first, last in ranges:
            result.notes.append(f"{range_text(first, last)}: step-level records only in run {run}")
    loss = result.loss_only
    if loss is not None:
        pair = loss.differing[0]
        result.notes.append(
            f"step {loss.step}: the loss given to backward() differs "
            f"({_leading(pair.a)} vs {_leading(pair.b)}) while "
            "every gradient is equal: it reached nothing the step computed"
        )
    if result.tolerance is not None:
        result.notes.extend(result.tolerance.notes())
    only = result.entries_only
    if only is not None:
        result.notes.append(
            f"step {only.step}: state entries recorded in one run only (not compared): "
            f"{only.only_text()}"
        )
