"""The tolerant diff across parallel layouts (TP=N against TP=1): how the walk of
:mod:`opguard.analysis.diff` judges each aligned pair of a rank pair, given what :mod:`..align.layouts` says it is.

- A **comparable** pair (each output its logical value in both runs) is judged by the ordinary
  rule (:class:`~.judge.Judge`).
- A **reduced** pair (an output is a partial sum in one run) is judged at the output of the
  collective that makes it whole, its logical value, by rule 2: the ops between comparable
  tensors that made it (shards, the partial sum, the collective) are a region whose output must
  be within what those ops' bounds allow from the comparable tensors it read.
- A **sharded** pair (an output is a shard of the other run's) is not compared by value: the
  recorder keys a shard's sketch by its local index, so the two sketches do not measure one
  tensor. It belongs to the region of the comparable tensor it feeds, and is counted, so that
  the report says how many tensors were not compared (:class:`LayoutCounts`).
- Ops only one layout has (collectives, views, DTensor's bookkeeping) carry no value change of
  their own: they belong to regions too.

To the judge and the explainer only comparable pairs are partners (:class:`LayoutAlignment`);
every other op is one of one run only, which is what rule 2 and the structure wording follow
back through.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, replace
from typing import Any, Protocol

from ...store import OpRecord, RankTrace, TensorRecord
from ..align.layouts import LAYOUT_ONLY, OnlyKind, PairKind, PairLayout, Tensor, layout_of
from ..divergence.explainer import Alignment, Explainer
from ..divergence.model import Divergence
from ..words.verdict import Side
from .judge import Judge
from .judgement import Judgement, RankTolerance, Reason
from .noise import NoiseFloor
from .rule import Tolerance

LAYOUT_CACHE = 8  # steps whose pairs are kept decoded (producers rarely reach further back)


class StepAlignment(Alignment, Protocol):
    """The walk's alignment, step by step (``step_pairs.StepAlignments``)."""

    def step_of(self, index: int, side: int) -> int | None: ...

    def step_ops(self, step: int) -> tuple[tuple[list[int], list[int]], list[tuple[int, int]]]: ...


@dataclass
class LayoutCounts:
    """One rank pair's layouts, and what the steps judged held: tensors compared by value
    (as they are, or after the collective that makes a partial sum whole), shards that were
    not, and the ops only one layout has."""

    degree: int
    rank_a: int
    rank_b: int
    steps: int = 0
    comparable: int = 0  # tensors compared as they are
    reduced: int = 0  # tensors compared at the collective that made them whole
    sharded: int = 0  # tensors that are a shard of the other run's: not compared by value
    unrelated: int = 0  # aligned pairs whose outputs are not one tensor in two layouts
    layout_only: int = 0  # ops of one run only that are the layout's own
    selections: int = 0  # slices of one run only (a shard cut out): their offsets not checked

    def add(self, pairs: tuple[PairLayout, ...], only: tuple[OnlyKind, ...]) -> None:
        self.steps += 1
        for pair in pairs:
            if pair.kind is PairKind.REDUCED:
                self.reduced += len(pair.compared)
            else:
                self.comparable += len(pair.compared)
            self.sharded += pair.shards
            self.unrelated += pair.kind is PairKind.UNRELATED
        self.layout_only += sum(kind in LAYOUT_ONLY for kind in only)
        self.selections += sum(kind is OnlyKind.SELECTION for kind in only)

    def text(self) -> str:
        """What was compared by value, and what was not, in words."""
        parts = [
            f"degree {self.degree}, run A rank {self.rank_a} against run B rank {self.rank_b}, "
            f"{self.steps} step(s): {self.comparable} tensor(s) compared by value",
            f"{self.reduced} after the collective that makes a partial sum whole",
            f"{self.sharded} shard(s) NOT compared by value (a shard's offset is not "
            "recorded: judged through the comparable tensors they feed)",
            f"{self.layout_only} op(s) of one layout only (collectives, views, bookkeeping)",
        ]
        if self.selections:
            parts.append(f"{self.selections} slice(s) of one layout only, offsets not checked")
        if self.unrelated:
            parts.append(f"{self.unrelated} aligned pair(s) of unrelated shapes")
        return "; ".join(parts)

    def to_json(self) -> dict[str, Any]:
        return {
            "degree": self.degree,
            "rank_a": self.rank_a,
            "rank_b": self.rank_b,
            "steps": self.steps,
            "comparable": self.comparable,
            "reduced": self.reduced,
            "sharded": self.sharded,
            "unrelated": self.unrelated,
            "layout_only": self.layout_only,
            "selections": self.selections,
        }


class LayoutAlignment:
    """The walk's alignment as the judge and the explainer see it across layouts: only
    comparable pairs are partners. Each step's pairs are related (:func:`~..align.layouts.layout_of`)
    when first asked about, and counted then."""

    def __init__(
        self, base: StepAlignment, traces: tuple[RankTrace, RankTrace], counts: LayoutCounts
    ) -> None:
        self.base = base
        self.traces = traces
        self.counts = counts
        self._cache: OrderedDict[int, dict[tuple[int, int], PairLayout]] = OrderedDict()
        self._counted: set[int] = set()

    def pair(self, a_index: int, b_index: int) -> PairLayout | None:
        """What aligned ops ``a_index``/``b_index`` are to each other (None: not aligned)."""
        step = self.base.step_of(a_index, 0)
        return None if step is None else self._pairs(step).get((a_index, b_index))

    def b_of(self, a_index: int) -> int | None:
        b_index = self.base.b_of(a_index)
        return b_index if b_index is not None and self._partners(a_index, b_index) else None

    def a_of(self, b_index: int) -> int | None:
        a_index = self.base.a_of(b_index)
        return a_index if a_index is not None and self._partners(a_index, b_index) else None

    def compared(self, index: int, side: int) -> bool:
        return self.base.compared(index, side)

    def _partners(self, a_index: int, b_index: int) -> bool:
        pair = self.pair(a_index, b_index)
        return pair is not None and pair.kind is PairKind.COMPARABLE

    def _pairs(self, step: int) -> dict[tuple[int, int], PairLayout]:
        pairs = self._cache.pop(step, None)
        if pairs is None:
            indices, matched = self.base.step_ops(step)
            layout = layout_of(self.traces, step, indices, matched, self.counts.degree)
            pairs = {(p.a, p.b): p for p in layout.pairs}
            if step not in self._counted:
                self._counted.add(step)
                self.counts.add(layout.pairs, tuple(o.kind for o in layout.only))
        self._cache[step] = pairs
        while len(self._cache) > LAYOUT_CACHE:
            self._cache.popitem(last=False)
        return pairs


class LayoutJudge:
    """:class:`~.judge.Judge` across layouts: the walk asks it as it asks the judge."""

    def __init__(
        self,
        tolerance: Tolerance,
        traces: tuple[RankTrace, RankTrace],
        alignment: LayoutAlignment,
        noise: NoiseFloor | None = None,
    ) -> None:
        self.traces = traces
        self.alignment = alignment
        self._judge = Judge(tolerance, traces, alignment, noise)

    @property
    def found(self) -> RankTolerance:
        return self._judge.found

    def measuring(self, step: int) -> bool:
        return self._judge.measuring(step)

    def judge(self, op_a: OpRecord, op_b: OpRecord) -> Judgement | None:
        """None when rounding explains the pair, or when it is not compared by value (a
        shard, judged through the comparable tensors it feeds)."""
        pair = self.alignment.pair(op_a.index, op_b.index)
        if pair is None or pair.kind is PairKind.COMPARABLE:
            return self._judge.judge(op_a, op_b)
        if pair.kind is PairKind.REDUCED:
            return self._reduced(op_a, op_b, pair)
        return None

    @property
    def left_open(self) -> bool:
        return self._judge.left_open

    def reached_nothing(self) -> None:
        self._judge.reached_nothing()

    def divergence(
        self, explainer: Explainer, op_a: OpRecord, op_b: OpRecord, judged: Judgement
    ) -> Divergence:
        return self._judge.divergence(explainer, op_a, op_b, judged)

    def _reduced(self, op_a: OpRecord, op_b: OpRecord, pair: PairLayout) -> Judgement | None:
        """A partial sum's logical value (the collective's output in the run that has it)
        against the other run's whole tensor, by rule 2. Where rounding does not explain it,
        the aligned op is where the difference first shows (an origin): what it read were
        shards, which are not compared by value, so the sentence says the difference may lie
        in them (a shard loaded from the wrong offset)."""
        for tensors in pair.compared:
            if tensors.equal:
                continue
            ta, tb = self._output(Side.A, tensors.a), self._output(Side.B, tensors.b)
            what = (
                f"output '{ta.slot}', summed across the ranks from shards that are not "
                "compared by value (the difference may lie in them)"
            )
            judged = self._judge.region_output(op_a, op_b, (ta, tb), (tensors.a, tensors.b), what)
            if judged is not None:
                return replace(judged, reason=Reason.AMPLIFIED, output=judged.tensor, slot="")
        return None

    def _output(self, side: Side, tensor: Tensor) -> TensorRecord:
        return self.traces[side.value].op(tensor[0]).outputs[tensor[1]]
