#include "call_recorder.h"

#include <climits>
#include <utility>

#include "names.h"
#if OPGUARD_WITH_CUDA
#include "cupti_activity.h"
#endif

namespace py = pybind11;

namespace opguard {
namespace {

// The recorder's own work on this thread while it exists (CUPTI's recorder_enter and leave);
// leaving names the last op recorded, which GPU work launched afterwards outside any op
// follows.
class OwnWorkScope {
 public:
  OwnWorkScope(bool on, const int64_t& next_index) : on_(on), next_index_(next_index) {
#if OPGUARD_WITH_CUDA
    if (on_) cupti::recorder_enter();
#endif
  }
  ~OwnWorkScope() {
#if OPGUARD_WITH_CUDA
    if (on_) cupti::recorder_leave(next_index_ - 1);
#endif
  }
  OwnWorkScope(const OwnWorkScope&) = delete;
  OwnWorkScope& operator=(const OwnWorkScope&) = delete;

 private:
  bool on_;
  const int64_t& next_index_;
};

// GPU work launched while it exists is op `index`'s.
class OpScope {
 public:
  OpScope(bool on, int64_t index) : on_(on) {
#if OPGUARD_WITH_CUDA
    if (on_) cupti::push(static_cast<uint64_t>(index));
#else
    (void)index;
#endif
  }
  ~OpScope() {
#if OPGUARD_WITH_CUDA
    if (on_) cupti::pop();
#endif
  }
  OpScope(const OpScope&) = delete;
  OpScope& operator=(const OpScope&) = delete;

 private:
  bool on_;
};

py::object run(py::handle func, const py::tuple& args, const py::dict& kwargs) {
  PyObject* out = PyObject_Call(func.ptr(), args.ptr(), kwargs.ptr());
  if (out == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(out);
}

bool truthy(const py::object& value) {
  const int truth = PyObject_IsTrue(value.ptr());
  if (truth < 0) throw py::error_already_set();
  return truth == 1;
}

// The exception being handled, as the Python exception the same error raises in Python.
py::object current_exception() {
  try {
    throw;
  } catch (py::error_already_set& e) {
    return e.value();
  } catch (py::builtin_exception& e) {
    e.set_error();
    return py::error_already_set().value();
  } catch (const std::exception& e) {
    return py::reinterpret_borrow<py::object>(PyExc_RuntimeError)(e.what());
  }
}

}  // namespace

CallRecorder::CallRecorder(py::object entries, py::object walker, py::object writer,
                           py::object steps, py::tuple autograd, py::tuple phases,
                           double ring_drain, py::object fail)
    : entries_owner_(std::move(entries)),
      walker_owner_(std::move(walker)),
      entries_(entries_owner_.cast<EntryRecorder&>()),
      walker_(walker_owner_.cast<StackWalker&>()),
      append_(writer.attr("append")),
      wake_(writer.attr("wake")),
      make_room_(writer.attr("make_room")),
      steps_(std::move(steps)),
      fail_(std::move(fail)),
      current_node_(autograd[0]),
      grad_enabled_(autograd[1]),
      sequence_nr_(autograd[2]),
      forward_(phases[0].cast<int64_t>()),
      backward_(phases[1].cast<int64_t>()),
      optimizer_(phases[2].cast<int64_t>()),
      other_(phases[3].cast<int64_t>()),
      ring_drain_(ring_drain) {}

py::object CallRecorder::call(const OpPlan& plan, int64_t name_id, py::handle func,
                              const py::tuple& args, const py::dict& kwargs,
                              const py::object& caller) {
  const OwnWorkScope own(kernels, next_index);
  WalkedInputs walked;
  try {
    walked = plan.walk_inputs(entries_, args, kwargs, verify, false);
  } catch (...) {
    fail();
    return run(func, args, kwargs);
  }
  py::object out;
  {
    const OpScope op(kernels, next_index);
    out = run(func, args, kwargs);  // the op's own error propagates
  }
  try {
    finish(plan, walked.op, out, walked.written, name_id, walked.arguments, py::none(), false,
           false, caller, py::none());
  } catch (...) {
    fail();
  }
  return out;
}

py::object CallRecorder::finish(const OpPlan& plan, const std::shared_ptr<OpRecord>& op,
                                py::handle out, const py::object& written, int64_t name_id,
                                const py::object& arguments, const py::object& rng, bool in_flight,
                                bool capturing, const py::object& caller,
                                const py::object& origins) {
  const int64_t index = next_index;
  py::object taken = plan.outputs(entries_, *op, out, written, index, in_flight, capturing);
  const Location where = locate(index, caller);
  // an op that returns no tensor (`.item()`, a size) keeps what it returned
  py::object value = !out.is_none() && op->outputs.empty() ? plan.encode(out) : py::none();
  const auto step = steps_.attr(names().step).cast<int64_t>();
  py::object packed = op->finish(index, name_id, step, where.phase, where.forward, where.located,
                                 arguments, rng, value, origins);
  if (packed.is_none()) {  // a GPU fingerprint is pending: the writer packs it once landed
    append_(index, py::cast(op));
    if (entries_.ring_load() > ring_drain_) make_room_();  // before launches wait for space
  } else {
    append_(index, packed);
  }
  // Counted once queued: a failure above reports this op as the first one not recorded.
  next_index = index + 1;
  return taken;
}

CallRecorder::Location CallRecorder::locate(int64_t index, const py::object& caller) {
  py::object node = current_node_();
  if (!node.is_none()) {
    if (!in_backward_) {  // the host has time to spare: let the writer catch up
      in_backward_ = true;
      wake_();
    }
    const Forward* forward = forward_of(node.attr(names().sequence_nr)().cast<uint64_t>());
    if (forward != nullptr) return {backward_, py::int_(forward->index), forward->located};
    return {backward_, py::none(), walker_.capture(caller)};
  }
  in_backward_ = false;
  int64_t phase = other_;
  if (truthy(steps_.attr(names().in_optimizer))) {
    phase = optimizer_;
  } else if (region_phase >= 0) {
    phase = region_phase;
  } else if (truthy(grad_enabled_())) {
    phase = forward_;
  }
  py::object located = walker_.capture(caller);
  const auto sequence_nr = sequence_nr_().cast<int64_t>();
  if (sequence_nr != last_sequence_nr_) {
    // The first op after the counter moved is the one whose autograd node took it.
    last_sequence_nr_ = sequence_nr;
    forward_sites_[sequence_nr - 1] = Forward{index, located};
  }
  return {phase, py::none(), located};
}

const CallRecorder::Forward* CallRecorder::forward_of(uint64_t sequence_nr) const {
  // nodes made outside any forward op (AccumulateGrad) have the largest number
  if (sequence_nr > static_cast<uint64_t>(INT64_MAX)) return nullptr;
  auto found = forward_sites_.find(static_cast<int64_t>(sequence_nr));
  return found == forward_sites_.end() ? nullptr : &found->second;
}

py::object CallRecorder::forward_site(uint64_t sequence_nr) const {
  const Forward* forward = forward_of(sequence_nr);
  return forward == nullptr ? py::none() : forward->located;
}

void CallRecorder::fail() {
  py::object exception = current_exception();
  py::object stop = fail_();  // a weak method: None once the mode is gone
  if (!stop.is_none()) stop(exception);
}

void bind_call_recorder(py::module_& m) {
  py::class_<CallRecorder>(m, "CallRecorder",
                           "The dispatch mode's per-op path: walks, op, call site and record "
                           "in one native call (csrc/call_recorder.h).")
      .def(py::init<py::object, py::object, py::object, py::object, py::tuple, py::tuple, double,
                    py::object>(),
           py::arg("entries"), py::arg("walker"), py::arg("writer"), py::arg("steps"),
           py::arg("autograd"), py::arg("phases"), py::arg("ring_drain"), py::arg("fail"))
      .def("call", &CallRecorder::call, py::arg("plan"), py::arg("name_id"), py::arg("func"),
           py::arg("args"), py::arg("kwargs"), py::arg("caller"),
           "Records one call of an op and returns its result.")
      .def("finish", &CallRecorder::finish, py::arg("plan"), py::arg("op"), py::arg("out"),
           py::arg("written"), py::arg("name_id"), py::arg("arguments"), py::arg("rng"),
           py::arg("in_flight"), py::arg("capturing"), py::arg("caller"),
           py::arg("origins") = py::none(),
           "Finishes and queues the record of op next_index; returns the outputs to capture "
           "when capturing.")
      .def("forward_site", &CallRecorder::forward_site, py::arg("sequence_nr"),
           "(call site, stack) of the forward op of an autograd sequence number, or None.")
      .def("forget_step", &CallRecorder::forget_step)
      .def_readwrite("next_index", &CallRecorder::next_index)
      .def_readwrite("region_phase", &CallRecorder::region_phase)
      .def_readwrite("verify", &CallRecorder::verify)
      .def_readwrite("kernels", &CallRecorder::kernels);
}

}  // namespace opguard
