// What the recorder reads of a torch tensor for each trace entry (dtype, shape, strides,
// device) and the start of its fingerprint, in one native call per tensor. Each entry used to
// cost ~20 Python-level attribute reads, calls and dict updates (~20 µs for a GPU output on a
// GPT-2 step with 7,500 entries); here the same attributes are read through the CPython API.
// The extension still does not link libtorch: the tensor is only ever used as a Python object.
#pragma once

#include <pybind11/pybind11.h>

namespace opguard {

void bind_tensor_probe(pybind11::module_& m);

}  // namespace opguard
