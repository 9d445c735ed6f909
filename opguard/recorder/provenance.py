"""Where each live tensor came from, and what its content fingerprint is.

The recorder asks this before reading a tensor: if a recorded op wrote it (or it is a view of
something recorded) and nothing wrote it since, its fingerprint is already known and its
producer is that op. Two lookups:

1. by Python object (weakly held), for tensors that stay alive in Python;
2. by storage, for the last non-view write of each storage (and leaves read so far), while that
   storage is alive: an exact geometry match is that tensor; anything else is a view of it
   (C++ composites create views and pass them on in new Python objects, as ``F.linear`` does
   with ``weight.t()``), whose fingerprint is derived from its base's.

The storage must be alive (a weak reference to its Python object, which torch keeps for as long
as the storage lives) because the allocator reuses addresses: a freed storage's address may
now hold an unrelated tensor with an equal version number. Validity is the version counter torch
bumps on every in-place write (shared by views of one storage). In-place ops bump it after the
dispatch mode returns, so written tensors are "settled" (their version re-read) when the next
op starts.
"""

from __future__ import annotations

import weakref
from typing import Any

import torch

from .tensors import Fields, PendingFields, address_of, views_derive_from

Content = Fields | PendingFields | None  # None: not read yet


class Known:
    __slots__ = (
        "derivable",
        "fields",
        "geometry",
        "index",
        "nbytes",
        "ptr",
        "ref",
        "slot",
        "storage",
        "storage_ref",
        "version",
    )

    def __init__(
        self,
        tensor: torch.Tensor,
        entry: Fields,
        ref: weakref.ref,
        index: int | None,
        slot: int,
        fields: Content,
    ) -> None:
        self.ref = ref
        self.index = index  # producing op, None for a leaf
        self.slot = slot
        self.version = version_of(tensor)
        self.fields = fields
        self.geometry = geometry_of(tensor, entry)
        self.ptr = self.geometry[0]
        self.nbytes = tensor.numel() * tensor.element_size()
        # Set when it holds its storage's latest content: the storage's address, kept alive,
        # and whether views of it (found by storage) take fingerprints derived from its own.
        self.storage: int | None = None
        self.storage_ref: weakref.ref | None = None
        self.derivable = False

    def valid_for(self, tensor: torch.Tensor) -> bool:
        return self.version >= 0 and self.version == version_of(tensor)


def version_of(tensor: torch.Tensor) -> int:
    """The tensor's version counter; inference tensors have none (-1: never trusted)."""
    try:
        return int(tensor._version)
    except RuntimeError:
        return -1


def geometry_of(tensor: torch.Tensor, entry: Fields) -> tuple[Any, ...]:
    """Address, dtype, sizes and strides: the last three as its trace entry already has them
    (``describe``), read once per tensor instead of once per lookup."""
    return (address_of(tensor), entry["d"], entry["s"], entry.get("t"))


def storage_of(tensor: torch.Tensor) -> int | None:
    try:
        return int(tensor.untyped_storage().data_ptr())
    except RuntimeError:  # no storage (meta, sparse, nested, some subclasses)
        return None


class Provenance:
    def __init__(self) -> None:
        self._by_object: dict[int, Known] = {}
        self._by_storage: dict[int, Known] = {}
        self._unsettled: list[tuple[torch.Tensor, Known]] = []

    def find(self, tensor: torch.Tensor, entry: Fields) -> tuple[Known | None, bool]:
        """(what is known, whether it is exactly this tensor, whose trace entry is ``entry``).
        Not exact: ``Known`` is the storage's last write and ``tensor`` a view of it."""
        known = self._by_object.get(id(tensor))
        if known is not None and known.ref() is tensor and known.valid_for(tensor):
            return known, True
        storage = storage_of(tensor)
        known = self._by_storage.get(storage) if storage is not None else None
        if (
            known is not None
            and known.storage_ref is not None
            and known.storage_ref() is not None
            and known.valid_for(tensor)
        ):
            return known, known.geometry == geometry_of(tensor, entry)
        return None, False

    def remember(
        self,
        tensor: torch.Tensor,
        entry: Fields,
        index: int | None,
        slot: int,
        fields: Content,
        *,
        is_view: bool = False,
        written: bool = False,
        owns_storage: bool = False,
    ) -> Known:
        """Records what is known of ``tensor`` (trace entry ``entry``): output ``slot`` of op
        ``index`` (None: a leaf). ``owns_storage``: the tensor is its storage's latest content
        (a non-view output, or a leaf read for the first time), so views of it can be derived."""
        key = id(tensor)
        by_object, by_storage = self._by_object, self._by_storage

        def forget(ref: weakref.ref, key: int = key) -> None:
            known = by_object.get(key)
            if known is not None and known.ref is ref:
                del by_object[key]

        known = Known(tensor, entry, weakref.ref(tensor, forget), index, slot, fields)
        by_object[key] = known
        if owns_storage:
            try:
                storage = tensor.untyped_storage()
            except RuntimeError:  # no storage (meta, sparse, nested, some subclasses)
                return known
            address = known.storage = int(storage.data_ptr())
            known.derivable = views_derive_from(tensor)

            def forget_storage(ref: weakref.ref, address: int = address) -> None:
                known = by_storage.get(address)
                if known is not None and known.storage_ref is ref:
                    del by_storage[address]

            known.storage_ref = weakref.ref(storage, forget_storage)
            by_storage[address] = known
        if written:
            self._unsettled.append((tensor, known))
        return known

    def settle(self) -> None:
        """Re-reads the versions of the last op's written tensors (bumped after it returned)."""
        if self._unsettled:
            for tensor, known in self._unsettled:
                known.version = version_of(tensor)
            self._unsettled.clear()
