"""What the recorder needs to know about an ATen op, computed once per overload."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from .. import _C
from .arguments import encode
from .collectives import collective_writes, is_collective

# Ops whose outputs hold memory nobody has written yet: reading it would fingerprint garbage
# and make identical runs look different.
UNINITIALIZED_OUTPUT_OPS = frozenset(
    {
        "aten::empty",
        "aten::empty_like",
        "aten::empty_strided",
        "aten::empty_permuted",
        "aten::new_empty",
        "aten::new_empty_strided",
        "aten::resize_",
    }
)

# Outputs (by position) that return a buffer this op wrote only in part, the rest being memory
# nobody has written yet. FSDP2's all_gather_copy_in copies this rank's shard into its slice of
# the all-gather buffer and returns the whole buffer, which the all-gather then fills: compared
# as is, leftovers of an earlier step's all-gather would look like a divergence on this rank.
PARTLY_UNINITIALIZED_OUTPUTS: dict[str, frozenset[str]] = {
    "fsdp::all_gather_copy_in": frozenset({"1"}),
}


@dataclass(frozen=True, slots=True)
class OpInfo:
    name: str  # "aten::addmm.default"
    name_id: int
    arg_names: tuple[str, ...]
    written_args: frozenset[str]  # mutated in place (Tensor(a!)) or out=
    out_args: frozenset[str]  # write-only: their old content is not an input
    is_view: bool
    is_random: bool
    uninitialized_output: bool
    uninitialized_slots: frozenset[str]  # output slots holding partly unwritten memory
    # Non-tensor arguments with a schema default (name, value, position): recorded when the
    # caller leaves them out, so F.gelu(x) and F.gelu(x, approximate="none") record the same
    # call.
    defaults: tuple[tuple[str, Any, int], ...] = ()
    is_collective: bool = False  # a c10d op: its output may still be in flight when it returns
    # What runs an ATen op's call: the overload's C++ entry point, which its Python __call__
    # only forwards to (one Python frame less per op); None for units that are not ATen ops.
    run: Any = field(default=None, compare=False, repr=False)
    # Neither random nor collective: the native per-op path records it whole
    # (csrc/call_recorder.h); the mode records the others, with the RNG state or a wait.
    plain: bool = field(init=False, compare=False)
    # How a call's arguments and results are walked into its record, natively
    # (csrc/op_plan.h).
    plan: _C.OpPlan = field(init=False, compare=False, repr=False)

    def __post_init__(self) -> None:
        plan = _C.OpPlan(
            names=list(self.arg_names),
            written=sorted(self.written_args),
            write_only=sorted(self.out_args),
            defaults=self.defaults,
            is_view=self.is_view,
            uninitialized_output=self.uninitialized_output,
            uninitialized_slots=sorted(self.uninitialized_slots),
            encode=encode,
        )
        object.__setattr__(self, "plan", plan)  # frozen: set once, here
        object.__setattr__(self, "plain", not (self.is_random or self.is_collective))


def op_info(func: torch._ops.OpOverload, intern_name: object) -> OpInfo:
    schema = func._schema
    base = schema.name
    name = f"{base}.{func._overloadname}"
    args = schema.arguments
    return OpInfo(
        name=name,
        name_id=intern_name(name),  # type: ignore[operator]
        arg_names=tuple(a.name for a in args),
        written_args=frozenset(a.name for a in args if a.alias_info and a.alias_info.is_write)
        | collective_writes(func),
        out_args=frozenset(a.name for a in args if a.is_out),
        is_view=bool(func.is_view),
        is_random=torch.Tag.nondeterministic_seeded in func.tags,
        uninitialized_output=base in UNINITIALIZED_OUTPUT_OPS,
        uninitialized_slots=PARTLY_UNINITIALIZED_OUTPUTS.get(base, frozenset()),
        is_collective=is_collective(func.namespace),
        # a subclass (TorchBindOpOverload) may dispatch in Python first: keep its __call__
        run=func._op if type(func) is torch._ops.OpOverload else func,
        defaults=tuple(
            (a.name, encode(a.default_value), position)
            for position, a in enumerate(args)
            if a.has_default_value()
            and not a.is_out
            and a.name != "generator"
            and "Tensor" not in str(a.type)
        ),
    )
