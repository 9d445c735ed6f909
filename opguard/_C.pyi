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
