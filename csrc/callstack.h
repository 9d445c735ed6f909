// The recorder's call-stack walk in C++: it runs for every forward op over a stack that is often
// a hundred frames deep (nn.Module call wrappers, library decorators), where the same walk in
// Python cost ~40 µs per op.
#pragma once

#include <pybind11/pybind11.h>

namespace opguard {

void bind_callstack(pybind11::module_& m);

}  // namespace opguard
