"""Type stubs of the native extension (csrc/bindings.cpp)."""

from collections.abc import Callable
from types import CodeType, FrameType
from typing import Any

FINGERPRINT_VERSION: int

# (hash, nbytes, head bytes, (min, max, mean, absmax, nan count, inf count) or None,
#  the stored sketch (opguard/store/sketch.py) or None)
FingerprintResult = tuple[
    int,
    int,
    bytes,
    tuple[float | None, float | None, float | None, float | None, int, int] | None,
    bytes | None,
]

def fingerprint(
    address: int,
    itemsize: int,
    sizes: list[int] | tuple[int, ...],
    strides: list[int] | tuple[int, ...],
    kind: int,
    head_elements: int = 8,
    sketch: bool = True,
) -> FingerprintResult: ...
def hash_buffer(buffer: bytes | bytearray | memoryview) -> int: ...

CUDA_BUILT: bool

def cuda_status() -> tuple[bool, str]: ...

class GpuFingerprinter:
    launches: int  # tensors fingerprinted
    kernel_launches: int  # kernels launched (a _foreach_ op's list shares one)
    def __init__(
        self, partial_capacity: int = ..., head_capacity: int = ..., blocks_per_sm: int = ...
    ) -> None: ...

class PendingFields:
    """Content fields known once a GPU fingerprint kernel has run (csrc/content.h)."""

    def resolve(self) -> dict[str, Any]: ...

class OpRecord:
    """One op's record: its tensor entries, packed with the rest once known
    (csrc/op_record.h)."""

    @staticmethod
    def pack_all(records: list[OpRecord]) -> list[bytes]: ...

class TensorProbe:
    """A tensor entry's metadata and the start of its fingerprint (csrc/tensor_probe.cpp)."""

    def __init__(
        self,
        plain_types: tuple[type, ...],
        strided: Any,
        dtype_info: Callable[[Any], tuple[str, int, int]],
        raw_stream: Callable[[int], int] | None,
        gpu: Callable[[], GpuFingerprinter],
    ) -> None: ...
    def readable(self, tensor: Any) -> bool: ...
    def fingerprint(self, tensor: Any, head_elements: int) -> dict[str, Any] | PendingFields: ...
    def ring_load(self) -> float: ...

class StateBatch:
    """State tensors fingerprinted together, GPU ones possibly still running
    (csrc/state_record.h)."""

    def __len__(self) -> int: ...

def state_label(kind: str, name_id: int, slot: str) -> bytes: ...
def fingerprint_all(
    probe: TensorProbe,
    tensors: list[Any],
    labels: list[bytes],
    head_elements: int,
    sketch: bool = False,
) -> StateBatch: ...
def pack_entries(batches: list[StateBatch]) -> bytes: ...

FLAG_VIEW: int
FLAG_UNINITIALIZED: int
FLAG_UNREADABLE: int
FLAG_WRITTEN: int

class EntryRecorder:
    """Op input and output entries with each tensor's producer and known fingerprint
    (csrc/provenance.h)."""

    reads: int
    def __init__(self, probe: TensorProbe, head_elements: int) -> None: ...
    def discard(self) -> None: ...
    def unwritten(self, tensor: Any) -> None: ...

class OpPlan:
    """How an op's arguments and results are recorded, built once per op (csrc/op_plan.h)."""

    def __init__(
        self,
        names: list[str],
        written: list[str],
        write_only: list[str],
        defaults: tuple[tuple[str, Any, int], ...],
        is_view: bool,
        uninitialized_output: bool,
        uninitialized_slots: list[str],
        encode: Callable[[Any], Any],
    ) -> None: ...
    def inputs(
        self, entries: EntryRecorder, args: tuple, kwargs: dict, verify: bool, capturing: bool
    ) -> tuple[
        OpRecord,
        list[tuple[str, Any]] | None,  # written tensor arguments
        list[tuple[str, Any]],  # non-tensor arguments
        list[tuple[int, str, Any]] | None,  # inputs to capture
    ]: ...

def returned_tensors(probe: TensorProbe, result: Any) -> list[tuple[str, Any]]: ...

class StackWalker:
    def __init__(
        self,
        is_user_code: Callable[[CodeType], bool],
        site_id: Callable[[FrameType], int],
        stack_id: Callable[[tuple[int, ...]], int],
    ) -> None: ...
    def capture(self, start: FrameType | None = None) -> tuple[int, int] | None: ...

class CallRecorder:
    """The dispatch mode's per-op path in one native call (csrc/call_recorder.h)."""

    next_index: int
    region_phase: int  # -1: from the grad mode
    verify: bool
    kernels: bool
    def __init__(
        self,
        entries: EntryRecorder,
        walker: StackWalker,
        writer: Any,
        steps: Any,
        autograd: tuple[Callable[[], Any], Callable[[], bool], Callable[[], int]],
        phases: tuple[int, int, int, int],
        ring_drain: float,
        fail: Callable[[], Callable[[BaseException], None] | None],
    ) -> None: ...
    def call(
        self,
        plan: OpPlan,
        name_id: int,
        func: Any,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        caller: FrameType | None,
    ) -> Any: ...
    def finish(
        self,
        plan: OpPlan,
        op: OpRecord,
        out: Any,
        written: list[tuple[str, Any]] | None,
        name_id: int,
        arguments: list[Any],
        rng: int | None,
        in_flight: bool,
        capturing: bool,
        caller: FrameType | None,
        origins: list[int] | None = None,
    ) -> list[tuple[int, str, Any]] | None: ...
    def forward_site(self, sequence_nr: int) -> tuple[int, int] | None: ...
    def forget_step(self) -> None: ...

def cupti_start(library: str) -> str: ...
def cupti_push(op: int) -> None: ...
def cupti_pop() -> None: ...
def cupti_recorder_enter() -> None: ...
def cupti_recorder_leave(last_recorded: int) -> None: ...
def cupti_watch_unclaimed(on: bool) -> None: ...
def cupti_drain(all: bool = False) -> list[tuple[int, bytes]]: ...
def cupti_pause() -> None: ...
def cupti_resume() -> str: ...
def cupti_stop() -> None: ...
def cupti_counters() -> dict[str, int]: ...

class OpScanner:
    """Reads what alignment needs from stored op records (csrc/opscan.cpp); one per trace."""

    keys: int
    def __init__(self) -> None: ...
    def scan(
        self, chunk: list[bytes]
    ) -> tuple[
        list[Any],  # index (None at fallbacks)
        list[Any],  # step (None at fallbacks)
        list[Any],  # packed output contents (None at fallbacks)
        list[int],  # fallback positions (decode in Python)
        list[tuple[int, bytes]],  # (position, raw "v")
        list[tuple[int, int]],  # (position, key id) of key ids first met
        list[int],  # positions where the step changes (valid without fallbacks)
    ]: ...
    def define(self, id: int, k0: int, k1: int, k2: int) -> None: ...
    def levels(self) -> tuple[list[int], list[int], list[int]]: ...
    def nonfinite(self) -> list[tuple[int, int, int]]: ...

def step_contents(raw: bytes, rename: list[int] | None = None) -> bytes | None:
    """The content of a stored step-level record's entries (csrc/opscan.cpp): kind, name id
    (through ``rename``), slot, dtype, shape, flags, fingerprint; None: left to Python."""
