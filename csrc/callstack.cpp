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

// Hash of a stack's site ids, for the cache of interned stacks.
struct StackHash {
  size_t operator()(const std::vector<int64_t>& sites) const {
    size_t h = sites.size();
    for (int64_t s : sites) h = h * 1000003u ^ std::hash<int64_t>()(s);
    return h;
  }
};

// Walks the current thread's Python stack and returns its innermost user frame's site id and
// the id of the whole user stack. Whether a code object is user code, the site id of a (code,
// instruction) and the id of a stack are asked of Python once each and cached; cached code
// objects are kept alive, so their addresses stay unique.
class StackWalker {
 public:
  StackWalker(py::function is_user_code, py::function site_id, py::function stack_id)
      : is_user_code_(std::move(is_user_code)),
        site_id_(std::move(site_id)),
        stack_id_(std::move(stack_id)) {}

  // (site id, stack id) of the stack from `start` outwards (the current frame when None), or
  // None when no frame is user code (autograd's threads). Since Python 3.11 a frame object is
  // made on demand for each frame the walk passes: starting at the op's caller skips making
  // them for the recorder's own frames between it and this call.
  py::object capture(const py::object& start) {
    // Local, not a member: a callback into Python may let another thread (autograd's) walk
    // its own stack before this walk is done.
    std::vector<int64_t> sites;  // innermost first
    py::object frame =
        start.is_none()
            ? py::reinterpret_borrow<py::object>(reinterpret_cast<PyObject*>(PyEval_GetFrame()))
            : start;
    if (frame && !PyFrame_Check(frame.ptr())) throw py::type_error("capture: not a frame");
    while (frame) {
      auto* f = reinterpret_cast<PyFrameObject*>(frame.ptr());
      py::object code =
          py::reinterpret_steal<py::object>(reinterpret_cast<PyObject*>(PyFrame_GetCode(f)));
      if (is_user(code)) sites.push_back(site(frame, code, last_instruction(f)));
      frame = py::reinterpret_steal<py::object>(reinterpret_cast<PyObject*>(PyFrame_GetBack(f)));
    }
    if (sites.empty()) return py::none();
    std::reverse(sites.begin(), sites.end());  // outermost first, as stored
    auto stack = stacks_.find(sites);
    if (stack == stacks_.end()) {
      py::tuple ids(sites.size());
      for (size_t i = 0; i < sites.size(); ++i) ids[i] = py::int_(sites[i]);
      const auto id = stack_id_(ids).cast<int64_t>();
      stack = stacks_.emplace(sites, id).first;
    }
    return py::make_tuple(sites.back(), stack->second);
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

  int64_t site(const py::object& frame, const py::object& code, int lasti) {
    const SiteKey key{code.ptr(), lasti};
    auto it = site_ids_.find(key);
    if (it == site_ids_.end()) it = site_ids_.emplace(key, site_id_(frame).cast<int64_t>()).first;
    return it->second;
  }

  py::function is_user_code_;
  py::function site_id_;
  py::function stack_id_;
  std::unordered_map<const PyObject*, bool> user_;
  std::unordered_map<SiteKey, int64_t, SiteKeyHash> site_ids_;
  std::unordered_map<std::vector<int64_t>, int64_t, StackHash> stacks_;
  std::vector<py::object> kept_;  // every cached code object, alive for as long as the walker
};

}  // namespace

void bind_callstack(py::module_& m) {
  py::class_<StackWalker>(m, "StackWalker",
                          "The innermost user frame's site id and the user stack's id, cached.")
      .def(py::init<py::function, py::function, py::function>(), py::arg("is_user_code"),
           py::arg("site_id"), py::arg("stack_id"),
           "is_user_code(code) -> bool, site_id(frame) -> int and stack_id(site ids, outermost "
           "first) -> int are called once per code object, (code, instruction) and stack.")
      .def("capture", &StackWalker::capture, py::arg("start") = py::none(),
           "(site id, stack id) of the Python stack from frame `start` outwards (the caller's "
           "when None), or None when no frame is user code.");
}

}  // namespace opguard
