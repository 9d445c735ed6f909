#include "callstack.h"

#include <Python.h>
#include <frameobject.h>

#include <algorithm>
#include <cstdint>
#include <unordered_map>
#include <utility>
#include <vector>

namespace py = pybind11;

namespace opguard {
namespace {

int last_instruction(PyFrameObject* frame) {
#if PY_VERSION_HEX >= 0x030B0000
  return PyFrame_GetLasti(frame);
#else
  return frame->f_lasti;
#endif
}

struct SiteKey {
  const PyObject* code;
  int lasti;
  bool operator==(const SiteKey& o) const { return code == o.code && lasti == o.lasti; }
};

struct SiteKeyHash {
  size_t operator()(const SiteKey& k) const {
    return std::hash<const void*>()(k.code) * 31 + std::hash<int>()(k.lasti);
  }
};

// Walks the current thread's Python stack and returns the site ids of its user frames. Whether
// a code object is user code, and the site id of a (code, instruction), are asked of Python
// once each and cached; cached code objects are kept alive, so their addresses stay unique.
class StackWalker {
 public:
  StackWalker(py::function is_user_code, py::function site_id)
      : is_user_code_(std::move(is_user_code)), site_id_(std::move(site_id)) {}

  // Site ids of the user frames, outermost first; None when there is none (autograd's threads).
  py::object capture() {
    std::vector<int64_t> sites;
    py::object frame =
        py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(PyEval_GetFrame()));
    while (frame) {
      auto* f = reinterpret_cast<PyFrameObject*>(frame.ptr());
      py::object code =
          py::reinterpret_steal<py::object>(reinterpret_cast<PyObject*>(PyFrame_GetCode(f)));
      if (is_user(code)) {
        const SiteKey key{code.ptr(), last_instruction(f)};
        auto it = sites_.find(key);
        if (it == sites_.end()) {
          it = sites_.emplace(key, site_id_(frame).cast<int64_t>()).first;
        }
        sites.push_back(it->second);
      }
      frame = py::reinterpret_steal<py::object>(reinterpret_cast<PyObject*>(PyFrame_GetBack(f)));
    }
    if (sites.empty()) return py::none();
    py::tuple out(sites.size());
    for (size_t i = 0; i < sites.size(); ++i) {
      out[i] = py::int_(sites[sites.size() - 1 - i]);
    }
    return std::move(out);
  }

 private:
  bool is_user(const py::object& code) {
    auto it = user_.find(code.ptr());
    if (it != user_.end()) return it->second;
    const bool user = is_user_code_(code).cast<bool>();
    user_.emplace(code.ptr(), user);
    kept_.push_back(code);
    return user;
  }

  py::function is_user_code_;
  py::function site_id_;
  std::unordered_map<const PyObject*, bool> user_;
  std::unordered_map<SiteKey, int64_t, SiteKeyHash> sites_;
  std::vector<py::object> kept_;  // every cached code object, alive for as long as the walker
};

}  // namespace

void bind_callstack(py::module_& m) {
  py::class_<StackWalker>(m, "StackWalker",
                          "Site ids of the user frames of the current Python stack, cached.")
      .def(py::init<py::function, py::function>(), py::arg("is_user_code"), py::arg("site_id"),
           "is_user_code(code) -> bool and site_id(frame) -> int are called once per code "
           "object and once per (code, instruction) respectively.")
      .def("capture", &StackWalker::capture,
           "Site ids of the user frames, outermost first, or None when there are none.");
}

}  // namespace opguard
