#include "callstack.h"

#include <Python.h>
#include <frameobject.h>

#include <algorithm>
#include <utility>

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

}  // namespace

StackWalker::StackWalker(py::function is_user_code, py::function site_id, py::function stack_id)
    : is_user_code_(std::move(is_user_code)),
      site_id_(std::move(site_id)),
      stack_id_(std::move(stack_id)) {}

py::object StackWalker::capture(const py::object& start) {
  // Local, not a member: a callback into Python may let another thread (autograd's) walk its
  // own stack before this walk is done.
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

bool StackWalker::is_user(const py::object& code) {
  auto it = user_.find(code.ptr());
  if (it != user_.end()) return it->second;
  const bool user = is_user_code_(code).cast<bool>();
  user_.emplace(code.ptr(), user);
  kept_.push_back(code);
  return user;
}

int64_t StackWalker::site(const py::object& frame, const py::object& code, int lasti) {
  const SiteKey key{code.ptr(), lasti};
  auto it = site_ids_.find(key);
  if (it == site_ids_.end()) it = site_ids_.emplace(key, site_id_(frame).cast<int64_t>()).first;
  return it->second;
}

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
