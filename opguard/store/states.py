"""Step-level records: the training state at each step boundary, as stored and as read.

Recording every op costs a fraction of each step and about a megabyte of trace per GPT-2 step;
a week-long run cannot afford it. What it can afford is a fingerprint of its *state* once per
step: the loss, every parameter's gradient as the optimizer saw it, the parameters and
optimizer states after the update, the modules' buffers, the RNG states. Two runs' step-level
records say at which step and rank they first differ, and in what (a gradient: that step's
forward or backward; a parameter with equal gradients: the optimizer), which is where op-level
recording then looks (``opguard record --window``).

Layout (:mod:`.schema`): database ``steps``, one record per step, key the step number, value
``{"s": step, "e": [[kind, name id, slot, tensor entry], ...]}``, or ``{"s": step, "z": ...}``
with that list packed and compressed (what the recorder writes: GPT-2's ~740 entries are ~87 KB
packed, ~37 KB compressed); names interned in ``states``.
"""

from __future__ import annotations

import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

import msgpack

from . import schema
from .errors import DamagedRecord
from .records import TensorRecord

# zlib's fastest level: the writer thread compresses a step's entries in well under a
# millisecond, and higher levels gain a few percent (hashes and raw values hardly compress).
COMPRESSION_LEVEL = 1

KIND_ORDER = {kind: order for order, kind in enumerate(schema.STATE_KINDS)}


@dataclass(frozen=True, slots=True)
class StateEntry:
    """One tensor of the training state at a step boundary."""

    kind: str  # one of schema.STATE_KINDS
    name: str  # module path of a parameter or buffer, "group G param P", "loss", "cpu", ...
    slot: str  # an optimizer state's key (``exp_avg``), else ""
    tensor: TensorRecord

    @property
    def key(self) -> tuple[str, str, str]:
        """What identifies the entry in both runs' records of a step."""
        return (self.kind, self.name, self.slot)

    @property
    def label(self) -> str:
        """``grad transformer.h.3.mlp.c_fc.weight``, ``state transformer.wte.weight exp_avg``,
        ``loss`` (a name that repeats the kind is said once; a loss's slot counts the step's
        ``backward()`` calls, said only from the second on: ``loss 1``)."""
        name = "" if self.name == self.kind else self.name
        slot = "" if self.name == self.kind and self.slot == "0" else self.slot
        return " ".join(part for part in (self.kind, name, slot) if part)

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "name": self.name,
            "slot": self.slot,
            "tensor": self.tensor.to_json(),
        }


@dataclass(frozen=True, slots=True)
class StepState:
    """The state entries recorded at the end of step ``step`` of one rank."""

    step: int
    entries: tuple[StateEntry, ...]

    def by_key(self) -> dict[tuple[str, str, str], StateEntry]:
        return {entry.key: entry for entry in self.entries}


def encode_step(step: int, entries: Iterable[tuple[str, int, str, dict[str, Any]]]) -> dict:
    """The stored value of a step's record: ``entries`` are (kind, name id, slot, tensor entry
    fields)."""
    return {"s": step, "e": [list(entry) for entry in entries]}


def encode_packed_step(step: int, entries: bytes) -> dict[str, Any]:
    """The stored value of a step whose entries come packed (one msgpack array, as the
    recorder's native code packs them): compressed."""
    return {"s": step, "z": zlib.compress(entries, COMPRESSION_LEVEL)}


def expand_step(raw: bytes) -> bytes:
    """A stored step record's bytes with compressed entries expanded: the ``{"s", "e"}`` form,
    byte for byte as msgpack packs it, so that records compare as bytes whichever form they were
    stored in. Other bytes come back as they are (decoding them says what is wrong)."""
    try:
        record = msgpack.unpackb(raw, raw=False, strict_map_key=False)
        if not (isinstance(record, dict) and isinstance(record.get("z"), bytes)):
            return raw
        entries = zlib.decompress(record["z"])
    except (zlib.error, ValueError, TypeError, msgpack.UnpackException):
        return raw
    return (
        b"\x82" + msgpack.packb("s") + msgpack.packb(record.get("s")) + msgpack.packb("e") + entries
    )


def _entries_of(raw: Any) -> Any:
    """A stored step record with its compressed entries (``z``) unpacked into ``e``."""
    if not (isinstance(raw, dict) and "e" not in raw and isinstance(raw.get("z"), bytes)):
        return raw
    try:
        entries = msgpack.unpackb(zlib.decompress(raw["z"]), raw=False, strict_map_key=False)
    except (zlib.error, ValueError, TypeError, msgpack.UnpackException) as exc:
        raise DamagedRecord(f"step record with undecodable entries ({exc})") from None
    return {"s": raw.get("s"), "e": entries}


def decode_step(raw: Any, names: dict[int, str]) -> StepState:
    """A stored step record; :class:`DamagedRecord` when it is not one."""
    raw = _entries_of(raw)
    if not (isinstance(raw, dict) and type(raw.get("s")) is int and isinstance(raw.get("e"), list)):
        raise DamagedRecord("step record of the wrong shape")
    entries = []
    for item in raw["e"]:
        if not (
            isinstance(item, list)
            and len(item) == 4
            and item[0] in KIND_ORDER
            and type(item[1]) is int
            and isinstance(item[2], str)
        ):
            raise DamagedRecord("step record with a damaged state entry")
        kind, name_id, slot, fields = item
        tensor = TensorRecord.decode({**fields, "n": slot} if isinstance(fields, dict) else fields)
        entries.append(StateEntry(kind, names.get(name_id, f"<state {name_id}>"), slot, tensor))
    return StepState(raw["s"], tuple(entries))


def loss_tensors(raw: bytes) -> list[TensorRecord]:
    """The loss entries of a stored step record (one a ``backward()`` call), read without
    decoding the rest: a step computes its loss first, so they lead its entries, and a long
    run's loss curve then reads one entry a step instead of every gradient and parameter.
    Empty when the record holds no loss or is not a step record (decoding it says why)."""
    try:
        record = msgpack.unpackb(raw, raw=False, strict_map_key=False)
        if not isinstance(record, dict):
            return []
        entries: Iterable[Any]
        if isinstance(record.get("z"), bytes):
            unpacker = msgpack.Unpacker(raw=False, strict_map_key=False)
            unpacker.feed(zlib.decompress(record["z"]))
            entries = (unpacker.unpack() for _ in range(unpacker.read_array_header()))
        else:
            entries = record.get("e") or ()
        losses = []
        for entry in entries:
            if not (isinstance(entry, list) and len(entry) == 4 and entry[0] == "loss"):
                break
            fields = entry[3]
            losses.append(TensorRecord.decode({**fields, "n": entry[2]}))
    except (zlib.error, ValueError, TypeError, msgpack.UnpackException, DamagedRecord):
        return []
    return losses


def comparable_entries(raw: bytes, rename: Sequence[int] | None = None) -> list[Any] | None:
    """The entries of a stored step record as two runs' records compare: without their stats
    and sketches (the same content gets other means and buckets where another device or kernel
    reduced it) and with
    name id ``i`` mapped to ``rename[i]`` (-1 past its end). Equal results mean equal states;
    unequal ones may still hold equal content (entries in another order), which only a full
    decode tells. None when ``raw`` is not a step record (decoding it says why). The Python
    reading of ``opguard._C.step_contents``, for an extension built before it."""
    try:
        record = msgpack.unpackb(raw, raw=False, strict_map_key=False)
    except (ValueError, TypeError, msgpack.UnpackException):
        return None
    entries = record.get("e") if isinstance(record, dict) else None
    if not isinstance(entries, list):
        return None
    for entry in entries:
        if not (
            isinstance(entry, list)
            and len(entry) == 4
            and type(entry[1]) is int
            and isinstance(entry[3], dict)
        ):
            return None
        entry[3].pop("m", None)
        entry[3].pop("w", None)
        if rename is not None:
            entry[1] = rename[entry[1]] if 0 <= entry[1] < len(rename) else -1
    return entries


def decode_state_name(raw: Any) -> str:
    if not isinstance(raw, str):
        raise DamagedRecord("state name that is not a string")
    return raw
