"""The mutation catalogue of the fuzzer (issue 37): the changes a user makes to a training script,
each applied to a generated program (``fuzz_programs.py``), with its right answer, bit for bit
and under ``--tolerant``.

A pair is (program A, program B): B is A with one mutation (for ``numpy_write``, A has the same
NumPy line adding 0.0, so that both runs make the same ops). Right answers name the op, the line
of each generated script (a backward op's line is its forward call's, as OpGuard documents call
sites), the step and the cause (``first_divergence.cause`` of ``opguard.diff/1``); the truth comes from the oracle (``fuzz_oracle.py``) where the two runs
make the same ops, and from the catalogue's knowledge of where it changed the code where they do
not. "The first differing step" is the oracle's ``state_step``: the first step whose losses,
parameters, gradients or optimizer states differ in their bits.

========================  ===================================================  ==========================
class (family)            right answer, bit for bit                            under ``--tolerant``
========================  ===================================================  ==========================
lr, eps, betas,           the oracle's first divergence: cause ``argument``,    the same op, ``DIVERGED``
weight_decay, momentum,   the very op (name, line, step and which of that
gamma, clip_norm          name on its line), on the ``opt.step()`` line (the
(hyperparameter)          clip call's for ``clip_norm``); ``IDENTICAL`` where
                          the change reaches nothing (a clip that never clips)
threads (rounding)        the oracle's first divergence, cause ``origin``;      ``IDENTICAL`` or
                          ``IDENTICAL`` where the thread count changes no bit   ``WITHIN-ROUNDING``
penalty_order,            ``IDENTICAL`` where the training is bit for bit       ``IDENTICAL`` or
accum_scale (rounding)    equal, else an op on the changed line (the penalty,   ``WITHIN-ROUNDING``
                          the backward line) at the first differing step, cause
                          ``inserted``, ``removed``, ``replaced``, ``origin``
                          or ``argument`` (an op of one run only there, or an
                          aligned one computing other bits)
reorder_slices,           the same: ``IDENTICAL`` where bit for bit equal       ``IDENTICAL`` or
reorder_item, log_loss,   (always, so far), else an op on a changed line,       ``WITHIN-ROUNDING``
log_grad_norm,            with the same causes
log_activation,
times_one, inplace,
reshape (identity)
shift, order (data)       the oracle's first divergence: cause ``argument`` at  the same op, ``DIVERGED``
                          the inputs' slice (a view op with other arguments)
numpy_write (unrecorded   the oracle's first divergence: the first op that      the same op, ``DIVERGED``,
write)                    reads the weight NumPy changed, cause                 cause ``origin`` or
                          ``unrecorded-write``, or ``origin`` with the hint to  ``unrecorded-write``
                          record with ``--verify-inputs``
no_zero_grad (structure)  step 1, cause ``inserted`` or ``replaced``, run B's   the same
                          op on its ``backward()`` line (run A's, if named,
                          on its own)
seed, loop_seed (seed)    the oracle's first divergence, cause ``rng``: the     the same op, ``DIVERGED``
                          first layer's initialisation; the first dropout mask
                          whose difference reaches the training
linear_swap (layer swap)  ``IDENTICAL`` where bit for bit equal; else an op on  ``IDENTICAL`` or
                          the swapped line (forward, or backward: a backward    ``WITHIN-ROUNDING``
                          op's line is its forward call's) at the first
                          differing step, cause as for ``penalty_order``
========================  ===================================================  ==========================

Where the oracle's facts contradict the table (the op sequences of a class that keeps them
differ, a divergence on a line the class cannot touch), the pair raises :class:`CatalogueError`:
a bug of the fuzzer, reported apart from OpGuard's answers.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Protocol

from fuzz_answers import DIVERGED, IDENTICAL, ROUNDING, Expected
from fuzz_oracle import Source, Truth
from fuzz_programs import Program, Script, generate


class CatalogueError(Exception):
    """The oracle's facts contradict what the catalogue says of a class: the fuzzer is wrong."""


@dataclass(frozen=True)
class Answers:
    bitwise: Expected
    tolerant: Expected


class Rule(Protocol):
    @property
    def needs_ops(self) -> bool:
        """Whether the right answer needs the oracle's ops (which compiled programs lack)."""
        ...

    def answers(self, truth: Truth, a: Script, b: Script) -> Answers: ...


# The causes of opguard.diff/1 that say each kind of source of the oracle.
CAUSES = {
    "origin": frozenset({"origin"}),
    "argument": frozenset({"argument"}),
    "rng": frozenset({"rng"}),
    "external": frozenset({"unrecorded-write", "origin"}),
}
VERIFY_HINT = "--verify-inputs"


def _lines(script: Script, roles: tuple[str, ...]) -> frozenset[int]:
    return frozenset(script.lines[r] for r in roles if r in script.lines)


def _identical(rounding: bool = False) -> Expected:
    if rounding:
        return Expected(ROUNDING, "IDENTICAL or WITHIN-ROUNDING")
    return Expected(IDENTICAL, "IDENTICAL: the training is bit for bit the same")


def _at_source(source: Source, tolerant: bool) -> Expected:
    return Expected(
        DIVERGED,
        f"the oracle's {source.describe()}",
        step=source.step,
        op=source.op,
        occurrence=source.occurrence,
        lines_a=frozenset({source.line_a}),
        lines_b=frozenset({source.line_b}),
        named=frozenset({"a", "b"}),
        causes=CAUSES[source.kind],
        origin_hint=None if tolerant or source.kind != "external" else VERIFY_HINT,
    )


# The causes that can name a changed line: an op of one run only there, or an aligned op there
# that computes other bits from equal inputs or takes other arguments (never an unrecorded write,
# a random state or a leaf: a code change is none of them).
CODE_CHANGE = frozenset({"inserted", "removed", "replaced", "origin", "argument"})


def _at_lines(
    a: Script, b: Script, roles: tuple[str, ...], step: int, causes: frozenset[str] = CODE_CHANGE
) -> Expected:
    return Expected(
        DIVERGED,
        f"an op on the {'/'.join(roles)} line at step {step}, cause {'/'.join(sorted(causes))}",
        step=step,
        lines_a=_lines(a, roles),
        lines_b=_lines(b, roles),
        causes=causes,
    )


@dataclass(frozen=True)
class SameOps:
    """Mutations that keep the op sequence (a value, a setting, a seed): the right answer is the
    oracle's first divergence, the very op, with the cause its kind gives (``kinds``: those the
    class can make; ``roles``: the lines it can be on, empty for any); ``IDENTICAL`` where the
    change reaches nothing. Under ``--tolerant`` the same op (``same``) or, for changes that
    only round, ``IDENTICAL`` or ``WITHIN-ROUNDING``. A compiled program (no ops observed) is
    answered by ``roles`` alone: an op there at the first differing step."""

    kinds: frozenset[str]
    roles: tuple[str, ...] = ()
    same: bool = True

    @property
    def needs_ops(self) -> bool:
        return not self.roles

    def answers(self, truth: Truth, a: Script, b: Script) -> Answers:
        if not truth.observed:
            if truth.state_step is None:
                return Answers(_identical(), _identical(rounding=not self.same))
            causes = frozenset().union(*(CAUSES[k] for k in self.kinds))
            bitwise = _at_lines(a, b, self.roles, truth.state_step, causes)
            return Answers(bitwise, bitwise if self.same else _identical(rounding=True))
        if not truth.same_ops:
            raise CatalogueError("the op sequences differ")
        if truth.notes:
            raise CatalogueError(f"the oracle cannot explain: {'; '.join(truth.notes)}")
        source = truth.source
        if source is None:
            return Answers(_identical(), _identical(rounding=not self.same))
        if source.kind not in self.kinds:
            raise CatalogueError(f"the oracle's divergence is {source.describe()}")
        if self.roles and source.line_a not in _lines(a, self.roles):
            raise CatalogueError(f"the oracle's {source.describe()} is not on {self.roles}")
        tolerant = _at_source(source, tolerant=True) if self.same else _identical(rounding=True)
        return Answers(_at_source(source, tolerant=False), tolerant)


@dataclass(frozen=True)
class AtSite:
    """Code changes that change at most how values round (a summation order, a division for a
    multiplication, an identity refactor, a moved or inserted statement): ``IDENTICAL`` where
    the training is bit for bit the same; else an op on the changed lines (``roles``, in each
    run where it has them) at the first differing step. ``--tolerant``: ``IDENTICAL`` or
    ``WITHIN-ROUNDING``."""

    roles: tuple[str, ...]
    needs_ops: bool = False

    def answers(self, truth: Truth, a: Script, b: Script) -> Answers:
        if truth.state_step is None:
            return Answers(_identical(), _identical(rounding=True))
        return Answers(_at_lines(a, b, self.roles, truth.state_step), _identical(rounding=True))


@dataclass(frozen=True)
class ForgottenZeroGrad:
    """``opt.zero_grad()`` left out: step 0 is the same; in step 1 run B's backward adds the new
    gradient to the one kept from step 0, an op run A does not make. Right: step 1, a structure
    cause (``inserted`` or ``replaced``), run B's op on its ``backward()`` line, run A's (if it
    names one) on its own; the same under ``--tolerant``."""

    needs_ops: bool = False

    def answers(self, truth: Truth, a: Script, b: Script) -> Answers:
        if truth.state_step != 1:
            raise CatalogueError(f"the first differing step is {truth.state_step}, not 1")
        expected = Expected(
            DIVERGED,
            "structure at step 1: run B's gradient accumulation on its backward() line",
            step=1,
            lines_a=_lines(a, ("backward",)),
            lines_b=_lines(b, ("backward",)),
            named=frozenset({"b"}),
            causes=frozenset({"inserted", "replaced"}),
        )
        return Answers(expected, expected)


Change = Callable[[Program], tuple[Program, Program]]


def _b(change: Callable[[Program], Program]) -> Change:
    """A mutation of run B alone."""
    return lambda p: (p, change(p))


@dataclass(frozen=True)
class Mutation:
    name: str
    family: str
    rule: Rule
    applies: Callable[[Program], bool]
    change: Change
    devices: tuple[str, ...] = ("cpu", "cuda")  # where its programs can run


def _always(p: Program) -> bool:
    return True


def _other_threads(p: Program) -> int:
    """1 against 2, 2 against 1, and one program in three against 4 (more threads than cores)."""
    return 4 if p.seed % 3 == 0 else 3 - p.threads


def _order(p: Program) -> tuple[int, ...]:
    """The first and the last batch swapped."""
    order = list(p.batch_order)
    order[0], order[-1] = order[-1], order[0]
    return tuple(order)


def _numpy_write(p: Program) -> tuple[Program, Program]:
    """After step 0 run B adds 0.5 to the first weight through NumPy; run A adds 0.0."""
    a = replace(p, numpy_step=0, numpy_delta=0.0)
    return a, replace(a, numpy_delta=0.5)


ARGUMENT = frozenset({"argument"})
OPT_STEP = ("opt_step",)
# fmt: off
MUTATIONS: tuple[Mutation, ...] = (
    Mutation("lr", "hyperparameter", SameOps(ARGUMENT, OPT_STEP), _always,
             _b(lambda p: replace(p, lr=p.lr * 2))),
    Mutation("eps", "hyperparameter", SameOps(ARGUMENT, OPT_STEP), lambda p: p.adaptive,
             _b(lambda p: replace(p, eps=1e-6 if p.eps == 1e-8 else 1e-8))),
    Mutation("betas", "hyperparameter", SameOps(ARGUMENT, OPT_STEP), lambda p: p.adaptive,
             _b(lambda p: replace(p, betas=(0.8, 0.99) if p.betas[0] == 0.9 else (0.9, 0.999)))),
    Mutation("weight_decay", "hyperparameter", SameOps(ARGUMENT, OPT_STEP),
             lambda p: p.weight_decay > 0,
             _b(lambda p: replace(p, weight_decay=p.weight_decay * 5))),
    Mutation("momentum", "hyperparameter", SameOps(ARGUMENT, OPT_STEP),
             lambda p: p.optimizer == "momentum",
             _b(lambda p: replace(p, momentum=0.5 if p.momentum == 0.9 else 0.9))),
    Mutation("gamma", "hyperparameter", SameOps(ARGUMENT, OPT_STEP),
             lambda p: p.scheduler != "none",
             _b(lambda p: replace(p, gamma=0.8 if p.gamma == 0.5 else 0.5))),
    Mutation("clip_norm", "hyperparameter", SameOps(ARGUMENT, ("clip",)),
             lambda p: p.clip is not None, _b(lambda p: replace(p, clip=(p.clip or 0) / 2))),
    Mutation("threads", "rounding", SameOps(frozenset({"origin"}), same=False), _always,
             _b(lambda p: replace(p, threads=_other_threads(p)))),
    Mutation("penalty_order", "rounding", AtSite(("penalty",)), lambda p: p.penalty,
             _b(lambda p: replace(p, penalty_reversed=True))),
    Mutation("accum_scale", "rounding", AtSite(("backward",)), lambda p: p.accum > 1,
             _b(lambda p: replace(p, accum_scale="mul"))),
    Mutation("reorder_slices", "identity", AtSite(("slice_x", "slice_y")), _always,
             _b(lambda p: replace(p, reorder="slices"))),
    Mutation("reorder_item", "identity", AtSite(("item",)), _always,
             _b(lambda p: replace(p, reorder="item"))),
    Mutation("log_loss", "identity", AtSite(("logging",)), _always,
             _b(lambda p: replace(p, logging="loss"))),
    Mutation("log_grad_norm", "identity", AtSite(("logging",)), _always,
             _b(lambda p: replace(p, logging="grad_norm"))),
    Mutation("log_activation", "identity", AtSite(("logging",)), _always,
             _b(lambda p: replace(p, logging="activation"))),
    Mutation("times_one", "identity", AtSite(("times_one",)), _always,
             _b(lambda p: replace(p, times_one=True))),
    Mutation("inplace", "identity", AtSite(("activation",)), lambda p: p.uses_relu,
             _b(lambda p: replace(p, relu_inplace=True))),
    Mutation("reshape", "identity", AtSite(("flatten",)), lambda p: p.family == "cnn",
             _b(lambda p: replace(p, reshape=True))),
    Mutation("shift", "data", SameOps(ARGUMENT, ("slice_x",)), _always,
             _b(lambda p: replace(p, shift=1))),
    Mutation("order", "data", SameOps(ARGUMENT, ("slice_x",)), _always,
             _b(lambda p: replace(p, order=_order(p)))),
    Mutation("numpy_write", "unrecorded write", SameOps(frozenset({"external"})), _always,
             _numpy_write, devices=("cpu",)),  # NumPy reaches CPU tensors only
    Mutation("no_zero_grad", "structure", ForgottenZeroGrad(), _always,
             _b(lambda p: replace(p, zero_grad=False))),
    Mutation("seed", "seed", SameOps(frozenset({"rng"}), ("first_layer",)), _always,
             _b(lambda p: replace(p, init_seed=p.init_seed + 1))),
    Mutation("loop_seed", "seed", SameOps(frozenset({"rng"}), ("dropout",)),
             lambda p: p.dropout > 0, _b(lambda p: replace(p, loop_seed=p.loop_seed + 1))),
    Mutation("linear_swap", "layer swap", AtSite(("swap",)), _always,
             _b(lambda p: replace(p, linear_swap=True))),
)
# fmt: on
BY_NAME = {m.name: m for m in MUTATIONS}


def runnable(mutation: Mutation, *, compile_rate: float = 0.0, device: str = "cpu") -> bool:
    """Whether ``mutation`` applies to some program of a run on ``device`` that compiles a
    ``compile_rate`` share of its programs (with all of them compiled, no class whose right
    answer needs the oracle's ops does)."""
    return device in mutation.devices and not (compile_rate >= 1 and mutation.rule.needs_ops)


def applies(mutation: Mutation, program: Program) -> bool:
    """Whether ``mutation`` makes sense on ``program`` and its right answer can be known."""
    return runnable(
        mutation, compile_rate=float(program.compile), device=program.device
    ) and mutation.applies(program)


@dataclass(frozen=True)
class Pair:
    """Two programs that differ by one mutation; ``seed`` rebuilds it (:func:`make_pair`)."""

    mutation: Mutation
    seed: int
    a: Program
    b: Program

    @property
    def name(self) -> str:
        return f"{self.mutation.name}-{self.seed}"


SEED_STRIDE = 1_000_003  # seeds tried for a mutation that does not apply: seed, seed + STRIDE, …


def make_pair(mutation: str, seed: int, *, compile_rate: float = 0.0, device: str = "cpu") -> Pair:
    """The pair of ``mutation`` on the first program on ``device``, from ``seed`` on in steps
    of :data:`SEED_STRIDE`, that it applies to."""
    chosen = BY_NAME[mutation]
    for attempt in range(1000):
        program = generate(seed + attempt * SEED_STRIDE, compile_rate=compile_rate, device=device)
        if applies(chosen, program):
            a, b = chosen.change(program)
            return Pair(chosen, program.seed, a, b)
    raise ValueError(f"{mutation}: applies to no program from seed {seed}")


def pair_of(index: int, *, compile_rate: float = 0.0, device: str = "cpu") -> Pair:
    """The ``index``-th pair of a run of the fuzzer: the mutations in turn, each on the program
    of seed ``index`` (or the next it applies to), so every class that can run gets its
    share."""
    classes = [m for m in MUTATIONS if runnable(m, compile_rate=compile_rate, device=device)]
    mutation = classes[index % len(classes)]
    return make_pair(mutation.name, index, compile_rate=compile_rate, device=device)
