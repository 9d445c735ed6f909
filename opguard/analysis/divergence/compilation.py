"""Whether the two runs were recorded with ``torch.compile`` on (``opguard record`` records
compiled regions and their generated kernels) or off (``opguard record --eager``), and what that
explains.

A compiled run and an eager run of the same code differ bitwise by design: Inductor fuses ops
into kernels whose rounding differs from the ATen ops they replace. When the first divergence
involves compiled code and the two sides were recorded differently, the diff says it is this
known difference rather than leaving the reader to rediscover it.
"""

from __future__ import annotations

from typing import Any

from ...store import OpRecord
from .model import Divergence

META_KEY = "torch_compile"  # "enabled" | "disabled"; absent in traces from before it existed
COMPILED_NAMESPACES = ("compiled::", "inductor::")


def compile_modes(meta_a: dict[str, Any], meta_b: dict[str, Any]) -> dict[str, str | None]:
    return {"a": meta_a.get(META_KEY), "b": meta_b.get(META_KEY)}


def recorded_differently(meta_a: dict[str, Any], meta_b: dict[str, Any]) -> bool:
    modes = compile_modes(meta_a, meta_b)
    return None not in modes.values() and modes["a"] != modes["b"]


def mode_note(meta_a: dict[str, Any], meta_b: dict[str, Any]) -> str | None:
    """One line for the report when the runs were recorded differently, else None."""
    if not recorded_differently(meta_a, meta_b):
        return None
    compiled, eager = _compiled_and_eager(meta_a, meta_b)
    return (
        f"run {eager} was recorded with torch.compile turned off (--eager), run {compiled} with "
        "it on: code compiled in one run is recorded as generated kernels there and as "
        "ATen ops in the other"
    )


def _compiled_and_eager(meta_a: dict[str, Any], meta_b: dict[str, Any]) -> tuple[str, str]:
    """("A", "B") when run A was the compiled one of two runs recorded differently, else
    ("B", "A")."""
    return ("B", "A") if compile_modes(meta_a, meta_b)["a"] == "disabled" else ("A", "B")


def is_compiled(op: OpRecord | None) -> bool:
    """A compiled region or one of Inductor's generated kernels."""
    return op is not None and op.op.startswith(COMPILED_NAMESPACES)


def known_difference(div: Divergence, meta_a: dict[str, Any], meta_b: dict[str, Any]) -> str:
    """Why the divergence is expected, when it is: the runs were recorded differently and it
    starts in compiled code. '' otherwise."""
    if not recorded_differently(meta_a, meta_b):
        return ""
    involved = [
        div.a,
        div.b,
        div.observed_a,
        div.observed_b,
        *(op for link in div.chain for op in (link.a, link.b)),
    ]
    if not any(is_compiled(op) for op in involved):
        return ""
    compiled, eager = _compiled_and_eager(meta_a, meta_b)
    return (
        f"expected: run {compiled} ran this code compiled by torch.compile and run {eager} "
        "ran it eagerly (--eager); Inductor's fused kernels round differently from the ATen "
        "ops they replace. Compare two compiled runs (or two --eager runs) to find a change "
        "in the code itself"
    )
