"""Whether a difference reaches anything: differences every reader absorbs are not divergences.

Some kernels return tensors they never write: PyTorch's memory-efficient attention returns its
philox seed and offset as ``torch.empty`` scalars when dropout is off, and their bits are
whatever the allocator left there. Two runs whose allocation histories differ then "differ" at
that op, though the backward that reads the scalars ignores them. So an aligned pair whose
outputs differ is the first divergence only if the difference reaches something:

* a later op that reads a differing output (directly or through views) produces a different
  output, and the difference is its only differing input; or its other differing inputs come
  from differences that reach nothing on their own (two differences that meet only at one
  reader, as two micro-batches' gradients summed into one ``.grad``, reach it together: the
  earlier is the first divergence). Where another input's difference does reach something by
  itself, that one explains the reader, and is found in its own turn;
* or an op that only one run has reads it (a cast only one run makes): what that op made is
  not compared with anything, so nothing says the difference stopped there;
* or the output is state that outlives the op: a tensor written in place (a parameter, a
  buffer, a gradient, an optimizer state), a value handed to Python (``.item()``), or a tensor
  no op of the step reads for its content (the step's loss, a value kept for later).

A difference every reader absorbs is reported as a note, not as the first divergence. Readers
are found from the producers their inputs name, within the step, in one pass over each run's
records of the step (made only for steps where a difference is judged).
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from ...store import OpRecord, RankTrace, schema
from ...store.light import OpColumns

# Ops that read only the size, dtype and device of their tensor input, never its values: their
# output is equal whatever the input holds, so their reading absorbs nothing (``ones_like`` of
# the loss seeds the backward pass).
CONTENT_FREE_OPS = frozenset(
    f"aten::{name}"
    for name in (
        "empty_like",
        "zeros_like",
        "ones_like",
        "full_like",
        "rand_like",
        "randn_like",
        "randint_like",
        "new_empty",
        "new_empty_strided",
        "new_zeros",
        "new_ones",
        "new_full",
    )
)
ABSORBED_SHOWN = 5  # absorbed differences a rank keeps for the report (all are counted)

Ref = tuple[int, int]  # (op index, output slot): a tensor as the records' producers name it


@dataclass(frozen=True, slots=True)
class Absorbed:
    """Outputs ``slots`` of the aligned ops ``a`` / ``b`` differ, and every op that read them
    produced equal outputs (``readers``: those ops' indices in run A)."""

    a: OpRecord
    b: OpRecord
    slots: tuple[str, ...]
    readers: tuple[int, ...]

    def text(self) -> str:
        outputs = ", ".join(self.slots)
        if self.readers:
            read = f"{len(self.readers)} op(s) read it and produced the same outputs in both runs"
            why = "rounded away where it was read, or memory the op returns without writing it"
        else:
            read, why = "no op read it", "an output nothing uses"
        return (
            f"absorbed: {self.a.op} (#{self.a.index}, step {self.a.step}, "
            f"{self.a.call_site.short()}): output {outputs} differs, but {read} ({why})"
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "step": self.a.step,
            "a": self.a.index,
            "b": self.b.index,
            "op": self.a.op,
            "slots": list(self.slots),
            "readers": list(self.readers),
            "text": self.text(),
        }


class _Readers:
    """Which ops of one run's step read which tensors (by producer), and which of their
    outputs are views (whose readers read the same memory), indexed as far as asked."""

    def __init__(self, trace: RankTrace, ops: OpColumns) -> None:
        self.by_ref: dict[Ref, list[int]] = defaultdict(list)  # tensor -> reading positions
        self.views: dict[int, list[int]] = {}  # position -> its view outputs' slots
        self.not_reading: set[int] = set()  # ops whose outputs never depend on input values
        self.scanned = -1  # positions up to this one are indexed
        self._trace, self._ops = trace, ops

    @property
    def complete(self) -> bool:
        return self.scanned >= len(self._ops) - 1

    def extend(self, last: int) -> None:
        """Indexes the step's ops up to position ``last``."""
        last = min(last, len(self._ops) - 1)
        if last <= self.scanned:
            return
        index, names = self._ops.index, self._trace.op_names
        for raw in self._trace.raw_ops(index[self.scanned + 1], index[last] + 1):
            position = self._ops.position(raw["i"])
            if position is None:
                continue
            for entry in raw.get("x", ()):
                producer = entry.get("p") if isinstance(entry, dict) else None
                if isinstance(producer, list) and len(producer) == 2:
                    self.by_ref[(producer[0], producer[1])].append(position)
            outputs = raw.get("y", ())
            views = [
                slot
                for slot, entry in enumerate(outputs)
                if isinstance(entry, dict) and entry.get("f", 0) & schema.FLAG_VIEW
            ]
            if views:
                self.views[position] = views
            if len(views) == len(outputs) or content_free(names.get(raw.get("o", -1))):
                self.not_reading.add(position)  # only views of it, or only its metadata
        self.scanned = last

    def reach(self, refs: Iterable[Ref], after: int) -> tuple[set[Ref], list[int]]:
        """The tensors ``refs`` and the views made of them, and the positions after ``after``
        (as far as indexed) that read any of them for their content, in order."""
        tainted = set(refs)
        readers: set[int] = set()
        pending = list(tainted)
        while pending:
            for position in self.by_ref.get(pending.pop(), ()):
                if position <= after:
                    continue
                for slot in self.views.get(position, ()):  # a view: its readers read it too
                    ref = (self._ops.index[position], slot)
                    if ref not in tainted:
                        tainted.add(ref)
                        pending.append(ref)
                if position not in self.not_reading:
                    readers.add(position)
        return tainted, sorted(readers)


def content_free(name: str | None) -> bool:
    """Whether op ``name`` (``aten::ones_like.default``) reads only the metadata of its tensor
    inputs (:data:`CONTENT_FREE_OPS`, whatever the overload)."""
    overload_free = (
        name.rsplit(".", 1)[0] if name is not None and "." in name.split("::")[-1] else name
    )
    return overload_free in CONTENT_FREE_OPS


FIRST_LOOK = 64  # ops indexed past a difference before the first look for its readers
MAX_VIEW_HOPS = 16  # views followed back from a reader's input to the op that computed it


class Reach:
    """Judges, for the differing aligned pairs of one step, whether their difference reaches
    anything (see the module doc). Built per step, its reader index on first use."""

    def __init__(
        self,
        traces: tuple[RankTrace, RankTrace],
        ops: tuple[OpColumns, OpColumns],
        pairs: dict[int, int],
    ) -> None:
        self._traces = traces
        self._ops = ops
        self._a_to_b = pairs
        self._b_to_a = {b: a for a, b in pairs.items()}
        self._readers = (_Readers(traces[0], ops[0]), _Readers(traces[1], ops[1]))
        self._alone: dict[tuple[int, int], bool] = {}  # pair -> whether it reaches by itself

    def absorbed(
        self, pa: int, pb: int, a: OpRecord, b: OpRecord, *, alone: bool = False
    ) -> Absorbed | None:
        """An :class:`Absorbed` when the difference between ops ``a`` and ``b`` (positions
        ``pa`` / ``pb`` in the step) reaches nothing; None when it reaches something.
        ``alone``: a reader that read another difference too does not count as reached (how
        another difference is asked whether it reaches anything by itself)."""
        if a.returned != b.returned or len(a.outputs) != len(b.outputs):
            return None  # a value handed to Python, or outputs that do not correspond
        slots = [
            k
            for k, (x, y) in enumerate(zip(a.outputs, b.outputs, strict=True))
            if x.content_key() != y.content_key()
        ]
        if not slots or any(
            (a.outputs[k].flags | b.outputs[k].flags) & schema.FLAG_WRITTEN for k in slots
        ):
            return None  # written in place: state that outlives the op
        index_a, index_b = self._readers
        ops_a, ops_b = self._ops
        judged: set[tuple[int, int]] = set()
        look = FIRST_LOOK  # the index grows by doubling looks: a difference that reaches
        while True:  # something is usually read soon after it is made
            index_a.extend(pa + look)
            index_b.extend(pb + look)
            tainted_a, read_a = index_a.reach(((a.index, k) for k in slots), pa)
            tainted_b, read_b = index_b.reach(((b.index, k) for k in slots), pb)
            if any(r not in self._a_to_b for r in read_a) or any(
                s not in self._b_to_a for s in read_b
            ):
                return None  # an op of one run only read it: what it made is not compared here
            pairs = sorted(
                {(r, self._a_to_b[r]) for r in read_a if r in self._a_to_b}
                | {(self._b_to_a[s], s) for s in read_b if s in self._b_to_a}
            )
            for r, s in pairs:
                if r > index_a.scanned or s > index_b.scanned or (r, s) in judged:
                    continue  # one side not indexed yet, or judged in an earlier look
                judged.add((r, s))
                if ops_a.outputs[r] == ops_b.outputs[s]:
                    continue
                others = self._other_differences(r, s, tainted_a, tainted_b)
                if others is None:
                    continue  # its own argument or RNG state changed: that explains it
                if not others or not (alone or all(self._reaches_alone(q) for q in others)):
                    return None
            if index_a.complete and index_b.complete:
                break
            look *= 2
        if not read_a or not read_b:
            return None  # nothing reads it for its content: kept, as a step's loss is
        return Absorbed(
            a, b, tuple(a.outputs[k].slot for k in slots), tuple(ops_a.index[r] for r, _ in pairs)
        )

    def _other_differences(
        self, r: int, s: int, tainted_a: set[Ref], tainted_b: set[Ref]
    ) -> list[tuple[int, int]] | None:
        """The reader pair at positions ``r`` / ``s`` beside the tainted tensors: the aligned
        pairs of this step (positions) whose outputs are its other differing inputs; None when
        something else explains it by itself (an argument or the RNG state changed, an input
        exists on one side only, or comes from an op of one run only, data or an earlier
        step)."""
        (trace_a, trace_b), (ops_a, ops_b) = self._traces, self._ops
        x, y = trace_a.op(ops_a.index[r]), trace_b.op(ops_b.index[s])
        if x.args != y.args or x.rng != y.rng:
            return None
        theirs = {t.slot: t for t in y.inputs}
        others: list[tuple[int, int]] = []
        for t in x.inputs:
            u = theirs.get(t.slot)
            if u is None:
                return None
            if t.producer in tainted_a or u.producer in tainted_b:
                continue
            if t.content_key() == u.content_key():
                continue
            source = self._aligned_source(t.producer, u.producer)
            if source is None:
                return None
            others.append(source)
        return others

    def _aligned_source(self, pa: Ref | None, pb: Ref | None) -> tuple[int, int] | None:
        """The aligned pair of this step (positions in A, in B) that computed two inputs'
        values, followed back through views (whose values are their base's); None for data,
        an op of one run only or one of an earlier step."""
        (trace_a, trace_b), (ops_a, ops_b) = self._traces, self._ops
        for _ in range(MAX_VIEW_HOPS):
            if pa is None or pb is None:
                return None
            qa, qb = ops_a.position(pa[0]), ops_b.position(pb[0])
            if qa is None or qb is None or self._a_to_b.get(qa) != qb:
                return None
            op_a, op_b = trace_a.op(pa[0]), trace_b.op(pb[0])
            if not (_is_view(op_a, pa[1]) and _is_view(op_b, pb[1])):
                return qa, qb
            if not (op_a.inputs and op_b.inputs):
                return None
            pa, pb = op_a.inputs[0].producer, op_b.inputs[0].producer
        return None

    def _reaches_alone(self, pair: tuple[int, int]) -> bool:
        """Whether the difference of the aligned pair at ``pair`` (positions) reaches something
        by itself: it is state, a value handed to Python, read by an op of one run only, or
        read by an op that changed through it alone (:meth:`absorbed` with readers that read
        another difference counting as unchanged)."""
        found = self._alone.get(pair)
        if found is None:
            qa, qb = pair
            (trace_a, trace_b), (ops_a, ops_b) = self._traces, self._ops
            a, b = trace_a.op(ops_a.index[qa]), trace_b.op(ops_b.index[qb])
            found = self._alone[pair] = self.absorbed(qa, qb, a, b, alone=True) is None
        return found


def _is_view(op: OpRecord, slot: int) -> bool:
    return 0 <= slot < len(op.outputs) and op.outputs[slot].is_view
