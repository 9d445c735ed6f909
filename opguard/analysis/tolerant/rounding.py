"""The rounding an op may do: its unit roundoff ``u``, the relative error of one rounding at the
precision it computes in, which the tolerant diff's budget is a multiple of.

``u`` is the coarsest of:

- the unit roundoff of every floating-point tensor the op reads or writes, in either run
  (:data:`UNIT_ROUNDOFF`): an aligned op that runs in bfloat16 under autocast in one run and in
  float32 in the other rounds like bfloat16;
- the precision its kernels compute in where a recorded setting makes it coarser than its
  tensors' dtype (:func:`compute_unit`): TF32 (10 mantissa bits, ``2**-11``) in float32 matmuls
  on CUDA when either run allowed it (``cuda_matmul_tf32``, or ``float32_matmul_precision``
  ``high``; ``medium`` allows bfloat16, ``2**-8``), and in cuDNN convolutions (``cudnn_tf32``,
  PyTorch's default). The reduced-precision reduction flags of float16 and bfloat16 matmuls
  change where partial sums round, not the dtype they round to: ``u`` stays that dtype's.

Torch-free: it reads dtype names and the recorded environment (:mod:`opguard.store.environment`).
"""

from __future__ import annotations

from collections.abc import Iterable

from ...store import OpRecord
from ...store.environment import Environment

# Unit roundoff (half the distance from 1 to the next number) of each floating-point dtype as
# traces name them: 2**-p for p significand bits (the implicit one included).
UNIT_ROUNDOFF: dict[str, float] = {
    "float64": 2.0**-53,
    "complex128": 2.0**-53,
    "float32": 2.0**-24,
    "complex64": 2.0**-24,
    "float16": 2.0**-11,
    "complex32": 2.0**-11,
    "bfloat16": 2.0**-8,
    "float8_e4m3fn": 2.0**-4,
    "float8_e4m3fnuz": 2.0**-4,
    "float8_e5m2": 2.0**-3,
    "float8_e5m2fnuz": 2.0**-3,
    "float8_e8m0fnu": 2.0**-1,  # powers of two only: a value rounds to within a factor of two
}
TF32 = 2.0**-11
BF16 = UNIT_ROUNDOFF["bfloat16"]

# Ops whose float32 kernels use TF32 when allowed (overload and ``aten::`` left out): cuBLAS
# matmuls and the attention kernels built on them; cuDNN convolutions.
MATMUL_OPS = frozenset(
    {"mm", "addmm", "bmm", "baddbmm", "matmul", "linear", "addmv", "mv", "addbmm", "dot"}
    | {"_scaled_mm", "_addmm_activation", "scaled_dot_product_attention"}
    | {"_scaled_dot_product_efficient_attention", "_scaled_dot_product_flash_attention"}
    | {"_scaled_dot_product_efficient_attention_backward"}
    | {"_scaled_dot_product_flash_attention_backward"}
)
CONV_OPS = frozenset(
    {"convolution", "_convolution", "convolution_backward", "cudnn_convolution"}
    | {"cudnn_convolution_transpose", "conv1d", "conv2d", "conv3d"}
)


# Ops that divide by a tensor (overload, ``aten::`` and a trailing ``_`` left out): Adam's and
# addcdiv's updates among them.
DIVIDING_OPS = frozenset(
    {"div", "addcdiv", "reciprocal", "_foreach_div", "_foreach_addcdiv", "_foreach_reciprocal"}
    | {"_fused_adam", "_fused_adamw", "_fused_adagrad"}
)


# Ops that compute nothing (overload, ``aten::`` and a trailing ``_`` left out): each output
# holds values of its inputs, moved or repeated (a view, a copy, a concatenation), so it rounds
# nothing and cannot make a difference of its own; where an output differs, an input does.
MOVING_OPS = frozenset(
    {"view", "_unsafe_view", "reshape", "_reshape_alias", "alias", "detach", "lift_fresh"}
    | {"t", "transpose", "permute", "swapaxes", "expand", "unsqueeze", "squeeze"}
    | {"flatten", "unflatten", "slice", "select", "narrow", "unbind", "split", "chunk"}
    | {"split_with_sizes", "as_strided", "clone", "contiguous", "copy", "cat", "stack"}
)


def moves(op: OpRecord) -> bool:
    """Whether ``op`` only moves values: a moving op whose tensors are all of one dtype (a copy
    into another dtype rounds)."""
    tensors = (*op.inputs, *op.outputs)
    return family(op.op) in MOVING_OPS and len({t.dtype for t in tensors}) == 1


# Moving ops whose outputs hold only a part of their input (the others hold every value).
SELECTING_OPS = frozenset(
    {"slice", "select", "narrow", "unbind", "split", "split_with_sizes", "chunk", "as_strided"}
)


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


def dtype_unit(dtype: str) -> float | None:
    """The unit roundoff of a dtype; None for integer, bool and unknown dtypes (no rounding)."""
    return UNIT_ROUNDOFF.get(dtype)


def base_name(op: str) -> str:
    """``mm`` of ``aten::mm.default``."""
    return op.rpartition("::")[2].partition(".")[0]


def family(op: str) -> str:
    """What the op-name sets above are keyed by: ``copy`` of ``aten::copy_.default`` (an
    in-place op rounds and moves as its out-of-place form does)."""
    return base_name(op).removesuffix("_")


def compute_unit(op: OpRecord, environments: Iterable[Environment]) -> float | None:
    """The unit of the precision a float32 op on CUDA computes in where a recorded setting of
    either run makes it coarser than float32 (TF32, bfloat16); None where none does."""
    if not any(t.device.startswith("cuda") and t.dtype == "float32" for t in op.inputs):
        return None
    name = base_name(op.op)
    units = []
    for env in environments:
        fields = env.fields
        if name in MATMUL_OPS:
            precision = fields.get("float32_matmul_precision")
            if precision == "medium":
                units.append(BF16)
            elif fields.get("cuda_matmul_tf32") or precision == "high":
                units.append(TF32)
        if name in CONV_OPS and fields.get("cudnn_tf32"):
            units.append(TF32)
    return max(units, default=None)


def op_unit(
    op_a: OpRecord, op_b: OpRecord, environments: tuple[Environment, Environment]
) -> float | None:
    """``u`` of an aligned pair of ops (the module doc); None when it touches no floating-point
    tensor in either run (nothing it computes rounds)."""
    units = [
        unit
        for op in (op_a, op_b)
        for t in (*op.inputs, *op.outputs)
        if (unit := dtype_unit(t.dtype)) is not None
    ]
    units += [u for op in (op_a, op_b) if (u := compute_unit(op, environments)) is not None]
    return max(units, default=None)
