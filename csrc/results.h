// Fingerprints as Python sees them: a CPU fingerprint taken from Python, and its Python forms: the
// tuple `_C.fingerprint` returns, and the content fields of a trace's tensor entry (the keys `h`,
// `z`, `b`, `m` of opguard/store/schema.py), built here so the recorder does not rebuild each one
// in Python.
#pragma once

#include <pybind11/pybind11.h>

#include "fingerprint_cpu.h"

namespace opguard {

// fingerprint_cpu, with the GIL released for tensors large enough to be worth it (below that,
// handing the GIL to another thread and getting it back costs more than hashing).
Fingerprint fingerprint_cpu_releasing_gil(const TensorView& view, int64_t head_elements);

// (hash, nbytes, head bytes, stats or None)
pybind11::tuple result_tuple(const Fingerprint& fp, Kind kind);

// {"h": hash, "z": nbytes, "b": head bytes, "m": [min, max, mean, absmax, nan, inf]} ("m" only
// for kinds with stats; min/max/mean/absmax None when no element is finite)
pybind11::dict entry_fields(const Fingerprint& fp, Kind kind);

// {"f": flag}: the content fields of an entry whose memory is not read (unreadable,
// uninitialized).
pybind11::dict flag_fields(int flag);

}  // namespace opguard
