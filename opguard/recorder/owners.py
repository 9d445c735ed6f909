"""The names step-level records give an optimizer's parameters and its model's buffers: module
paths such as ``transformer.h.3.mlp.c_fc.weight``.

An optimizer holds parameters, not the modules that own them. The modules are found once per
optimizer among all live objects (the garbage collector's list): the roots of the module trees
that hold its parameters. A parameter no module holds is named by its place in the optimizer,
``group 1 param 0``. Wrappers that add a level to every path (DistributedDataParallel's
``module.``, torch.compile's ``_orig_mod.``, FSDP1's and activation checkpointing's wrapped
modules) are looked through, so that a wrapped and an unwrapped run name their state alike.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import torch
from torch import nn

# Modules that wrap one other module, by class name (importing their classes would import
# torch._dynamo or torch.distributed), and the attribute holding the wrapped module.
ROOT_WRAPPERS = {
    "DistributedDataParallel": "module",
    "DataParallel": "module",
    "OptimizedModule": "_orig_mod",
}
# Path segments that wrappers insert inside a model.
WRAPPER_SEGMENTS = frozenset({"_fsdp_wrapped_module", "_checkpoint_wrapped_module", "_orig_mod"})


@dataclass
class Owners:
    """What the modules owning an optimizer's parameters say about them."""

    # Each parameter's name, by id(), for those a module owns.
    names: dict[int, str] = field(default_factory=dict)
    # (name, module, key) of each buffer of those modules: read as module._buffers[key] at
    # each step, as a module may replace a buffer.
    buffers: list[tuple[str, nn.Module, str]] = field(default_factory=list)


def param_name(owners: Owners, param: torch.Tensor, group: int, position: int) -> str:
    """The name of ``param``, the ``position``-th parameter of the optimizer's group
    ``group``."""
    return owners.names.get(id(param)) or f"group {group} param {position}"


def find_owners(params: Sequence[torch.Tensor]) -> Owners:
    """The names of ``params`` (an optimizer's, in its order) and the buffers of the modules
    that hold them."""
    wanted = {id(p): k for k, p in enumerate(params)}
    roots = _roots(_live_modules(), wanted)
    owners = Owners()
    prefixes = _prefixes(roots)
    for root, prefix in zip(roots, prefixes, strict=True):
        for name, param in root.named_parameters(remove_duplicate=True):
            if id(param) in wanted:
                owners.names.setdefault(id(param), _clean(prefix + name))
        for path, module in root.named_modules(remove_duplicate=True):
            for key, buffer in module._buffers.items():
                if buffer is not None:
                    dotted = f"{path}.{key}" if path else key
                    owners.buffers.append((_clean(prefix + dotted), module, key))
    return owners


def _live_modules() -> list[nn.Module]:
    """Every module alive in the process. The collector's list leaves out objects frozen with
    ``gc.freeze()`` (the recorder freezes the heap it starts with): they are let back for the
    look and frozen again after it."""
    frozen = gc.get_freeze_count() > 0
    if frozen:
        gc.unfreeze()
    try:
        # type(), not isinstance(): some objects warn when asked for their __class__
        return [o for o in gc.get_objects() if issubclass(type(o), nn.Module)]
    finally:
        if frozen:
            gc.freeze()


def _roots(modules: list[nn.Module], wanted: dict[int, int]) -> list[nn.Module]:
    """The tops of the module trees holding any parameter in ``wanted`` (id -> position),
    wrappers looked through, ordered by the first such parameter they hold."""
    children = {
        id(child)
        for module in modules
        for child in (getattr(module, "_modules", None) or {}).values()
        if child is not None
    }
    found: dict[int, tuple[int, nn.Module]] = {}
    for module in modules:
        if id(module) in children or not hasattr(module, "_parameters"):
            continue
        first = min((wanted[id(p)] for p in _parameters(module) if id(p) in wanted), default=None)
        if first is None:
            continue
        root = _unwrapped(module)
        if id(root) not in found or first < found[id(root)][0]:
            found[id(root)] = (first, root)
    return [root for _, root in sorted(found.values(), key=lambda item: item[0])]


def _parameters(module: nn.Module) -> Iterator[torch.Tensor]:
    try:
        yield from module.parameters()
    except Exception:  # a module whose construction never finished, or a broken subclass
        return


def _unwrapped(module: nn.Module) -> nn.Module:
    while (attribute := ROOT_WRAPPERS.get(type(module).__name__)) is not None:
        inner = getattr(module, attribute, None)
        if not isinstance(inner, nn.Module):
            break
        module = inner
    return module


def _prefixes(roots: list[nn.Module]) -> list[str]:
    """No prefix for a single model; with several, each path starts with its model's class
    name (and ``#2``, ``#3`` … when two are of one class), so no two names collide."""
    if len(roots) <= 1:
        return [""] * len(roots)
    seen: dict[str, int] = {}
    prefixes = []
    for root in roots:
        name = type(root).__name__
        seen[name] = seen.get(name, 0) + 1
        prefixes.append(f"{name}." if seen[name] == 1 else f"{name}#{seen[name]}.")
    return prefixes


def _clean(name: str) -> str:
    return ".".join(part for part in name.split(".") if part not in WRAPPER_SEGMENTS)
