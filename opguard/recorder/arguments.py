"""Non-tensor arguments, stored verbatim in a form msgpack and JSON can carry."""

from __future__ import annotations

import enum
from typing import Any

import torch

from .collectives import script_object
from .tensors import content_hash


def encode(value: Any) -> Any:
    """A faithful, comparable rendering of a non-tensor argument.

    Numbers, strings, booleans and None are kept as they are (floats bit-exact); torch enums
    become their names; a generator becomes the fingerprint of its state, so a reseeded
    generator is seen as a changed argument.

    The recorder's native walk (``OpPlan::encode`` in csrc/op_plan.cpp) renders None, numbers,
    strings and lists itself, as the first two branches here do, and calls this function for
    the rest: keep the two in step.
    """
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [encode(v) for v in value]
    if isinstance(value, (torch.dtype, torch.device, torch.layout, torch.memory_format)):
        return str(value)
    if isinstance(value, torch.Generator):
        return {"generator": generator_fingerprint(value)}
    if isinstance(value, (torch.SymInt, torch.SymFloat, torch.SymBool)):
        return str(value)
    if isinstance(value, complex):
        return [value.real, value.imag]
    if isinstance(value, enum.Enum):
        return str(value)
    if isinstance(value, torch.ScriptObject):
        return script_object(value)
    # Other objects: only the type, since a repr often holds a memory address.
    return {"object": type(value).__qualname__}


def generator_fingerprint(generator: torch.Generator) -> int | None:
    """Fingerprint of a generator's full state (CPU Mersenne twister, or CUDA seed+offset)."""
    try:
        state = generator.get_state()
    except RuntimeError:
        return None
    return content_hash(state)
