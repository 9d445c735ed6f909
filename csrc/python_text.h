// The UTF-8 text of a Python str, for the native code that copies names and slots out of
// Python objects.
#pragma once

#include <pybind11/pybind11.h>

#include <string>

namespace opguard {

inline std::string utf8(pybind11::handle text) {
  Py_ssize_t size = 0;
  const char* data = PyUnicode_AsUTF8AndSize(text.ptr(), &size);
  if (data == nullptr) throw pybind11::error_already_set();
  return std::string(data, static_cast<size_t>(size));
}

}  // namespace opguard
