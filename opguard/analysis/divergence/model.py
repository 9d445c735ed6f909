"""What a first divergence is: the pair of ops it names, the tensors and arguments that differ
there, the producer chain followed back to it, and the evidence found for it.

The walk in :mod:`opguard.analysis.diff` finds the first aligned pair of ops whose outputs
differ; :mod:`.explainer` classifies it into a :class:`Divergence` and :mod:`.findings` adds
its evidence (a stream race, likely causes, a summary and a hint).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from ...store import KernelEntry, OpRecord, TensorRecord
from ..words.text import short_kernel_name
from ..words.verdict import Cause, Kind, Side
from .gpu_work import kernel_names


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
    a_passed: bool = True  # False: the op was called without it (the op's default applied)
    b_passed: bool = True


@dataclass(frozen=True, slots=True)
class Link:
    """One hop of the producer chain: the differing input ``slot`` of ops ``a``/``b``."""

    a: OpRecord
    b: OpRecord
    slot: str


@dataclass(frozen=True, slots=True)
class WriteWindow:
    """In run ``run``, a tensor written by op ``producer`` was changed by code OpGuard did not
    record after op ``after`` (the last op that read it unchanged, or its producer) and before
    op ``before`` (the first that read it changed). ``kernels``: the GPU work launched in that
    window outside any recorded op, as (op it followed, kernels entry), the first
    ``MAX_WINDOW_KERNELS`` of ``kernels_total``."""

    run: Side
    producer: int
    after: int
    before: int
    kernels: tuple[tuple[int, KernelEntry], ...] = ()
    kernels_total: int = 0

    def text(self) -> str:
        where = f"run {self.run.name}: written by unrecorded code between op {self.after} and op {self.before}"
        if not self.kernels_total:
            return where
        return f"{where}, kernels: {unrecorded_kernels_text(self.kernels, self.kernels_total)}"

    def to_json(self) -> dict[str, Any]:
        return {
            "run": self.run.name,
            "producer": self.producer,
            "after": self.after,
            "before": self.before,
            "kernels": [{**entry.to_json(), "i": index} for index, entry in self.kernels],
            "kernels_total": self.kernels_total,
        }


MAX_WINDOW_KERNELS = 50  # unrecorded GPU launches kept per window
KERNEL_NAMES_SHOWN = 3  # distinct names in a window's text
MAX_WINDOW_SCAN = 1_000_000  # ops read to narrow an unrecorded write down


def unrecorded_kernels_text(kernels: Sequence[tuple[int, KernelEntry]], total: int) -> str:
    """``memset ×2, my_kernel, +3 more``: the distinct names of unrecorded GPU work, in launch
    order, with how many launches the list leaves out."""
    counts = Counter(short_kernel_name(entry.name) for _, entry in kernels)
    shown = list(counts.items())[:KERNEL_NAMES_SHOWN]
    parts = [name if n == 1 else f"{name} ×{n}" for name, n in shown]
    more = total - sum(n for _, n in shown)
    return ", ".join(parts + ([f"+{more} more"] if more else []))


@dataclass(frozen=True, slots=True)
class LikelyCause:
    kind: str
    cause: str  # what happened, in a sentence
    evidence: str  # what in the traces shows it

    def to_json(self) -> dict[str, str]:
        return {"cause": self.cause, "evidence": self.evidence, "kind": self.kind}


@dataclass
class Divergence:
    rank: int
    step: int
    kind: Kind  # origin | argument | propagated | structure
    cause: Cause  # an op-level one: origin, argument, rng, leaf, earlier-step, …
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
    hint: str = ""  # what the evidence suggests a person check first, when it suggests anything
    race: str = ""  # evidence of a stream race on the op that read the difference
    # unrecorded-write: where, in each run whose read differs from the write, the unrecorded
    # write happened (between two ops)
    windows: list[WriteWindow] = field(default_factory=list)
    # why, most likely first, with the evidence for each (origin, unrecorded-write)
    likely_causes: list[LikelyCause] = field(default_factory=list)

    @property
    def kernels_differ(self) -> bool:
        """The two runs launched different GPU kernels for the observed op (a classic cause of
        bitwise differences: another algorithm, TF32, a different library version)."""
        return kernel_names(self.observed_a) != kernel_names(self.observed_b)


def _by_slot(tensors: tuple[TensorRecord, ...]) -> dict[str, TensorRecord]:
    return {t.slot: t for t in tensors}


def differing_tensors(a: tuple[TensorRecord, ...], b: tuple[TensorRecord, ...]) -> list[TensorDiff]:
    """Slots whose content differs, or that exist on one side only, in slot order of A."""
    sa, sb = _by_slot(a), _by_slot(b)
    diffs = []
    for slot in [*sa, *(s for s in sb if s not in sa)]:
        ta, tb = sa.get(slot), sb.get(slot)
        if ta is None or tb is None or content_of(ta) != content_of(tb):
            diffs.append(TensorDiff(slot, ta, tb))
    return diffs


def content_of(t: TensorRecord) -> tuple[Any, ...]:
    """What two tensor entries must share to count as equal: their content key, or, where no
    fingerprint was read, their dtype and shape (an unread tensor is not a difference)."""
    key = t.content_key()
    return key if key is not None else ("unknown", t.dtype, t.shape)


def differing_arguments(a: OpRecord, b: OpRecord) -> list[ArgumentDiff]:
    da, db = dict(a.args), dict(b.args)
    return [
        ArgumentDiff(name, da.get(name), db.get(name), name in da, name in db)
        for name in [*da, *(n for n in db if n not in da)]
        if da.get(name) != db.get(name) or (name in da) != (name in db)
    ]
