"""The rounding an op may do: its unit roundoffs, the relative error of one rounding at the
precisions it computes in, of which the tolerant diff's bounds are made (:mod:`.families`).

``u`` of an op is the coarsest of:

- the unit roundoff of every floating-point tensor the op reads or writes, in either run
  (:data:`UNIT_ROUNDOFF`): an aligned op that runs in bfloat16 under autocast in one run and in
  float32 in the other rounds like bfloat16;
- the precision its kernels compute in where a recorded setting makes it coarser than its
  tensors' dtype (:func:`compute_unit`): TF32 (10 mantissa bits, ``2**-11``) in float32 matmuls
  on CUDA when either run allowed it (``cuda_matmul_tf32``, or ``float32_matmul_precision``
  ``high``; ``medium`` allows bfloat16, ``2**-8``), and in cuDNN convolutions (``cudnn_tf32``,
  PyTorch's default). The reduced-precision reduction flags of float16 and bfloat16 matmuls
  change where partial sums round, not the dtype they round to: ``u`` stays that dtype's.

A sum accumulates in float32 for any narrower float (CPU and CUDA kernels alike), so its own
rounding grows at float32's unit, not at its dtype's (:func:`units`); a setting that rounds the
operands (TF32) adds its unit at the scale of the products.

Torch-free: it reads dtype names and the recorded environment (:mod:`opguard.store.environment`).
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from ...store import OpRecord, TensorRecord
from ...store.environment import Environment
from .families import CONV_OPS, FLOAT32_UNIT, FLOAT64_UNIT, MATMUL_OPS, Units, base_name

# Unit roundoff (half the distance from 1 to the next number) of each floating-point dtype as
# traces name them: 2**-p for p significand bits (the implicit one included).
UNIT_ROUNDOFF: dict[str, float] = {
    "float64": FLOAT64_UNIT,
    "complex128": FLOAT64_UNIT,
    "float32": FLOAT32_UNIT,
    "complex64": FLOAT32_UNIT,
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


def dtype_unit(dtype: str) -> float | None:
    """The unit roundoff of a dtype; None for integer, bool and unknown dtypes (no rounding)."""
    return UNIT_ROUNDOFF.get(dtype)


def coarsest(tensors: Iterable[TensorRecord]) -> float | None:
    """The largest unit roundoff of ``tensors``' dtypes; None where none is floating point."""
    return max((u for t in tensors if (u := dtype_unit(t.dtype)) is not None), default=None)


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
    units = [u for op in (op_a, op_b) if (u := coarsest((*op.inputs, *op.outputs))) is not None]
    units += [u for op in (op_a, op_b) if (u := compute_unit(op, environments)) is not None]
    return max(units, default=None)


def units(
    ops: tuple[OpRecord, ...],
    outputs: tuple[TensorRecord, ...],
    environments: tuple[Environment, Environment],
) -> Units | None:
    """The unit roundoffs of the bound of ``outputs`` (one tensor in each run that has it)
    made by ``ops`` (an aligned pair, or one op of one run): the op's ``u``, the outputs'
    dtype's, the accumulator's (float64 where every tensor is float64, else float32), the
    operands' rounding a setting asks for and a split reduction's partial sums'. None where
    nothing rounds."""
    op = max((u for o in ops if (u := coarsest((*o.inputs, *o.outputs))) is not None), default=None)
    if op is None:
        return None
    output = coarsest(outputs) or op
    accumulator = min(op, FLOAT32_UNIT)  # float64 sums in float64, anything narrower in float32
    operands = max(
        (u for o in ops if (u := compute_unit(o, environments)) is not None), default=0.0
    )
    partials = split_partials(ops, environments)
    return Units(max(op, operands), output, accumulator, operands, partials)


def split_partials(
    ops: tuple[OpRecord, ...], environments: tuple[Environment, Environment]
) -> float:
    """``sqrt(T)`` units of an op's 16-bit (or narrower) operands on the CPU, ``T`` the most
    intra-op threads either run recorded: a reduction split over the threads may keep each
    thread's partial sum in the operands' dtype before adding them; 0 on one thread, for wider
    operands, and on CUDA, whose split-K reductions of 16-bit matmuls (allowed by the reduced-
    precision reduction settings) are still to be measured."""
    narrow = [
        u
        for o in ops
        for t in o.inputs
        if t.device == "cpu" and (u := dtype_unit(t.dtype)) is not None and u > FLOAT32_UNIT
    ]
    threads = max(int(env.fields.get("threads") or 1) for env in environments)
    return math.sqrt(threads) * max(narrow) if narrow and threads > 1 else 0.0
