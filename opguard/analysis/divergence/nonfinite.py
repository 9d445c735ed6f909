"""Where NaN and Inf values come from: the first op whose outputs hold them while its inputs
did not, per run and rank, from the NaN and Inf counts every tensor entry carries.

The counts are read by the same scan the diff makes (the native scanner reports them with the
alignment fields, :meth:`~opguard.store.light.LightReader.columns`), so the diff finds the
origins at no extra pass; ``opguard nan`` makes that scan alone. Only the ops that see NaN or
Inf are decoded (below).

Three ops are named, since a single one can mislead:

- *origin*: the first op whose outputs have NaN or Inf while its inputs had neither (an overflow,
  a ``log(0)``, a division by zero);
- *NaN origin*: the first op whose outputs have NaN while its inputs had none. It differs from
  the origin when an Inf was meant (an attention mask filled with ``-inf``) and a later op turned
  it into NaN (a softmax over a row that is all ``-inf``);
- *first seen*: the first op that reads or writes a non-finite value at all. When it is not the
  origin, its inputs already held them: data, parameters, or memory written by code OpGuard did
  not record.

**Intended values are not named.** A causal mask filled with ``-inf`` (or added to the scores,
``-inf`` again) that a softmax turns into exact zeros is meant, and so is a NaN that
``nan_to_num`` replaces: the run computes with them as designed. The rule is data flow, not a
list of ops: the non-finite outputs of an op are *intended* when some op of the same step
reads them for their content (through views too; ``ones_like`` reads only a shape) and every
op that does either makes finite values only, or makes non-finite values that are intended in
turn. They are not when an op hands one to Python (``.item()``), when nothing in the step
reads them (the loss, a parameter or a state kept for later), or when they feed values that are
not intended; values read from outside (data, parameters, an unrecorded write) never are. The
three ops above are named among the values that are not intended; the intended ones are
counted, and the first op that made them named, apart.

Judging needs the producers the records name, so the ops that see non-finite values (and
the views between them) are decoded, step by step: a step's values are judged when the next
step begins. Judging ends with the first step that holds values not intended (everything
named is there or before); later ops are named from their counts alone, and intended values
are counted up to that step.

Views carry no counts of their own (their content is their base's, counted where it was made),
so a view never hides the origin: the op that made its base comes first.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ...store import OpRecord, RankTrace, TensorRecord, schema
from ...store.errors import TraceError
from ...store.light import HAS_NAN, LightReader
from ..align.keys import KeyTable, OpKeys
from .reach import MAX_VIEW_HOPS, content_free

Ref = tuple[int, int]  # (op index, output position): a tensor as the records' producers name it


def _earliest(current: int | None, index: int) -> int:
    return index if current is None else min(current, index)


@dataclass(eq=False)
class _Maker:
    """An op of a judged step whose outputs hold NaN or Inf: what decides whether they are
    intended."""

    index: int
    inputs: int  # HAS_NAN | HAS_INF of its inputs
    outputs: int  # and of its outputs
    sources: list[_Maker]  # makers whose values it read for their content
    read: bool = False  # an op read its values for their content
    escapes: bool = False  # not intended (see the module doc)


@dataclass
class NonfiniteWatch:
    """Collects, as records stream by in execution order, the few op indices the report
    names, judging step by step which values are intended (the module doc)."""

    trace: RankTrace
    first_seen: int | None = None
    origin: int | None = None
    nan_origin: int | None = None
    from_outside: bool = False  # first_seen read them from outside (data, parameters, …)
    ops: int = 0  # ops whose outputs hold NaN or Inf
    judging: bool = True
    step: int | None = None  # the step being judged
    makers: list[_Maker] = field(default_factory=list)  # of that step
    outside: int | None = None  # its first op that read non-finite values from outside
    made: dict[Ref, _Maker] = field(default_factory=dict)  # tensors of makers, and their views
    plain: set[Ref] = field(default_factory=set)  # tensors of this step known to be no maker's
    intended: list[_Maker] = field(default_factory=list)  # whose values were intended
    last: int = -1  # the last op told

    def see(self, index: int, inputs: int, outputs: int) -> None:
        """Op ``index`` has non-finite values: ``inputs`` and ``outputs`` are HAS_NAN |
        HAS_INF masks."""
        if index <= self.last:  # told once; a second reading of the same ops adds nothing
            return
        self.last = index
        if outputs:
            self.ops += 1
        if self.judging:
            op = self.trace.op(index)
            if op.step != self.step:
                self.finish()
                self.step = op.step
            if self.judging:
                self._judge(op, inputs, outputs)
                return
        self._name(index, inputs, outputs)

    def _name(self, index: int, inputs: int, outputs: int) -> None:
        """Counts op ``index`` among the ops that see values not intended."""
        self.first_seen = _earliest(self.first_seen, index)
        if outputs and not inputs:
            self.origin = _earliest(self.origin, index)
        if outputs & HAS_NAN and not inputs & HAS_NAN:
            self.nan_origin = _earliest(self.nan_origin, index)

    def _judge(self, op: OpRecord, inputs: int, outputs: int) -> None:
        sources: list[_Maker] = []
        outside = False
        for t in op.inputs:
            maker = self._maker_of(t)
            if maker is not None:
                sources.append(maker)
            elif any(_counts(t)):
                outside = True
        if outside and self.outside is None:
            self.outside = op.index
        if op.outputs and all(t.is_view for t in op.outputs):  # its readers read its input
            base = self._maker_of(op.inputs[0]) if op.inputs else None
            if base is not None:
                for slot in range(len(op.outputs)):
                    self.made[(op.index, slot)] = base
            return
        reads = not content_free(op.op)
        to_python = _holds_nonfinite(op.returned)
        for maker in sources if reads else ():
            maker.read = True
            maker.escapes |= to_python
        if outputs:
            made = _Maker(
                op.index, inputs, outputs, sources if reads else [], escapes=outside or to_python
            )
            self.makers.append(made)
            for slot, t in enumerate(op.outputs):
                if any(_counts(t)):
                    self.made[(op.index, slot)] = made

    def _maker_of(self, t: TensorRecord) -> _Maker | None:
        """The maker whose values the input ``t`` holds, followed back through views."""
        ref = t.producer
        seen: list[Ref] = []
        is_view = t.is_view
        for _ in range(MAX_VIEW_HOPS):
            if ref is None or ref in self.plain:
                break
            found = self.made.get(ref)
            if found is not None:
                for r in seen:
                    self.made[r] = found
                return found
            if not is_view:
                break
            seen.append(ref)
            try:
                producer = self.trace.op(ref[0])
            except TraceError:
                break
            if not (0 <= ref[1] < len(producer.outputs) and producer.outputs[ref[1]].is_view):
                break
            is_view = True
            ref = producer.inputs[0].producer if producer.inputs else None
        self.plain.update(seen)
        return None

    def finish(self) -> None:
        """Judges the step being judged: its makers, last first (what reads comes later)."""
        for maker in reversed(self.makers):
            if not maker.escapes and not maker.read:
                maker.read = self._read_through_views(maker)
            if maker.escapes or not maker.read:
                self._escape(maker)
        self.intended.extend(m for m in self.makers if not m.escapes)
        if self.outside is not None:
            self.first_seen = _earliest(self.first_seen, self.outside)
            self.from_outside = self.first_seen == self.outside
        self.makers, self.outside = [], None
        self.plain.clear()
        if self.first_seen is not None:  # judging ends: drop what only judging needed
            self.judging = False
            self.made.clear()
            self.intended = [m for m in self.intended if not m.escapes]  # an earlier step's

    def _escape(self, maker: _Maker) -> None:
        """``maker``'s values are not intended, nor those of every maker they came from (an
        earlier step's among them: a mask that was intended until a NaN came of it)."""
        pending = [maker]
        while pending:
            m = pending.pop()
            if m.escapes and m is not maker:
                continue
            m.escapes = True
            self._name(m.index, m.inputs, m.outputs)
            pending.extend(s for s in m.sources if not s.escapes)

    def _read_through_views(self, maker: _Maker) -> bool:
        """Whether an op of ``maker``'s step reads its values for their content through views
        only (its readers that made non-finite values were seen; the others were not)."""
        names = self.trace.op_names
        tainted = {ref for ref, m in self.made.items() if m is maker}
        for raw in self.trace.raw_ops(maker.index + 1):
            if raw.get("s", 0) != self.step:
                return False
            if not any(_ref(e) in tainted for e in raw.get("x", ())):
                continue
            outputs = raw.get("y", ())
            if outputs and all(
                isinstance(e, dict) and e.get("f", 0) & schema.FLAG_VIEW for e in outputs
            ):
                tainted.update((raw["i"], slot) for slot in range(len(outputs)))
            elif not content_free(names.get(raw.get("o", -1))):
                return True
        return False


def _ref(entry: Any) -> Ref | None:
    producer = entry.get("p") if isinstance(entry, dict) else None
    return (producer[0], producer[1]) if isinstance(producer, list) and len(producer) == 2 else None


def _holds_nonfinite(value: Any) -> bool:
    """Whether a value handed to Python (``.item()``, ``.tolist()``) holds NaN or Inf."""
    if isinstance(value, float):
        return not math.isfinite(value)
    return isinstance(value, (list, tuple)) and any(_holds_nonfinite(v) for v in value)


@dataclass(frozen=True)
class Nonfinite:
    """The named ops of one rank, decoded: those of the values not intended (None where all
    are), and the first op that made intended ones."""

    rank: int
    ops: int
    first_seen: OpRecord | None
    origin: OpRecord | None
    nan_origin: OpRecord | None
    from_outside: bool  # the first op that saw them read them: data, parameters, unrecorded
    intended: int = 0  # ops whose NaN or Inf every reader turned finite (the module doc)
    first_intended: OpRecord | None = None

    @property
    def found(self) -> bool:
        """Whether the rank has NaN or Inf that is not intended."""
        return self.first_seen is not None


def _counts(t: TensorRecord) -> tuple[int, int]:
    """(NaN, Inf) counts of a tensor entry; (0, 0) without stats."""
    if t.stats is None or len(t.stats) < 6:
        return (0, 0)
    return (int(t.stats[4] or 0), int(t.stats[5] or 0))


def nonfinite_tensors(tensors: tuple[TensorRecord, ...]) -> list[tuple[str, int, int]]:
    """(slot, NaN count, Inf count) of the tensors that hold any."""
    return [(t.slot, *_counts(t)) for t in tensors if any(_counts(t))]


def resolve(trace: RankTrace, watch: NonfiniteWatch) -> Nonfinite | None:
    """The watched ops decoded; None when the rank never saw a NaN or Inf."""
    watch.finish()
    if watch.first_seen is None and not watch.intended:
        return None

    def decoded(index: int | None) -> OpRecord | None:
        return trace.op(index) if index is not None else None

    return Nonfinite(
        trace.rank,
        watch.ops,
        decoded(watch.first_seen),
        decoded(watch.origin),
        decoded(watch.nan_origin),
        watch.from_outside,
        len(watch.intended),
        decoded(min((m.index for m in watch.intended), default=None)),
    )


def same_in_both(
    a: Nonfinite | None, b: Nonfinite | None, b_of: Callable[[int], int | None]
) -> bool:
    """Whether two runs met the same NaN and Inf values (an attention mask's intended
    ``-inf``, say): as many ops made them, and the ops named in each run are aligned pairs
    (``b_of``: run B's op aligned with run A's index) with the same counts in the same slots.
    A diff then has no NaN/Inf difference to report."""
    if a is None or b is None:
        return a is b
    if a.ops != b.ops or a.from_outside != b.from_outside:
        return False
    for op_a, op_b in (
        (a.first_seen, b.first_seen),
        (a.origin, b.origin),
        (a.nan_origin, b.nan_origin),
    ):
        if op_a is None or op_b is None:
            if op_a is not op_b:
                return False
            continue
        if b_of(op_a.index) != op_b.index:
            return False
        for tensors in ("inputs", "outputs"):
            if nonfinite_tensors(getattr(op_a, tensors)) != nonfinite_tensors(
                getattr(op_b, tensors)
            ):
                return False
    return True


def find_nonfinite(trace: RankTrace) -> Nonfinite | None:
    """Scans one rank's trace (``opguard nan``)."""
    watch = NonfiniteWatch(trace)
    for _ in LightReader(trace, OpKeys(trace, KeyTable()), watch=watch).columns():
        pass
    return resolve(trace, watch)
