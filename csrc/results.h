// A CPU fingerprint taken from Python, and the tuple `_C.fingerprint` returns for it (a trace
// entry's content fields are content.h's).
#pragma once

#include <pybind11/pybind11.h>

#include "fingerprint_cpu.h"

namespace opguard {

// fingerprint_cpu, with the GIL released for tensors large enough to be worth it (below that,
// handing the GIL to another thread and getting it back costs more than hashing).
Fingerprint fingerprint_cpu_releasing_gil(const TensorView& view, int64_t head_elements,
                                          bool sketch = true);

// The stored sketch ("w", 60 bytes) as Python bytes, or None where the tensor has none.
pybind11::object sketch_bytes(const Fingerprint& fp);

// (hash, nbytes, head bytes, stats or None, sketch bytes or None)
pybind11::tuple result_tuple(const Fingerprint& fp, Kind kind);

}  // namespace opguard
