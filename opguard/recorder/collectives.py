"""c10d collectives as the recorder sees them: which ops they are, how their process group is
written down, and when their output can be read.

A collective reaches the dispatch mode like any ATen op (``c10d::allreduce_``,
``_c10d_functional::all_reduce``), but its arguments hold TorchScript objects (the process
group, the reduce op) whose repr is an address, and its output is filled in the background
(gloo and NCCL run collectives on their own threads). The recorder therefore names the group by
what identifies it across runs and waits for the collective before fingerprinting its output.
"""

from __future__ import annotations

from typing import Any

import torch

from ..store.schema import COLLECTIVE_NAMESPACES


def is_collective(namespace: str) -> bool:
    """The c10d ops: the in-place ones behind torch.distributed and the functional ones."""
    return namespace in COLLECTIVE_NAMESPACES


# The arguments of the in-place c10d ops that receive the result.
FILLED_ARGS = frozenset({"tensors", "output_tensors", "output_tensor", "output"})


def collective_writes(func: torch._ops.OpOverload) -> frozenset[str]:
    """The tensor lists an in-place c10d op (``allreduce_``, ``recv_``, ``broadcast_``, …)
    fills: their schemas carry no ``Tensor(a!)`` annotation, yet the buffers change."""
    if func.namespace != "c10d" or not func._opname.endswith("_"):
        return frozenset()
    return frozenset(a.name for a in func._schema.arguments if a.name in FILLED_ARGS)


def script_object(value: torch.ScriptObject) -> dict[str, Any]:
    """A process group as ``{"group": name, "size", "ranks", "backend"}``; any other
    TorchScript object (reduce op, work handle) as its class name, never its address."""
    kind = value._type().qualified_name().rsplit(".", 1)[-1]
    if kind == "ProcessGroup":
        group = _process_group(value)
        if group is not None:
            return group
    return {"object": kind}


def _process_group(value: torch.ScriptObject) -> dict[str, Any] | None:
    try:
        import torch.distributed as dist
        from torch._C._distributed_c10d import ProcessGroup

        group = ProcessGroup.unbox(value)
        ranks: list[int] | None = dist.get_process_group_ranks(group)
    except (ImportError, RuntimeError, ValueError):
        return None
    return {
        "group": group.group_name,
        "size": group.size(),
        "ranks": ranks,
        "backend": group.name(),
    }


# Point-to-point ops whose work must be waited on exactly once (a second wait on gloo's send
# or recv work blocks for a message that never comes), so the recorder leaves it to the caller.
POINT_TO_POINT = frozenset({"send", "recv_", "recv_any_source_"})


def wait(namespace: str, name: str, out: Any) -> bool:
    """Blocks until the collective that just returned ``out`` has written it, so that the
    recorded output is the collective's result and not whatever the buffer held before.
    Waiting early changes when the op completes, never what it computes. False for a
    point-to-point op, whose output is then fingerprinted only when something reads it."""
    if namespace == "c10d":
        if name in POINT_TO_POINT:
            return False
        from torch._C._distributed_c10d import Work

        for value in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(value, torch.ScriptObject) and value._type().qualified_name().endswith(
                ".Work"
            ):
                Work.unbox(value).wait()
    elif not name.startswith("wait_tensor"):
        for tensor in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(tensor, torch.Tensor):
                torch.ops._c10d_functional.wait_tensor(tensor)
    return True
