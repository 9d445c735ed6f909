"""What rounding explains of one op, from what the op computes: the tolerant rule's bounds, by op
family (issue 38 §2). Every fact the rule knows about an op's name is here, once.

An aligned pair of ops whose outputs differ is explained by rounding when each output's relative
distance ``d_out`` is within its bound::

    d_out <= ESTIMATE * kappa * d_in + rho + flips(d_in)

``d_in`` is the largest relative distance of the op's inputs (0 when they are equal), ``kappa``
how much the op may grow a relative difference of its inputs (its normwise condition, read off
the recorded norms and stats of its tensors), ``rho`` the rounding of its own it may add, and
``flips`` what a selection decided by rounded values may move (a ReLU's mask). A family reads
what the record holds of each tensor: its shape, its L2 norm (the sketch's) and its stats (min,
max, absmax); nothing else is stored, so where a family cannot read what it needs (a trace
without stats, an op whose inputs are missing) it says so and the op is judged by the fallback
rule of :mod:`.rule` (``A``, ``R``, ``A_dividing``).

=================  ===============================================  =====================================
family             kappa (condition)                                rho (own rounding)
=================  ===============================================  =====================================
move               1, or the input's norm over the output's         none; a cast rounds once:
                   where it selects a part (a slice)                ``RHO_EXACT`` units of its output
scale              1: its outputs are its inputs times constants    ``RHO_EXACT`` u
elementwise        sum over inputs of ``L_i * ||x_i|| / ||out||``   ``RHO_EXACT`` u of the terms it adds:
                   (``L_i``: the largest partial derivative, from   a sum that cancels rounds at the
                   the inputs' absmax and min: a division by a      scale of its terms, not of its
                   tensor as large as one over its smallest         result
                   magnitude, Adam's update among them)
transcendental     ``L * ||x|| / ||out||``, ``L`` the function's   ``RHO_LIBM`` u: a maths library
                   largest slope on the input's [min, max]          rounds a few ulp, not one
reduction,         ``max(1, T / ||out||)``, ``T`` the norm of the   ``SPREAD * sqrt(K)`` units of the
contraction        terms summed (a sum of rounding noise that       accumulation over ``K`` terms, at
                   cancels to nearly nothing is as far apart as     the scale ``T`` where the result
                   its terms, not as its result)                    cancels, plus the output's rounding
normalizing        the condition its inputs give it: a softmax's    the reductions inside it, at that
                   Lipschitz bound; a norm's centering              condition
                   ``||x|| / ||x - mean||`` from its recorded
                   ``rstd``; Adam's fused step's smallest
                   denominator
=================  ===============================================  =====================================

Reductions and contractions read ``K`` from the recorded shapes and the op's schema (mm/addmm/bmm
inner dimension, sum/mean over the reduced elements, a convolution's input channels times its
kernel size, a norm over its normalized shape) and grow probabilistically, as ``sqrt(K)``:
two runs' roundings are independent and random, so their accumulated difference grows like a
random walk, not like the worst case ``K * u``. Where the runs' operands are rounded before
they are multiplied (TF32, a bfloat16 matmul precision), that rounding (``u`` of the operands)
adds at the scale of the terms.

Estimates, not guarantees: a difference the model does not foresee (a step function crossing a
step, an op outside the table) is named; ``opguard diff --tolerant --noise CONTROL`` then
measures what rounding does in the model (:mod:`.noise`). Torch-free.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from ...store import OpRecord, TensorRecord

# -- the constants, each in one place ------------------------------------------------------------

# The sketches estimate a distance within a factor of about 1.46 (the 90% interval, 14 buckets:
# distance.py); a bound that multiplies one estimate (d_in) to compare it with another (d_out)
# carries both errors. The ratio of two independent estimates is F(14, 14)-distributed in its
# square: it exceeds 4 with probability about 4e-6, once in ~250,000 judged ops.
ESTIMATE = 4.0
# One rounding in each run: an operation that is correctly rounded (IEEE +, -, *, /, sqrt, a
# cast) gives both runs the same result from the same operands, so two runs differ by at most
# one rounding each where they fuse or order its steps differently (an FMA, a vectorized lerp).
RHO_EXACT = 2.0
# A maths library (exp, tanh, erf, pow; glibc, Sleef, CUDA's libdevice) is accurate to about 1-2
# ulp (2-4 u), and two libraries can err in opposite directions: 4 u each.
RHO_LIBM = 8.0
# An accumulation of K terms in another order or blocking: each run's rounding error is a sum of
# K errors of at most u of a partial sum each (standard deviation u * sqrt(K / 3) of the terms'
# scale), the difference of two runs' sqrt(2) times that; SPREAD = 4 standard deviations of it,
# rounded up (sqrt(2 / 3) * 4 = 3.3).
SPREAD = 4.0
# A selection decided by rounded values (ReLU's mask, a max pool's argmax) flips an element where
# the two runs' values straddle the threshold: for values with a density like a Gaussian's near
# it, a fraction of about 0.8 * d of the elements when they differ by d (relative). FLIP_DENSITY
# doubles it; FLIP_SPREAD standard deviations of a Poisson count are allowed beyond it.
FLIP_DENSITY = 2.0
FLIP_SPREAD = 3.0
# Slopes of the activation functions (their largest |f'| over the reals), and of their
# derivatives (|f''|), for the backward forms: gelu' <= 1.13, gelu'' <= 2 phi(0) = 0.80;
# silu' <= 1.10, silu'' <= 0.5; tanh', sigmoid' (1/4), erf' = 2 / sqrt(pi).
GELU_SLOPE, GELU_CURVE = 1.13, 0.80
SILU_SLOPE, SILU_CURVE = 1.10, 0.50
ERF_SLOPE = 2.0 / math.sqrt(math.pi)
FLOAT32_UNIT = 2.0**-24  # float32's unit roundoff: the accumulator of every narrower float
FLOAT64_UNIT = 2.0**-53


# -- what a family reads -------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Units:
    """The unit roundoffs an op's bound is made of, in either run: ``op`` its coarsest
    (:func:`.rounding.op_unit`), ``output`` its outputs' dtype's, ``accumulator`` what it sums in
    (float32 for any narrower float, as CPU and CUDA kernels do), ``operands`` what a recorded
    setting rounds its operands to before multiplying (TF32; 0 where none), ``partials`` the
    rounding of the partial sums of a reduction split over ``T`` threads where a kernel keeps
    them in its 16-bit operands' dtype (``sqrt(T)`` of that dtype's units: a CPU LayerNorm's
    backward under bf16 autocast sums its weight gradient so)."""

    op: float
    output: float
    accumulator: float
    operands: float = 0.0
    partials: float = 0.0  # a split reduction's partial sums kept in 16-bit operands' dtype


@dataclass(frozen=True, slots=True)
class Bound:
    """What rounding explains of one output: ``limit(d_in)``. ``flip_elements``: elements a
    selection decided by rounded values may flip; ``flip_scale``: what one flip moves, relative
    to the output's norm."""

    family: str
    amplification: float
    rounding: float
    flip_elements: int = 0
    flip_scale: float = 0.0

    def limit(self, d_in: float) -> float:
        """The largest ``d_out`` rounding explains from inputs whose distance was estimated
        at ``d_in`` (two estimates compared: :data:`ESTIMATE`)."""
        return self.propagate(ESTIMATE * d_in)

    def propagate(self, d_in: float) -> float:
        """The largest distance this output may have from inputs at most ``d_in`` apart."""
        spread = self.amplification * d_in if d_in else 0.0
        return spread + self.rounding + self.flips(d_in)

    def flips(self, d_in: float) -> float:
        """The part of the bound a selection's flips take: as many elements as inputs ``d_in``
        apart may straddle its threshold, each moving the output by ``flip_scale``."""
        if not (self.flip_elements and d_in):
            return 0.0
        expected = min(FLIP_DENSITY * d_in, 1.0) * self.flip_elements
        return math.sqrt(expected + FLIP_SPREAD * math.sqrt(expected)) * self.flip_scale


class Missing(Exception):
    """A family cannot read what its bound needs (a norm, a stat, an input): the fallback rule
    judges the op."""


# Where a view's norm and stats are read: the entry it was made from that has a sketch, or (with
# ``stats=True``) stats. A base holds the view's values and maybe more: its absmax bounds the
# view's, its norm does, its smallest magnitude is at most the view's, so what a family reads
# from a base bounds the view conservatively.
Base = Callable[..., TensorRecord | None]


class OpView:
    """One op's record as a family reads it: its inputs by slot, its arguments by name, and each
    tensor's numel, norm and stats (a view's from its base). Ops on lists (``_foreach_*``) are
    read one element at a time: ``element`` is the list index of the output judged, and an
    input ``self`` is ``self[element]`` where the op has one.

    Norms are this run's (distances are relative to run A's tensors). Stats span both runs
    where ``partner`` (the other run's view of the aligned op) is given: a slope must hold over
    the whole way from one run's value to the other's, so over both ranges."""

    def __init__(
        self, op: OpRecord, base: Base, element: int | None, partner: OpView | None = None
    ) -> None:
        self.op = op
        self.partner = partner
        self.name = family(op.op)
        self._base = base
        self.element = element
        self._inputs = {t.slot: t for t in op.inputs}
        self._args = dict(op.args)

    def input(self, slot: str) -> TensorRecord | None:
        """Input ``slot`` (this list element's, for an op on lists); None when not recorded."""
        if self.element is not None:
            found = self._inputs.get(f"{slot}[{self.element}]")
            if found is not None:
                return found
        return self._inputs.get(slot)

    def need(self, slot: str) -> TensorRecord:
        found = self.input(slot)
        if found is None:
            raise Missing(f"input {slot}")
        return found

    def floats(self) -> list[TensorRecord]:
        """The floating-point inputs of this element (every input of an op not on lists)."""
        suffix = f"[{self.element}]"
        return [
            t
            for t in self.op.inputs
            if _floating(t)
            and (self.element is None or t.slot.endswith(suffix) or "[" not in t.slot)
        ]

    def scalar(self, *names: str, default: float | None = None) -> float:
        """The first of arguments ``names`` given (this element's, of a list), or a 0-d tensor
        input of that name (its absmax); ``default`` where none is."""
        for name in names:
            value = self._args.get(name)
            if isinstance(value, list) and self.element is not None and value:
                value = value[self.element] if self.element < len(value) else None
            if isinstance(value, (int, float)) and not isinstance(value, bool):
                return float(value)
            tensor = self.input(name)
            if tensor is not None:
                return self.absmax(tensor)
        if default is None:
            raise Missing(f"argument {names[0]}")
        return default

    def arg(self, name: str) -> object:
        return self._args.get(name)

    def norm(self, t: TensorRecord) -> float:
        """``t``'s L2 norm; a view without a sketch of its own has its base's, repeated as
        often as the view repeats it (an expanded view), or all of it (a slice: at most)."""
        read = t if t.sketch is not None else self._read(t)
        if read.sketch is None:
            raise Missing(f"norm of {t.slot}")
        return float(read.sketch.norm) * _bcast(t, read)

    def rms(self, t: TensorRecord) -> float:
        """The root mean square of ``t``'s values (of its base's, for a view)."""
        read = t if t.sketch is not None else self._read(t)
        numel = _numel(read.shape)
        return self.norm(read) / math.sqrt(numel) if numel else 0.0

    def stats(self, t: TensorRecord) -> tuple[float, float, float]:
        """(min, max, absmax) of ``t``'s finite values (its base's, for a view), in both runs
        where the other run's op is known."""
        lo, hi, amax = self._own_stats(t)
        partner = self.partner
        twin = partner._twin(t, self.op) if partner is not None else None
        if partner is None or twin is None:
            return lo, hi, amax
        try:
            other = partner._own_stats(twin)
        except Missing:
            return lo, hi, amax
        return min(lo, other[0]), max(hi, other[1]), max(amax, other[2])

    def _own_stats(self, t: TensorRecord) -> tuple[float, float, float]:
        stats = (t if t.stats is not None else self._read(t, stats=True)).stats
        if stats is None or len(stats) < 4:
            raise Missing(f"stats of {t.slot}")
        return float(stats[0]), float(stats[1]), float(stats[3])

    def _twin(self, t: TensorRecord, op: OpRecord) -> TensorRecord | None:
        """This op's tensor in ``t``'s place in ``op`` (the other run's record of it)."""
        mine = self.op.inputs if any(x is t for x in op.inputs) else self.op.outputs
        return next((x for x in mine if x.slot == t.slot), None)

    def absmax(self, t: TensorRecord) -> float:
        return self.stats(t)[2]

    def smallest(self, t: TensorRecord) -> float:
        """The smallest magnitude of ``t``'s values: 0 where they change sign."""
        lo, hi, _ = self.stats(t)
        return lo if lo > 0 else -hi if hi < 0 else 0.0

    def _read(self, t: TensorRecord, stats: bool = False) -> TensorRecord:
        base = self._base(t, stats=stats)
        if base is None:
            raise Missing(f"{t.slot} (a view whose base was not found)")
        return base


def _floating(t: TensorRecord) -> bool:
    return t.dtype.startswith(("float", "bfloat", "complex"))


def _numel(shape: Iterable[int]) -> int:
    return math.prod(shape)


def _bcast(out: TensorRecord, t: TensorRecord) -> float:
    """How many times each element of ``t`` is repeated in ``out`` (broadcast), square-rooted:
    what ``t``'s norm contributes to the output's."""
    numel = _numel(t.shape)
    return math.sqrt(max(1.0, _numel(out.shape) / numel)) if numel else 1.0


def _ratio(top: float, bottom: float) -> float:
    """``top / bottom``, infinite where ``bottom`` is 0 and ``top`` is not."""
    if bottom > 0:
        return top / bottom
    return 0.0 if top == 0 else math.inf


# -- the families --------------------------------------------------------------------------------

BoundOf = Callable[[OpView, TensorRecord, Units], Bound]


def _move(view: OpView, out: TensorRecord, units: Units) -> Bound:
    """Ops that move values (views, copies, concatenations, gathers, casts): an output holds
    values of its inputs, so it differs by no more than they do, relative to its own norm: the
    inputs' norm over its own where it holds a part of them (a slice of a tensor whose
    difference sits in that part). A cast rounds once: ``RHO_EXACT`` units of its output's dtype
    where a dtype changes (two runs round two nearby values to the same grid)."""
    data = [t for t in view.floats() if not (view.name in OVERWRITING and t.slot == "self")]
    norm = view.norm(out)
    kappa = max([1.0, *(_ratio(view.norm(t), norm) for t in data)])
    dtypes = {t.dtype for t in (*data, out)}
    return Bound("move", kappa, RHO_EXACT * units.output if len(dtypes) > 1 else 0.0)


def _scale(view: OpView, out: TensorRecord, units: Units) -> Bound:
    """Ops whose outputs are their inputs times constants (a loss's backward spreading its
    gradient, an average pool's backward, dropout's scaled mask): a relative difference passes
    through unchanged, and each element rounds once."""
    del view, out
    return Bound("scale", 1.0, RHO_EXACT * units.op)


@dataclass(frozen=True, slots=True)
class Term:
    """An input of an elementwise op: its slot (the first of those names the record holds: an
    op on lists names some differently), the largest partial derivative of the output by it
    (``slope``), and whether it enters as a term of a sum (``added``: the output's rounding is
    then at the scale of the terms, not of the result)."""

    slots: tuple[str, ...]
    slope: Callable[[OpView], float]
    added: bool = False

    def tensor(self, view: OpView) -> TensorRecord | None:
        return next((t for s in self.slots if (t := view.input(s)) is not None), None)


def _one(view: OpView) -> float:
    del view
    return 1.0


def _absmax_of(slot: str, factor: Callable[[OpView], float] = _one) -> Callable[[OpView], float]:
    return lambda v: factor(v) * v.absmax(v.need(slot))


def _alpha(v: OpView) -> float:
    return abs(v.scalar("alpha", default=1.0))


def _value(v: OpView) -> float:
    return abs(v.scalar("value", "scalars", "scalar", default=1.0))


def _over_smallest(
    slot: str, power: int, top: Callable[[OpView], float]
) -> Callable[[OpView], float]:
    """``top / min|slot| ** power``: a division's slope, infinite where the divisor's values
    reach 0 (any difference of its inputs may then become any difference of its output)."""
    return lambda v: _ratio(top(v), v.smallest(v.need(slot)) ** power)


def _lerp_weight(v: OpView) -> float:
    return v.scalar("weight", "weights", default=0.5)


def _other_factor(v: OpView) -> float:
    """``mul``'s slope by ``self``: the other factor's absmax, a tensor's or a scalar's."""
    other = v.input("other")
    return v.absmax(other) if other is not None else abs(v.scalar("other", "scalar", "scalars"))


def _divisor(v: OpView) -> float:
    """``div``'s slope by ``self``: one over the divisor's smallest magnitude."""
    if v.input("other") is None:
        return _ratio(1.0, abs(v.scalar("other", "scalar", "scalars")))
    return _over_smallest("other", 1, _one)(v)


def _times(other: str) -> Callable[[OpView], float]:
    """addcmul's slope by one factor: its value times the ``other`` factor's absmax."""
    return lambda v: _value(v) * v.absmax(v.need(other))


def _terms(
    *slots: str, slope: Callable[[OpView], float] = _one, added: bool = False
) -> tuple[Term, ...]:
    """Inputs ``slots``, each of slope ``slope``."""
    return tuple(Term((slot,), slope, added) for slot in slots)


# Each elementwise op (its family name): its inputs' terms. A Scalar overload's scalar operand is
# an argument (a constant), not a term. Ops on lists (_foreach_*) use their element op's terms.
ELEMENTWISE: dict[str, tuple[Term, ...]] = {
    "add": (Term(("self",), _one, True), Term(("other",), _alpha, True)),
    "sub": (Term(("self",), _one, True), Term(("other",), _alpha, True)),
    "rsub": (Term(("self",), _alpha, True), Term(("other",), _one, True)),
    "mul": (Term(("self",), _other_factor), Term(("other",), _absmax_of("self"))),
    "div": (
        Term(("self",), _divisor),
        Term(("other",), _over_smallest("other", 2, _absmax_of("self"))),
    ),
    "reciprocal": (Term(("self",), _over_smallest("self", 2, _one)),),
    "addcmul": (
        Term(("self",), _one, True),
        Term(("tensor1",), _times("tensor2"), True),
        Term(("tensor2",), _times("tensor1"), True),
    ),
    "addcdiv": (
        Term(("self",), _one, True),
        Term(("tensor1",), _over_smallest("tensor2", 1, _value), True),
        Term(("tensor2",), _over_smallest("tensor2", 2, _times("tensor1")), True),
    ),
    "lerp": (
        Term(("self",), lambda v: abs(1 - _lerp_weight(v)), True),
        Term(("end", "tensors1"), lambda v: abs(_lerp_weight(v)), True),
    ),
    "where": _terms("self", "other"),
    "masked_fill": _terms("self", "value"),
    "maximum": _terms("self", "other"),
    "minimum": _terms("self", "other"),
    **{op: _terms("self") for op in ("neg", "abs", "relu", "clamp", "clamp_min", "clamp_max")},
    "hardtanh": _terms("self"),
    "leaky_relu": _terms(
        "self", slope=lambda v: max(1.0, abs(v.scalar("negative_slope", default=0.01)))
    ),
    "threshold_backward": _terms("grad_output"),
    "hardtanh_backward": _terms("grad_output"),
    "square": _terms("self", slope=_absmax_of("self", lambda v: 2.0)),
}
# Elementwise ops whose output is chosen by comparing a rounded input with a threshold: where the
# runs' values straddle it, an element flips between the two choices (ReLU's backward mask).
THRESHOLDS = {"threshold_backward": "grad_output", "hardtanh_backward": "grad_output"}


def _elementwise(view: OpView, out: TensorRecord, units: Units) -> Bound:
    """Elementwise arithmetic (``ELEMENTWISE``): an output element moves by at most the sum of
    each input's difference times the largest partial derivative by it, read from the other
    inputs' recorded absmax, and for a division from the divisor's smallest magnitude (Adam's
    update divides by ``sqrt(v) + eps``, as large as one over its smallest element: the
    amplification of its first steps, where small gradients are divided by their own
    magnitude). Relative to the output's norm: ``sum L_i * ||x_i|| / ||out||``, which holds
    cancellation (a sum whose result is much smaller than its terms). Each run rounds the result
    of correctly rounded operations once, at the scale of the terms it adds."""
    norm = view.norm(out)
    kappa, added = 0.0, 0.0
    for term in ELEMENTWISE[view.name]:
        tensor = term.tensor(view)
        if tensor is None or not _floating(tensor):
            continue
        size = view.norm(tensor) * _bcast(out, tensor)
        slope = term.slope(view)
        kappa += _ratio(slope * size, norm)
        if term.added:
            added += slope * size
    rounding = RHO_EXACT * units.op * max(1.0, _ratio(added, norm))
    threshold = THRESHOLDS.get(view.name)
    if threshold is None:
        return Bound("elementwise", kappa, rounding)
    scale = _ratio(view.absmax(view.need(threshold)), norm)
    return Bound("elementwise", kappa, rounding, _numel(out.shape), scale)


# Each transcendental function: the largest |f'| on its input's [min, max] (from the stats),
# given (min, max, absmax). A function whose slope is unbounded near a value its input reaches
# (log at 0, rsqrt at 0) gets an infinite slope there.
TRANSCENDENTAL: dict[str, Callable[[float, float, float], float]] = {
    "tanh": lambda lo, hi, amax: 1.0,
    "sigmoid": lambda lo, hi, amax: 0.25,
    "erf": lambda lo, hi, amax: ERF_SLOPE,
    "gelu": lambda lo, hi, amax: GELU_SLOPE,
    "silu": lambda lo, hi, amax: SILU_SLOPE,
    "sin": lambda lo, hi, amax: 1.0,
    "cos": lambda lo, hi, amax: 1.0,
    "exp": lambda lo, hi, amax: math.exp(min(hi, 700.0)),
    "expm1": lambda lo, hi, amax: math.exp(min(hi, 700.0)),
    "log": lambda lo, hi, amax: _ratio(1.0, lo) if lo > 0 else math.inf,
    "log1p": lambda lo, hi, amax: _ratio(1.0, 1.0 + lo) if lo > -1 else math.inf,
    "sqrt": lambda lo, hi, amax: _ratio(0.5, math.sqrt(lo)) if lo > 0 else math.inf,
    "rsqrt": lambda lo, hi, amax: _ratio(0.5, lo**1.5) if lo > 0 else math.inf,
}


def _transcendental(view: OpView, out: TensorRecord, units: Units) -> Bound:
    """Functions a maths library evaluates (``TRANSCENDENTAL``, ``pow``): ``||f(x) - f(y)|| <=
    L ||x - y||`` with ``L`` the largest slope on the input's recorded range, relative to the
    output's norm. A library rounds within a few ulp: ``RHO_LIBM`` u."""
    x = view.need("self")
    try:
        lo, hi, amax = view.stats(x)
    except Missing:  # a slope that needs no stats (tanh's) is still known
        lo = hi = amax = math.nan
    if view.name == "pow":
        p = view.scalar("exponent")
        if p >= 1 or float(p).is_integer():
            slope = (
                abs(p) * amax ** (p - 1)
                if p >= 1
                else abs(p) * _ratio(1.0, view.smallest(x) ** (1 - p))
            )
        else:
            slope = abs(p) * lo ** (p - 1) if lo > 0 else math.inf
    else:
        slope = TRANSCENDENTAL[view.name](lo, hi, amax)
    if math.isnan(slope):
        raise Missing(f"stats of {x.slot}")
    kappa = _ratio(slope * view.norm(x), view.norm(out))
    return Bound("transcendental", kappa, RHO_LIBM * units.op)


# The backward forms of activation functions: grad * f'(x) (or of the output y): the slopes by
# the gradient (|f'|) and by x or y (|grad| * |f''|).
ACTIVATION_BACKWARD: dict[str, tuple[str, float, float]] = {
    "gelu_backward": ("self", GELU_SLOPE, GELU_CURVE),
    "silu_backward": ("self", SILU_SLOPE, SILU_CURVE),
    "tanh_backward": ("output", 1.0, 2.0),  # 1 - y^2; its slope by y is 2|y| <= 2
    "sigmoid_backward": ("output", 0.25, 1.0),  # y (1 - y); its slope by y is |1 - 2y| <= 1
}


def _activation_backward(view: OpView, out: TensorRecord, units: Units) -> Bound:
    """An activation's backward, ``grad * f'(x)``: by the gradient as ``f'`` is largest, by
    ``x`` (or the forward output) as ``|grad| * |f''|`` is; a library's rounding."""
    slot, slope, curve = ACTIVATION_BACKWARD[view.name]
    grad, x = view.need("grad_output"), view.need(slot)
    norm = view.norm(out)
    kappa = _ratio(slope * view.norm(grad), norm) + _ratio(
        curve * view.absmax(grad) * view.norm(x), norm
    )
    return Bound("transcendental", kappa, RHO_LIBM * units.op)


def _summing(units: Units, *lengths: float) -> float:
    """The rounding of sums of ``lengths`` terms each, relative to their terms' scale: the
    accumulations' random walks, and the partial sums of a split reduction."""
    walks = sum(math.sqrt(max(k, 1.0)) for k in lengths)
    return SPREAD * (walks * units.accumulator + units.partials)


def _accumulated(units: Units, k: float, scale: float) -> float:
    """The rounding of sums of ``k`` terms whose norm is ``scale`` times the result's
    (:func:`_summing`), and the operands' rounding (TF32) at the terms' scale; plus one
    rounding of the result to its dtype in each run."""
    return (
        _summing(units, k) * max(1.0, scale)
        + SPREAD * units.operands * scale
        + RHO_EXACT * units.output
    )


def _summed(family: str, units: Units, k: float, terms: float, norm: float) -> Bound:
    """A sum of ``k`` terms per output, the terms' norm ``terms``: relative to the output's,
    a random difference of its terms becomes a difference of about their norm (and of the
    output where the terms add up: a difference proportional to them)."""
    scale = _ratio(terms, norm)
    return Bound(family, max(1.0, scale), _accumulated(units, k, scale))


def _reduction(view: OpView, out: TensorRecord, units: Units) -> Bound:
    """Sums, means and norms over ``K = numel(in) / numel(out)`` elements (a pooling's
    windows, a loss's batch, an embedding gradient's repeated rows): the terms are the input
    (divided by ``K`` for a mean); a norm's squares add without cancelling."""
    x = view.floats()[0] if view.name not in GRADIENT_FIRST else view.need("grad_output")
    k = _numel(x.shape) / max(_numel(out.shape), 1)
    if view.name == "nll_loss_forward":  # the picked log-probabilities: one per target
        k = max(_numel(x.shape[:-1]) if len(x.shape) > 1 else 1, 1)
    terms = view.norm(x) / (k if view.name in MEANS or _mean_reduced(view) else 1.0)
    return _summed("reduction", units, k, terms, view.norm(out))


def _mean_reduced(view: OpView) -> bool:
    """A loss averaged over its batch (``reduction=1``, mean)."""
    return view.name in ("nll_loss_forward", "mse_loss") and view.arg("reduction") == 1


def _contraction(view: OpView, out: TensorRecord, units: Units) -> Bound:
    """Matmuls and convolutions: each output sums ``K`` products (``CONTRACTIONS``). The terms'
    norm is estimated from the factors' root mean squares, ``sqrt(numel(out) * K) * rms(a) *
    rms(b)``: the norm of all the products when each output sums ``K`` of typical size (for a
    bias gradient, a sum of ``grad_output``: its norm). A bias added (``addmm``) is a term too."""
    first, second, k = CONTRACTIONS[view.name](view, out)
    terms = math.sqrt(_numel(out.shape) * k) * view.rms(first)
    terms *= view.rms(second) if second is not None else 1.0
    bound = _summed("contraction", units, k, terms, view.norm(out))
    bias = view.input("self") if view.name in BIASED else view.input("bias")
    if bias is None or bias in (first, second) or not _floating(bias):
        return bound
    beta = abs(view.scalar("beta", default=1.0))
    added = beta * view.norm(bias) * _bcast(out, bias)
    norm = view.norm(out)
    return Bound(
        "contraction",
        bound.amplification + _ratio(added, norm),
        bound.rounding + RHO_EXACT * units.accumulator * _ratio(added, norm),
    )


Factors = tuple[TensorRecord, TensorRecord | None, float]


def _matmul(first: str, second: str) -> Callable[[OpView, TensorRecord], Factors]:
    """``first @ second``: ``K`` is ``first``'s last dimension."""

    def factors(view: OpView, out: TensorRecord) -> Factors:
        a, b = view.need(first), view.need(second)
        return a, b, float(a.shape[-1]) if a.shape else 1.0

    return factors


def _convolution(view: OpView, out: TensorRecord) -> Factors:
    """A convolution's output sums input channels (of its group) times the kernel."""
    x, w = view.need("input"), view.need("weight")
    out_channels = (
        w.shape[1] * int(view.scalar("groups", default=1)) if view.arg("transposed") else w.shape[0]
    )
    return x, w, _numel(w.shape) / max(out_channels, 1)


def _convolution_backward(view: OpView, out: TensorRecord) -> Factors:
    """Outputs 0, 1, 2: the gradients of the input (sums over the output channels times the
    kernel), of the weight and of the bias (sums over the batch and the output positions)."""
    grad, w = view.need("grad_output"), view.need("weight")
    positions = _numel(grad.shape) / max(grad.shape[1], 1) if len(grad.shape) > 1 else 1.0
    if out.slot == "0":
        groups = int(view.scalar("groups", default=1))
        return grad, w, _numel(w.shape) / max(w.shape[1] * groups, 1)
    return grad, view.need("input") if out.slot == "1" else None, positions


def _attention(view: OpView, out: TensorRecord) -> Factors:
    """Scaled dot-product attention as the contraction it ends with: softmax weights (each
    row summing to 1) times the values, over the keys' length; its own softmax's condition is
    added by :func:`_attention_bound`."""
    q, v = view.need("query"), view.need("value")
    return q, v, float(v.shape[-2]) if len(v.shape) > 1 else 1.0


CONTRACTIONS: dict[str, Callable[[OpView, TensorRecord], Factors]] = {
    "mm": _matmul("self", "mat2"),
    "bmm": _matmul("self", "mat2"),
    "matmul": _matmul("self", "other"),
    "dot": _matmul("self", "tensor"),
    "vdot": _matmul("self", "other"),
    "mv": _matmul("self", "vec"),
    "addmm": _matmul("mat1", "mat2"),
    "addmv": _matmul("mat", "vec"),
    "baddbmm": _matmul("batch1", "batch2"),
    "addbmm": _matmul("batch1", "batch2"),
    "_addmm_activation": _matmul("mat1", "mat2"),
    "linear": lambda view, out: (
        view.need("input"),
        view.need("weight"),
        float(view.need("input").shape[-1]),
    ),
    "convolution": _convolution,
    "_convolution": _convolution,
    "cudnn_convolution": _convolution,
    "mkldnn_convolution": _convolution,
    "convolution_backward": _convolution_backward,
}
BIASED = frozenset({"addmm", "addmv", "baddbmm", "addbmm", "_addmm_activation"})  # bias: self


def _attention_bound(view: OpView, out: TensorRecord, units: Units) -> Bound:
    """Scaled dot-product attention (flash, memory-efficient, math kernels alike): the logits
    ``s * q.k`` over the head dimension ``E``, their softmax, and the weighted sum of the values
    over the keys. A relative difference ``d`` of q or k moves a logit by up to ``d * L`` with
    ``L = s * E * absmax(q) * absmax(k)``, which the softmax passes on at most halved; the values
    enter linearly. Rounding: both accumulations and the exponential, the logits' rounding
    multiplied by their size ``L``. Its backward is bounded alike, at the scale of the output
    gradient it spreads (``terms``)."""
    q, k = view.need("query"), view.need("key")
    head = float(q.shape[-1]) if q.shape else 1.0
    keys = float(k.shape[-2]) if len(k.shape) > 1 else 1.0
    scale = view.scalar("scale", default=1.0 / math.sqrt(head))
    logits = abs(scale) * head * view.absmax(q) * view.absmax(k)
    grad = view.input("grad_out")
    norm = view.norm(out)
    if grad is None:
        terms = math.sqrt(_numel(out.shape)) * view.rms(view.need("value"))
    else:
        terms = (
            math.sqrt(_numel(out.shape) * keys)
            * view.rms(grad)
            * max(view.rms(view.need("value")), view.rms(q), view.rms(k))
        )
    cancel = max(1.0, _ratio(terms, norm))
    kappa = (2.0 + logits) * cancel
    rounding = (
        _summing(units, head, keys) * cancel
        + (RHO_LIBM + logits) * units.op * cancel
        + RHO_EXACT * units.output
    )
    return Bound("normalizing", kappa, rounding)


def _softmax(view: OpView, out: TensorRecord, units: Units) -> Bound:
    """A softmax's Jacobian ``diag(s) - s s^T`` has norm at most 1/2: ``||ds|| <= ||dx|| / 2``.
    A log-softmax subtracts the log-sum-exp from every element: at most twice the input's
    difference, at the scale of input and output added. Both round an exponential, a sum over
    the reduced dimension ``K`` and a division or a log."""
    x = view.need("self")
    dim = int(view.scalar("dim", default=-1))
    k = float(x.shape[dim]) if x.shape else 1.0
    norm_x, norm = view.norm(x), view.norm(out)
    if view.name == "_log_softmax":
        kappa = 2.0 * _ratio(norm_x, norm)
        scale = _ratio(norm_x + norm, norm)
    else:
        kappa = 0.5 * _ratio(norm_x, norm)
        scale = max(1.0, kappa)
    rounding = (_summing(units, k) + RHO_LIBM * units.op) * max(1.0, scale)
    return Bound("normalizing", kappa, rounding + RHO_EXACT * units.output)


def _softmax_backward(view: OpView, out: TensorRecord, units: Units) -> Bound:
    """``s * (g - sum(g * s))`` (softmax) and ``g - exp(y) * sum(g)`` (log-softmax): a
    projection that cancels, bounded by its terms (``|s| |g|`` and ``|g|``) over the result,
    with a sum over the reduced dimension."""
    grad, y = view.need("grad_output"), view.need("output")
    dim = int(view.scalar("dim", default=-1))
    k = float(grad.shape[dim]) if grad.shape else 1.0
    norm = view.norm(out)
    if view.name == "_softmax_backward_data":
        terms = view.absmax(y) * view.norm(grad) + view.absmax(grad) * view.norm(y)
    else:
        terms = (1.0 + math.sqrt(k)) * view.norm(grad)
    scale = _ratio(terms, norm)
    return Bound("normalizing", 2.0 * scale, _accumulated(units, k, scale))


# Each normalization: where its record holds the reciprocal standard deviations it saved (an
# output of the forward, an input of the backward), one per normalized group.
NORMALIZATIONS: dict[str, str] = {
    "native_layer_norm": "2",
    "native_layer_norm_backward": "rstd",
    "native_batch_norm": "2",
    "_native_batch_norm_legit": "2",
    "native_batch_norm_backward": "save_invstd",
}


def _normalization(view: OpView, out: TensorRecord, units: Units) -> Bound:
    """Layer and batch norms, forward and backward. The normalized values ``(x - mean) * rstd``
    react to a difference of ``x`` as much as the mean cancels: ``cond = ||x|| / ||x - mean||``,
    bounded from the recorded ``rstd``'s largest value (each row's ``||x - mean||`` is at least
    ``sqrt(D) / max(rstd)``); the affine weight multiplies it, the bias adds. Each normalized
    group of ``D`` values is summed twice (mean, variance). The backward's weight and bias
    gradients are sums over the rows (of ``g * xhat``, of ``g``); its input gradient a
    projection that cancels, at the scale of ``g * w * rstd``."""
    saved = NORMALIZATIONS[view.name]
    backward = view.name.endswith("_backward")
    x = view.need("input")
    rstd = view.need(saved) if backward else _output(view.op, saved)
    groups = max(_numel(rstd.shape), 1)
    d = _numel(x.shape) / groups
    cond = max(1.0, _ratio(view.norm(x) * view.stats(rstd)[1], math.sqrt(_numel(x.shape))))
    weight, bias = view.input("weight"), view.input("bias")
    w_max = view.absmax(weight) if weight is not None else 1.0
    norm = view.norm(out)
    if not backward:
        if out.slot != "0":  # mean, rstd: the statistics themselves
            return Bound("normalizing", 2.0 * cond, _accumulated(units, d, cond))
        normalized = w_max * math.sqrt(_numel(x.shape))
        affine = sum(view.norm(t) * _bcast(out, t) for t in (weight, bias) if t is not None)
        kappa = _ratio(2.0 * cond * normalized + affine, norm)
        rounding = _accumulated(units, d, cond) * _ratio(
            normalized, norm
        ) + RHO_EXACT * units.op * _ratio(affine, norm)
        return Bound("normalizing", kappa, rounding)
    grad = view.need("grad_out")
    if out.slot == "0":
        terms = view.norm(grad) * w_max * view.stats(rstd)[1]
        scale = _ratio(terms, norm)
        return Bound("normalizing", 3.0 * scale * (1.0 + 2.0 * cond), _accumulated(units, d, scale))
    rows = _numel(x.shape) / max(_numel(out.shape), 1)
    scale = _ratio(view.norm(grad), norm)
    bound = _summed("normalizing", units, rows, view.norm(grad), norm)
    return Bound(
        "normalizing", bound.amplification * (1.0 + 2.0 * cond), _accumulated(units, rows, scale)
    )


def _output(op: OpRecord, slot: str) -> TensorRecord:
    for t in op.outputs:
        if t.slot == slot:
            return t
    raise Missing(f"output {slot}")


def _fused_adam(view: OpView, out: TensorRecord, units: Units) -> Bound:
    """A fused Adam or AdamW step (one op for every parameter): its moments are sums (``m' =
    b1 m + (1 - b1) g``, ``v' = b2 v + (1 - b2) g^2``); the parameter moves by ``lr * m_hat /
    (sqrt(v_hat) + eps)``, which divides by the smallest denominator the updated second moment
    allows (``sqrt(min v') + eps``, the bias corrections at most multiplying it by
    ``1 / (1 - b1)``): as large as ``lr / ((1 - b1) (sqrt(min v') + eps))`` by the gradient and
    the first moment, twice that for the path through ``v``."""
    grad, m, v = view.need("grads"), view.need("exp_avgs"), view.need("exp_avg_sqs")
    b1, b2 = view.scalar("beta1"), view.scalar("beta2")
    norm = view.norm(out)
    size_g = view.norm(grad)
    if out.slot.startswith("grads"):  # handed back as they came (unscaled, not maximized)
        return Bound("move", max(1.0, _ratio(size_g, norm)), 0.0)
    if out.slot.startswith("exp_avgs"):
        kappa = _ratio(b1 * view.norm(m) + (1 - b1) * size_g, norm)
        return Bound("normalizing", kappa, RHO_EXACT * units.op * max(1.0, kappa))
    if out.slot.startswith("exp_avg_sqs"):
        kappa = _ratio(b2 * view.norm(v) + 2 * (1 - b2) * view.absmax(grad) * size_g, norm)
        return Bound("normalizing", kappa, RHO_EXACT * units.op * max(1.0, kappa))
    v_out = _output(view.op, f"exp_avg_sqs[{view.element}]") if view.element is not None else v
    lr, eps = abs(view.scalar("lr")), view.scalar("eps")
    slope = 2.0 * lr / ((1 - b1) * (math.sqrt(max(view.stats(v_out)[0], 0.0)) + eps))
    p = view.need("self")
    kappa = _ratio(view.norm(p) + slope * (size_g + view.norm(m)), norm)
    return Bound("normalizing", kappa, (RHO_EXACT + RHO_LIBM) * units.op * max(1.0, kappa))


# -- the table -----------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class Family:
    """One family: its name, the ops in it (family names of ops: :func:`family`), and its
    bound (whose docstring says why)."""

    name: str
    ops: frozenset[str]
    bound: BoundOf


# Ops that compute nothing (overload, ``aten::`` and a trailing ``_`` left out): each output
# holds values of its inputs, moved or repeated (a view, a copy, a concatenation), so it rounds
# nothing and cannot make a difference of its own; where an output differs, an input does.
MOVING_OPS = frozenset(
    {"view", "_unsafe_view", "reshape", "_reshape_alias", "alias", "detach", "lift_fresh"}
    | {"t", "transpose", "permute", "swapaxes", "expand", "unsqueeze", "squeeze"}
    | {"flatten", "unflatten", "slice", "select", "narrow", "unbind", "split", "chunk"}
    | {"split_with_sizes", "as_strided", "clone", "contiguous", "copy", "cat", "stack"}
)
# Moving ops whose outputs hold only a part of their input (the others hold every value).
SELECTING_OPS = frozenset(
    {"slice", "select", "narrow", "unbind", "split", "split_with_sizes", "chunk", "as_strided"}
)
# Ops that only place, select or convert values: their outputs differ as their inputs do.
PLACING_OPS = frozenset(
    {"_to_copy", "to", "_local_scalar_dense", "embedding", "index_select", "gather", "index"}
    | {"_unsafe_index", "take", "flip", "roll", "repeat", "tile", "constant_pad_nd", "pad"}
    | {"max_pool2d_with_indices", "max_pool1d", "max_pool2d", "amax", "amin", "max", "min"}
    | {"select_backward", "slice_backward", "fill", "tril", "triu", "masked_select"}
    | {"zero", "zeros_like", "ones_like", "full_like", "diagonal"}
)
# In-place ops that overwrite ``self`` without reading its values.
OVERWRITING = frozenset({"copy", "fill", "zero"})
SCALING_OPS = frozenset(
    {"nll_loss_backward", "_adaptive_avg_pool2d_backward", "avg_pool2d_backward"}
    | {"native_dropout_backward", "max_pool2d_with_indices_backward"}
)
REDUCTION_OPS = frozenset(
    {"sum", "mean", "nansum", "linalg_vector_norm", "norm", "logsumexp"}
    | {"nll_loss_forward", "_adaptive_avg_pool2d", "avg_pool2d", "embedding_dense_backward"}
    | {"mse_loss"}
)
MEANS = frozenset({"mean", "_adaptive_avg_pool2d", "avg_pool2d"})
GRADIENT_FIRST = frozenset({"embedding_dense_backward"})  # reduces its grad_output
ATTENTION_OPS = frozenset(
    {"_scaled_dot_product_flash_attention", "_scaled_dot_product_flash_attention_for_cpu"}
    | {"_scaled_dot_product_efficient_attention", "_scaled_dot_product_cudnn_attention"}
    | {"scaled_dot_product_attention", "_scaled_dot_product_attention_math"}
    | {"_scaled_dot_product_flash_attention_backward"}
    | {"_scaled_dot_product_flash_attention_for_cpu_backward"}
    | {"_scaled_dot_product_efficient_attention_backward"}
    | {"_scaled_dot_product_cudnn_attention_backward"}
)

FAMILIES: tuple[Family, ...] = (
    Family("move", MOVING_OPS | PLACING_OPS, _move),
    Family("scale", SCALING_OPS, _scale),
    Family("elementwise", frozenset(ELEMENTWISE), _elementwise),
    Family("transcendental", frozenset(TRANSCENDENTAL) | {"pow"}, _transcendental),
    Family("transcendental", frozenset(ACTIVATION_BACKWARD), _activation_backward),
    Family("reduction", REDUCTION_OPS, _reduction),
    Family("contraction", frozenset(CONTRACTIONS), _contraction),
    Family("normalizing", ATTENTION_OPS, _attention_bound),
    Family("normalizing", frozenset({"_softmax", "_safe_softmax", "_log_softmax"}), _softmax),
    Family(
        "normalizing",
        frozenset({"_softmax_backward_data", "_log_softmax_backward_data"}),
        _softmax_backward,
    ),
    Family("normalizing", frozenset(NORMALIZATIONS), _normalization),
    Family("normalizing", frozenset({"_fused_adam", "_fused_adamw"}), _fused_adam),
)
_BY_OP: dict[str, Family] = {op: f for f in FAMILIES for op in f.ops}
# The families whose results a different implementation rounds differently (a library's
# function, a sum in another order): a run that perturbs rounding (``opguard record
# --perturb-rounding``) moves their results; the correctly rounded ones it leaves alone.
IMPLEMENTATION_ROUNDED = frozenset({"transcendental", "reduction", "contraction", "normalizing"})

# Ops whose float32 kernels use TF32 when allowed: cuBLAS matmuls and the attention kernels built
# on them; cuDNN convolutions.
CONV_OPS = frozenset(
    {"convolution", "_convolution", "convolution_backward", "cudnn_convolution"}
    | {"cudnn_convolution_transpose", "conv1d", "conv2d", "conv3d", "mkldnn_convolution"}
)
MATMUL_OPS = (frozenset(CONTRACTIONS) - CONV_OPS) | ATTENTION_OPS | {"_scaled_mm"}
# Ops that divide by a tensor: the fallback rule allows them A_dividing (rule.py) where their
# divisor's smallest magnitude is not recorded.
DIVIDING_OPS = frozenset({"div", "addcdiv", "reciprocal", "_fused_adam", "_fused_adamw"})
DIVIDING_OPS |= frozenset({"_fused_adagrad"})


def base_name(op: str) -> str:
    """``mm`` of ``aten::mm.default``."""
    return op.rpartition("::")[2].partition(".")[0]


def family(op: str) -> str:
    """What the op-name sets above are keyed by: ``copy`` of ``aten::copy_.default`` (an
    in-place op rounds and moves as its out-of-place form does), ``addcdiv`` of
    ``aten::_foreach_addcdiv_.ScalarList`` (an op on lists computes its element op on each)."""
    name = base_name(op).removesuffix("_")
    element = name.removeprefix("_foreach_")
    return element if element != name and element in _BY_OP else name


def family_of(op: str) -> str | None:
    """The family op ``op`` belongs to; None for an op outside the table."""
    found = _BY_OP.get(family(op))
    return found.name if found is not None else None


def rounds_by_implementation(op: str) -> bool:
    """Whether another implementation of ``op`` rounds its results differently (a maths
    library, a sum in another order), as a run that perturbs rounding pretends."""
    return family_of(op) in IMPLEMENTATION_ROUNDED


def moves(op: OpRecord) -> bool:
    """Whether ``op`` only moves values: a moving op whose tensors are all of one dtype (a copy
    into another dtype rounds)."""
    tensors = (*op.inputs, *op.outputs)
    return family(op.op) in MOVING_OPS and len({t.dtype for t in tensors}) == 1


def keeps_every_value(op: OpRecord) -> bool:
    """Whether ``op`` only moves values and its outputs hold every value of its inputs, so
    that an input differs by no more than the outputs do (a ``stack``, a transpose)."""
    return moves(op) and family(op.op) not in SELECTING_OPS


def data_input(op: OpRecord) -> int | None:
    """The input whose values the outputs of moving op ``op`` hold (``copy_``'s source, else
    the first); None where they hold several inputs' (``cat``, ``stack``)."""
    name = family(op.op)
    if name in ("cat", "stack"):
        return None
    return 1 if name == "copy" else 0


def divides(op: str) -> bool:
    """Whether op ``op`` (``aten::addcdiv_.default``) divides by a tensor."""
    return family(op) in DIVIDING_OPS


def element_of(op: str, slot: str) -> int | None:
    """The list index of an output of an op on lists: ``self[3]`` (written in place) or ``3``
    (an ``_foreach_*`` op's new list); None for an op on tensors."""
    _, bracket, rest = slot.partition("[")
    if bracket and rest.endswith("]") and rest[:-1].isdigit():
        return int(rest[:-1])
    return int(slot) if base_name(op).startswith("_foreach_") and slot.isdigit() else None


def bound(
    op: OpRecord,
    out: TensorRecord,
    units: Units,
    base: Base,
    other: tuple[OpRecord, Base] | None = None,
) -> Bound | None:
    """The bound of output ``out`` of ``op`` (read from this run's record of it, and the
    other run's of the aligned op, ``other``, with its bases); None where the op is outside
    the table or its family cannot read what it needs (the fallback rule then judges it)."""
    found = _BY_OP.get(family(op.op))
    if found is None:
        return None
    element = element_of(op.op, out.slot)
    partner = OpView(other[0], other[1], element) if other is not None else None
    view = OpView(op, base, element, partner)
    try:
        return found.bound(view, out, units)
    except (Missing, ZeroDivisionError, OverflowError, ValueError, IndexError, TypeError):
        return None
