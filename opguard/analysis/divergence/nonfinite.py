"""Where NaN and Inf values come from: the first op whose outputs hold them while its inputs
did not, per run and rank, from the NaN and Inf counts every tensor entry carries.

The counts are read by the same scan the diff makes (the native scanner reports them with the
alignment fields, :meth:`~opguard.store.light.LightReader.columns`), so the diff finds the
origins at no extra pass; ``opguard nan`` makes that scan alone. Only the handful of ops named
are decoded in full.

Three ops are named, since a single one can mislead:

- *origin*: the first op whose outputs have NaN or Inf while its inputs had neither (an overflow,
  a ``log(0)``, a division by zero);
- *NaN origin*: the first op whose outputs have NaN while its inputs had none. It differs from
  the origin when an Inf was meant (an attention mask filled with ``-inf``) and a later op turned
  it into NaN (a softmax over a row that is all ``-inf``);
- *first seen*: the first op that reads or writes a non-finite value at all. When it is not the
  origin, its inputs already held them: data, parameters, or memory written by code OpGuard did
  not record.

Views carry no counts of their own (their content is their base's, counted where it was made),
so a view never hides the origin: the op that made its base comes first.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from ...store import OpRecord, RankTrace, TensorRecord
from ...store.light import HAS_NAN, LightReader
from ..align.keys import KeyTable, OpKeys


def _earliest(current: int | None, index: int) -> int:
    return index if current is None else min(current, index)


@dataclass
class NonfiniteWatch:
    """Collects, as records stream by, the few op indices the report names (any order)."""

    first_seen: int | None = None
    origin: int | None = None
    nan_origin: int | None = None
    ops: int = 0  # ops whose outputs hold NaN or Inf

    def see(self, index: int, inputs: int, outputs: int) -> None:
        """Op ``index`` has non-finite values: ``inputs`` and ``outputs`` are HAS_NAN |
        HAS_INF masks."""
        self.first_seen = _earliest(self.first_seen, index)
        if outputs:
            self.ops += 1
            if not inputs:
                self.origin = _earliest(self.origin, index)
        if outputs & HAS_NAN and not inputs & HAS_NAN:
            self.nan_origin = _earliest(self.nan_origin, index)


@dataclass(frozen=True)
class Nonfinite:
    """The named ops of one rank, decoded."""

    rank: int
    ops: int
    first_seen: OpRecord
    origin: OpRecord | None
    nan_origin: OpRecord | None

    @property
    def from_outside(self) -> bool:
        """The first op that saw non-finite values read them: they were never made by a
        recorded op (data, parameters, an unrecorded write)."""
        return any(any(_counts(t)) for t in self.first_seen.inputs)


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
    if watch.first_seen is None:
        return None
    return Nonfinite(
        trace.rank,
        watch.ops,
        trace.op(watch.first_seen),
        trace.op(watch.origin) if watch.origin is not None else None,
        trace.op(watch.nan_origin) if watch.nan_origin is not None else None,
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
    watch = NonfiniteWatch()
    for _ in LightReader(trace, OpKeys(trace, KeyTable()), watch=watch).columns():
        pass
    return resolve(trace, watch)
