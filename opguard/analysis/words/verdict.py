"""The vocabulary of a verdict: which run, what kind of divergence, what caused it, and the
words each cause is said in.

Every front end (the CLI report, the TUI header, the agent's reading, the ``opguard.diff/1``
JSON) names kinds and causes through these enums, and reads a cause's sentences from
:data:`WORDS`, so a new cause is added here and the type checker and ``tests/test_verdict.py``
find every place that must handle it. The enums are ``str``-valued: the JSON and the text they
appear in are the plain words. Torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import Enum, StrEnum


class Side(Enum):
    """Run A or run B (the value: its position in a pair of traces)."""

    A = 0
    B = 1

    @property
    def key(self) -> str:
        """The run as the JSON and the tools' arguments spell it: ``a`` or ``b``."""
        return self.name.lower()


class Kind(StrEnum):
    """What kind of first difference it is."""

    ORIGIN = "origin"  # equal inputs and arguments, different outputs
    ARGUMENT = "argument"  # a non-tensor argument or the consumed RNG state differs
    PROPAGATED = "propagated"  # an input already differed; the cause is further back
    STRUCTURE = "structure"  # an op that exists in one run only feeds the difference
    STATE = "state"  # step-level records only: a step's training state differs


class Cause(StrEnum):
    """What the difference was traced back to."""

    ORIGIN = "origin"
    ARGUMENT = "argument"
    RNG = "rng"
    LEAF = "leaf"
    EARLIER_STEP = "earlier-step"
    UNRECORDED_WRITE = "unrecorded-write"
    INSERTED = "inserted"
    REMOVED = "removed"
    REPLACED = "replaced"
    REORDERED = "reordered"  # the differing input comes from ops both runs have, in other order
    # step-level records: the part of the step whose state differs first
    LOSS = "loss"
    GRADIENT = "gradient"
    OPTIMIZER = "optimizer"
    BUFFER = "buffer"


@dataclass(frozen=True, slots=True)
class Words:
    """How a cause is said. ``summary``: an op-level verdict's one line (the CLI report, the
    TUI header, the JSON's ``summary``); ``reading``: the offline reading's finding about it
    (the agent's evidence, ``opguard explain``); ``state``: what a step-level verdict says
    (which part of the step differs; ``{alike}`` is how the entries before it compare, ``equal``
    or ``within rounding``, and ``{beyond}`` says ``beyond rounding`` under ``--tolerant``). All
    are templates: the fields in braces are filled by the code that knows them. A cause has op-level words, step-level words, or both."""

    summary: str = ""
    reading: str = ""
    state: str = ""


WORDS: dict[Cause, Words] = {
    Cause.ORIGIN: Words(
        "{where} produced different outputs from identical inputs and arguments",
        "equal inputs and arguments, different outputs ({kernels}): a nondeterministic "
        "implementation (atomics, split reductions, thread count), a race, or a hardware fault",
    ),
    Cause.ARGUMENT: Words(
        "{op} at {site}: argument {shown}",
        "argument `{name}` differs: {a} vs {b}",
    ),
    Cause.RNG: Words(
        "random op {where} consumed a different RNG state (seed or generator changed)",
        "random op with a different RNG state: {op}; its inputs and arguments are equal, so the "
        "seed (torch.manual_seed, generator) or the random draws made before it differ",
        "everything else {alike}, an RNG state differs: step {step} drew a different number "
        "of random values, or the generator was seeded differently",
    ),
    Cause.LEAF: Words(
        "input '{slot}' of {op} at {site} differs and no recorded op produced it (data, "
        "parameters, or a tensor made before recording)",
        "{input} differs and no recorded op produced it: data, parameters or a tensor made "
        "before recording (data order, initialisation seed, checkpoint)",
    ),
    Cause.EARLIER_STEP: Words(
        "input '{slot}' of {op} at {site} already differed when step {step} began (made in an "
        "earlier step, which was not compared: diff without --step to find where)",
        "{input} already differed when step {step} began: compare without --step to find where",
    ),
    Cause.UNRECORDED_WRITE: Words(
        "input '{slot}' of {op} at {site} was equal when produced and differs when read: {how}",
        "{input} was equal when produced and differs when read: something OpGuard did not "
        "record wrote it (a custom extension, a .data write, a NumPy view)",
    ),
    Cause.INSERTED: Words(
        "{op} only in run B feeds the divergence at {where}",
        "op only in run B feeds the divergence: {op}{source}; {seen}",
    ),
    Cause.REMOVED: Words(
        "{op} only in run A feeds the divergence at {where}",
        "op only in run A feeds the divergence: {op}{source}; {seen}",
    ),
    Cause.REPLACED: Words(
        "{a} in run A was replaced by {b} in run B; it feeds the divergence at {where}",
        "op #{index} {name} of run A was replaced in run B by {b}; {seen}",
    ),
    Cause.REORDERED: Words(
        "input '{slot}' of {op} at {site} comes in each run from an op the other run has too, "
        "at another point ({a} in run A, {b} in run B): the runs compute the same things in "
        "another order",
        "{op}{source} reads, in each run, a tensor the other run computes too but at another "
        "point ({a} in run A, {b} in run B): reordered statements, or a sum taken in another "
        "order; {seen}",
    ),
    Cause.LOSS: Words(
        state="the loss differs{beyond}: the forward of step {step} (or the loss computed from it)"
    ),
    Cause.GRADIENT: Words(
        state="the gradients differ{beyond}: the forward or backward of step {step}"
    ),
    Cause.OPTIMIZER: Words(
        state="gradients {alike}, {what} differ{beyond}: the optimizer step of step {step}"
    ),
    Cause.BUFFER: Words(
        state="loss, gradients, parameters and optimizer states {alike}, a buffer differs"
        "{beyond}: what updates it in step {step} (a norm layer's running statistics, in the "
        "forward)"
    ),
}


def label(kind: Kind, cause: Cause) -> str:
    """``propagated (leaf)``; just ``origin`` where the kind and the cause are one word."""
    return kind.value if kind.value == cause.value else f"{kind} ({cause})"
