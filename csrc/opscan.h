// Reading stored op records for alignment without decoding them into Python objects.
#pragma once

#include <pybind11/pybind11.h>

namespace opguard {

// Adds the OpScanner class to the module (see opscan.cpp).
void bind_opscan(pybind11::module_& m);

}  // namespace opguard
