"""Classifying the first observed difference and following it back to its cause.

The walk in :mod:`opguard.analysis.diff` finds the first aligned pair of ops whose outputs
differ. This module explains it: if the inputs and arguments were equal the op itself is the
origin; if only a non-tensor argument or the RNG state differed it is an argument change;
otherwise it follows the producers of the differing input back until it reaches a leaf (data,
parameters), an op that exists in only one run, or a tensor changed by code OpGuard did not see.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from ..store import OpRecord, RankTrace, TensorRecord

MAX_CHAIN = 64


@dataclass(frozen=True, slots=True)
class TensorDiff:
    slot: str
    a: TensorRecord | None
    b: TensorRecord | None


@dataclass(frozen=True, slots=True)
class ArgumentDiff:
    name: str
    a: Any
    b: Any


@dataclass(frozen=True, slots=True)
class Link:
    """One hop of the producer chain: the differing input ``slot`` of ops ``a``/``b``."""

    a: OpRecord
    b: OpRecord
    slot: str


@dataclass
class Divergence:
    rank: int
    step: int
    kind: str  # origin | argument | propagated | structure
    cause: str  # origin | argument | rng | leaf | inserted | removed | replaced | unrecorded-write
    a: OpRecord | None  # the op the verdict names in run A (the cause for structure)
    b: OpRecord | None
    observed_a: OpRecord  # the first aligned pair whose outputs differ
    observed_b: OpRecord
    outputs: list[TensorDiff]
    inputs: list[TensorDiff]
    arguments: list[ArgumentDiff]
    rng_differs: bool
    chain: list[Link] = field(default_factory=list)
    summary: str = ""


def _by_slot(tensors: tuple[TensorRecord, ...]) -> dict[str, TensorRecord]:
    return {t.slot: t for t in tensors}


def differing_tensors(a: tuple[TensorRecord, ...], b: tuple[TensorRecord, ...]) -> list[TensorDiff]:
    """Slots whose content differs, or that exist on one side only, in slot order of A."""
    sa, sb = _by_slot(a), _by_slot(b)
    diffs = []
    for slot in [*sa, *(s for s in sb if s not in sa)]:
        ta, tb = sa.get(slot), sb.get(slot)
        if ta is None or tb is None or _content(ta) != _content(tb):
            diffs.append(TensorDiff(slot, ta, tb))
    return diffs


def _content(t: TensorRecord) -> tuple[Any, ...]:
    key = t.content_key()
    return key if key is not None else ("unknown", t.dtype, t.shape)


def differing_arguments(a: OpRecord, b: OpRecord) -> list[ArgumentDiff]:
    da, db = dict(a.args), dict(b.args)
    return [
        ArgumentDiff(name, da.get(name), db.get(name))
        for name in [*da, *(n for n in db if n not in da)]
        if da.get(name) != db.get(name)
    ]


class Explainer:
    """Explains the first differing aligned pair, given both traces and the alignment."""

    def __init__(
        self, trace_a: RankTrace, trace_b: RankTrace, aligned_b_of: Callable[[int], int | None]
    ) -> None:
        self.trace_a = trace_a
        self.trace_b = trace_b
        self.aligned_b_of = aligned_b_of  # A op index -> its aligned B op index, or None

    def explain(self, op_a: OpRecord, op_b: OpRecord) -> Divergence:
        outputs = differing_tensors(op_a.outputs, op_b.outputs)
        first = self._assess(op_a, op_b)
        div = Divergence(
            rank=self.trace_a.rank,
            step=op_a.step,
            kind="",
            cause="",
            a=op_a,
            b=op_b,
            observed_a=op_a,
            observed_b=op_b,
            outputs=outputs,
            inputs=first[0],
            arguments=first[1],
            rng_differs=first[2],
        )
        if not div.inputs:
            div.kind = "argument" if div.arguments or div.rng_differs else "origin"
            div.cause = "rng" if div.rng_differs and not div.arguments else div.kind
        else:
            self._follow(div)
        div.summary = summarise(div)
        return div

    def _assess(
        self, a: OpRecord, b: OpRecord
    ) -> tuple[list[TensorDiff], list[ArgumentDiff], bool]:
        return differing_tensors(a.inputs, b.inputs), differing_arguments(a, b), a.rng != b.rng

    def _follow(self, div: Divergence) -> None:
        """Walks producers of the first differing input back to the earliest cause."""
        div.kind = "propagated"
        op_a, op_b, inputs = div.observed_a, div.observed_b, div.inputs
        for _ in range(MAX_CHAIN):
            slot = inputs[0]
            div.chain.append(Link(op_a, op_b, slot.slot))
            pa = slot.a.producer if slot.a else None
            pb = slot.b.producer if slot.b else None
            if pa is None and pb is None:
                div.cause = "leaf"
                return
            if pa is not None and pb is not None and self.aligned_b_of(pa[0]) == pb[0]:
                prod_a, prod_b = self.trace_a.op(pa[0]), self.trace_b.op(pb[0])
                out_a, out_b = _output(prod_a, pa[1]), _output(prod_b, pb[1])
                if (
                    out_a is not None
                    and out_b is not None
                    and not (out_a.is_view or out_b.is_view)
                    and _content(out_a) == _content(out_b)
                ):
                    div.cause = "unrecorded-write"  # equal when written, different when read
                    return
                inputs, arguments, rng = self._assess(prod_a, prod_b)
                if not inputs:  # only reachable through views: the base itself is the origin
                    div.a, div.b = prod_a, prod_b
                    div.inputs, div.arguments, div.rng_differs = inputs, arguments, rng
                    div.kind = "argument" if arguments or rng else "origin"
                    div.cause = "rng" if rng and not arguments else div.kind
                    div.chain.append(Link(prod_a, prod_b, ""))
                    return
                op_a, op_b = prod_a, prod_b
                continue
            div.kind = "structure"
            cause_a = (
                self.trace_a.op(pa[0])
                if pa is not None and (pb is None or self.aligned_b_of(pa[0]) != pb[0])
                else None
            )
            cause_b = self.trace_b.op(pb[0]) if pb is not None else None
            if (
                cause_a is not None
                and cause_b is not None
                and self.aligned_b_of(cause_a.index) is not None
            ):
                cause_a = None  # A's producer has a partner; B's extra op made the difference
            div.a, div.b = cause_a, cause_b
            div.cause = (
                "replaced"
                if cause_a is not None and cause_b is not None
                else "removed"
                if cause_a is not None
                else "inserted"
            )
            return
        div.cause = "leaf"


def _output(op: OpRecord, slot: int) -> TensorRecord | None:
    return op.outputs[slot] if 0 <= slot < len(op.outputs) else None


def _fmt(value: Any) -> str:
    return repr(value) if isinstance(value, str) else str(value)


def summarise(div: Divergence) -> str:
    """One line a person (or a script) can act on."""
    obs = div.observed_a
    where = f"{obs.op} at {obs.call_site.short()}"
    if div.cause == "origin":
        return (
            f"{where} produced different outputs from identical inputs and arguments "
            "(nondeterministic kernel, race, different kernel or hardware fault)"
        )
    if div.cause == "argument":
        shown = ", ".join(
            f"{d.name}: {_fmt(d.a)} (A) vs {_fmt(d.b)} (B)" for d in div.arguments[:3]
        )
        return f"{div.a.op if div.a else obs.op}: argument {shown}"
    if div.cause == "rng":
        return f"random op {where} consumed a different RNG state (seed or generator changed)"
    if div.cause == "leaf":
        slot = div.chain[-1].slot if div.chain else "?"
        last = div.chain[-1].a if div.chain else obs
        return (
            f"input '{slot}' of {last.op} at {last.call_site.short()} differs and no recorded "
            "op produced it (data, parameters, or a tensor made before recording)"
        )
    if div.cause == "unrecorded-write":
        link = div.chain[-1]
        return (
            f"input '{link.slot}' of {link.a.op} at {link.a.call_site.short()} was equal when "
            "produced and differs when read: changed by code OpGuard did not record"
        )
    if div.cause == "inserted" and div.b is not None:
        return (
            f"{div.b.op} only in run B ({div.b.call_site.short()}) feeds the divergence at {where}"
        )
    if div.cause == "removed" and div.a is not None:
        return (
            f"{div.a.op} only in run A ({div.a.call_site.short()}) feeds the divergence at {where}"
        )
    if div.cause == "replaced" and div.a is not None and div.b is not None:
        return (
            f"{div.a.op} in run A ({div.a.call_site.short()}) was replaced by {div.b.op} in "
            f"run B ({div.b.call_site.short()}); it feeds the divergence at {where}"
        )
    return f"outputs of {where} differ"
