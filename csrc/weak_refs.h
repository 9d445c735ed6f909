// Weak references held by the native recorder (to tensors and storages): what they point to,
// across the Python versions the extension builds for.
#pragma once

#include <pybind11/pybind11.h>

namespace opguard {

// The object `ref` points to, borrowed, or nullptr once it is gone (or when `ref` is null).
// Borrowed: the caller compares it, or holds the object by other means while it uses it.
inline PyObject* referent(PyObject* ref) {
  if (ref == nullptr) return nullptr;
#if PY_VERSION_HEX >= 0x030D0000
  PyObject* target = nullptr;
  if (PyWeakref_GetRef(ref, &target) < 0) throw pybind11::error_already_set();
  Py_XDECREF(target);  // still referenced by its holder while the caller uses it
  return target;
#else
  PyObject* target = PyWeakref_GetObject(ref);
  return target == Py_None ? nullptr : target;
#endif
}

// A new weak reference to `obj`.
inline pybind11::object weak_reference(pybind11::handle obj) {
  PyObject* ref = PyWeakref_NewRef(obj.ptr(), nullptr);
  if (ref == nullptr) throw pybind11::error_already_set();
  return pybind11::reinterpret_steal<pybind11::object>(ref);
}

}  // namespace opguard
