"""Type stubs of the native extension (csrc/bindings.cpp)."""

FINGERPRINT_VERSION: int

def fingerprint(
    address: int,
    itemsize: int,
    sizes: list[int] | tuple[int, ...],
    strides: list[int] | tuple[int, ...],
    kind: int,
    head_elements: int = 8,
) -> tuple[
    int, int, bytes, tuple[float | None, float | None, float | None, float | None, int, int] | None
]: ...
def hash_buffer(buffer: bytes | bytearray | memoryview) -> int: ...

CUDA_BUILT: bool

def cuda_status() -> tuple[bool, str]: ...

class GpuTicket:
    seq: int
    kind: int

class GpuFingerprinter:
    launches: int
    def __init__(self, partial_capacity: int = ..., head_capacity: int = ...) -> None: ...
    def launch(
        self,
        address: int,
        itemsize: int,
        sizes: list[int] | tuple[int, ...],
        strides: list[int] | tuple[int, ...],
        kind: int,
        device: int,
        stream: int,
        head_elements: int = 8,
        timeout_s: float = 60.0,
    ) -> GpuTicket: ...
    def ready(self, ticket: GpuTicket) -> bool: ...
    def collect(
        self, ticket: GpuTicket, timeout_s: float = 600.0
    ) -> tuple[
        int,
        int,
        bytes,
        tuple[float | None, float | None, float | None, float | None, int, int] | None,
    ]: ...

def cupti_start(library: str) -> str: ...
def cupti_push(op: int) -> None: ...
def cupti_pop() -> None: ...
def cupti_drain(
    all: bool = False,
) -> list[
    tuple[int, int, str, tuple[int, int, int], tuple[int, int, int], int, int, int, int, int]
]: ...
def cupti_stop() -> None: ...
def cupti_counters() -> dict[str, int]: ...
