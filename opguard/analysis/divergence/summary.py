"""The one line a person (or a script) reads of a divergence, and an argument change in words."""

from __future__ import annotations

from ...store import OpRecord
from ..words.text import plain_value
from ..words.verdict import WORDS, Cause
from .causes import KERNELS, first_cause
from .gpu_work import kernel_names
from .model import ArgumentDiff, Divergence


def argument_text(d: ArgumentDiff) -> str:
    """``name: A's value (A) vs B's value (B)``; an argument not passed reads "default"."""
    a = plain_value(d.a) if d.a_passed else "default"
    b = plain_value(d.b) if d.b_passed else "default"
    return f"{d.name}: {a} (A) vs {b} (B)"


def _op_text(op: OpRecord) -> str:
    """An op and its site; a backward op that borrowed its forward op's site says so."""
    gradient = "gradient of " if op.is_backward and op.forward_index is not None else ""
    return f"{op.op} ({gradient}{op.call_site.short()})"


def summarise(div: Divergence) -> str:
    """One line a person (or a script) can act on."""
    obs = div.observed_a
    where = f"{obs.op} at {obs.call_site.short()}"
    words = WORDS[div.cause].summary
    if div.cause is Cause.ORIGIN:
        made = words.format(where=where)
        top = first_cause(div.likely_causes)  # kernels that differ always give one
        if top is None:
            return f"{made} (nondeterministic kernel, race, different kernel or hardware fault)"
        if div.kernels_differ and top.kind != KERNELS:
            a, b = kernel_names(div.observed_a), kernel_names(div.observed_b)
            return (
                f"{made}: {top.cause}; the runs launched different kernels "
                f"({', '.join(a) or 'none'} vs {', '.join(b) or 'none'})"
            )
        return f"{made}: {top.cause}"
    if div.cause is Cause.ARGUMENT:
        shown = ", ".join(argument_text(d) for d in div.arguments[:3])
        op = div.a or obs
        return words.format(op=op.op, site=op.call_site.short(), shown=shown)
    if div.cause is Cause.RNG:
        return words.format(where=where)
    if div.cause in (Cause.LEAF, Cause.EARLIER_STEP, Cause.UNRECORDED_WRITE):
        link = div.chain[-1] if div.chain else None
        last = link.a if link else obs
        how = div.race or "changed by code OpGuard did not record" + "".join(
            f"; {w.text()}" for w in div.windows
        )
        return words.format(
            slot=link.slot if link else "?",
            op=last.op,
            site=last.call_site.short(),
            step=div.step,
            how=how,
        )
    if div.cause is Cause.INSERTED and div.b is not None:
        return words.format(op=_op_text(div.b), where=where)
    if div.cause is Cause.REMOVED and div.a is not None:
        return words.format(op=_op_text(div.a), where=where)
    if div.cause is Cause.REPLACED and div.a is not None and div.b is not None:
        return words.format(a=_op_text(div.a), b=_op_text(div.b), where=where)
    if div.cause is Cause.REORDERED and div.chain:
        link = div.chain[-1]
        return words.format(
            slot=link.slot,
            op=link.a.op,
            site=link.a.call_site.short(),
            a=producer_text(link.a, link.slot),
            b=producer_text(link.b, link.slot),
        )
    return f"outputs of {where} differ"


def producer_text(op: OpRecord, slot: str) -> str:
    """``op #12``: the op that wrote ``op``'s input ``slot``, as the report numbers ops."""
    producer = next((t.producer for t in op.inputs if t.slot == slot), None)
    return f"op #{producer[0]}" if producer is not None else "data"
