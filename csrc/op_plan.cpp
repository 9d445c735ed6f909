#include "op_plan.h"

#include <pybind11/stl.h>

#include <memory>
#include <utility>

#include "python_text.h"

namespace py = pybind11;

namespace opguard {
namespace {

bool is_sequence(py::handle value) {
  return PyList_Check(value.ptr()) || PyTuple_Check(value.ptr());
}

// The returned tensors flagged when written, then the written (slot, tensor) not returned.
void add_written(std::vector<Result>& results, const py::object& written) {
  if (written.is_none()) return;
  for (py::handle pair : written) {
    const auto parts = py::reinterpret_borrow<py::tuple>(pair);
    py::handle tensor = parts[1];
    bool seen = false;
    for (Result& r : results) {
      if (r.tensor.is(tensor)) r.written = seen = true;
    }
    if (!seen) results.push_back({utf8(parts[0]), tensor, true});
  }
}

}  // namespace

std::vector<Result> returned_tensors(const TensorProbe& probe, py::handle result) {
  std::vector<Result> found;
  if (probe.is_tensor(result)) {
    if (probe.is_plain(result)) found.push_back({"0", result, false});
    return found;
  }
  if (!is_sequence(result)) return found;
  size_t k = 0;
  for (py::handle value : py::reinterpret_borrow<py::sequence>(result)) {
    if (probe.is_plain(value)) {
      found.push_back({std::to_string(k), value, false});
    } else if (is_sequence(value)) {
      size_t j = 0;
      for (py::handle item : py::reinterpret_borrow<py::sequence>(value)) {
        if (probe.is_plain(item)) {
          found.push_back({std::to_string(k) + "[" + std::to_string(j) + "]", item, false});
        }
        ++j;
      }
    }
    ++k;
  }
  return found;
}

// One call's walk of its arguments: the op being built and the lists it returns.
struct OpPlan::InputWalk {
  InputWalk(const OpPlan& plan, EntryRecorder& entries, bool verify, bool capturing)
      : plan(plan), entries(entries), verify(verify), capturing(capturing) {
    op->keeps_base = plan.is_view_;
  }

  const OpPlan& plan;
  EntryRecorder& entries;
  bool verify, capturing;
  std::shared_ptr<OpRecord> op = std::make_shared<OpRecord>();
  py::list written, arguments, taken;

  void input(std::string slot, py::handle tensor) {
    const size_t position = op->inputs.size();
    const int flags = entries.input(*op, slot, tensor, verify);
    if (capturing && !(flags & kFlagUninitialized)) {
      taken.append(py::make_tuple(position, py::str(slot), tensor));
    }
  }

  void argument(py::handle name, const std::string& text, py::handle value) {
    const TensorProbe& probe = entries.probe();
    const int role = plan.role(text);
    if (probe.is_tensor(value)) {
      if (role & kWritten) written.append(py::make_tuple(name, value));
      if (!(role & kWriteOnly)) input(text, value);
      return;
    }
    if (is_sequence(value)) {
      const auto items = py::reinterpret_borrow<py::sequence>(value);
      bool has_tensor = false;
      for (py::handle item : items) has_tensor = has_tensor || probe.is_tensor(item);
      if (has_tensor) {  // a _foreach_ op's list: one tensor per parameter
        size_t k = 0;
        for (py::handle item : items) {
          if (probe.is_tensor(item)) {
            std::string slot = text + "[" + std::to_string(k) + "]";
            if (role & kWritten) written.append(py::make_tuple(py::str(slot), item));
            if (!(role & kWriteOnly)) input(std::move(slot), item);
          }
          ++k;
        }
        return;
      }
    }
    if (text != "generator") arguments.append(py::make_tuple(name, plan.encode(value)));
  }
};

OpPlan::OpPlan(const std::vector<std::string>& names, const std::vector<std::string>& written,
               const std::vector<std::string>& write_only, const py::iterable& defaults,
               bool is_view, bool uninitialized_output,
               const std::vector<std::string>& uninitialized_slots, py::object encode)
    : name_texts_(names),
      is_view_(is_view),
      uninitialized_output_(uninitialized_output),
      uninitialized_slots_(uninitialized_slots.begin(), uninitialized_slots.end()),
      encode_(std::move(encode)) {
  for (const std::string& name : names) names_.emplace_back(name);
  for (const std::string& name : written) roles_[name] |= kWritten;
  for (const std::string& name : write_only) roles_[name] |= kWriteOnly;
  for (py::handle item : defaults) {
    const auto parts = item.cast<py::tuple>();
    defaults_.push_back({parts[0].cast<py::str>(), parts[1], parts[2].cast<size_t>()});
  }
}

int OpPlan::role(const std::string& name) const {
  auto found = roles_.find(name);
  return found == roles_.end() ? 0 : found->second;
}

py::object OpPlan::encode(py::handle value) const {
  PyObject* v = value.ptr();
  if (v == Py_None || PyLong_Check(v) || PyFloat_Check(v) || PyUnicode_Check(v)) {
    return py::reinterpret_borrow<py::object>(value);  // bool is an int
  }
  if (is_sequence(value)) {
    py::list out;
    for (py::handle item : py::reinterpret_borrow<py::sequence>(value)) out.append(encode(item));
    return std::move(out);
  }
  return encode_(value);
}

WalkedInputs OpPlan::walk_inputs(EntryRecorder& entries, const py::tuple& args,
                                 const py::dict& kwargs, bool verify, bool capturing) const {
  entries.settle();
  InputWalk walk(*this, entries, verify, capturing);
  const size_t given = args.size();
  for (size_t position = 0; position < given; ++position) {
    if (position < names_.size()) {
      walk.argument(names_[position], name_texts_[position], args[position]);
    } else {
      const std::string text = std::to_string(position);
      walk.argument(py::str(text), text, args[position]);
    }
  }
  for (auto [name, value] : kwargs) walk.argument(name, utf8(name), value);
  for (const Default& d : defaults_) {
    if (d.position >= given && !kwargs.contains(d.name)) {
      walk.arguments.append(py::make_tuple(d.name, d.value));
    }
  }
  entries.flush();  // the inputs' GPU fingerprints run before the op can change them
  py::object written = walk.written.empty() ? py::none() : py::object(walk.written);
  py::object taken = capturing ? py::object(walk.taken) : py::none();
  return WalkedInputs{std::move(walk.op), std::move(written), std::move(walk.arguments),
                      std::move(taken)};
}

py::tuple OpPlan::inputs(EntryRecorder& entries, const py::tuple& args, const py::dict& kwargs,
                         bool verify, bool capturing) const {
  WalkedInputs walked = walk_inputs(entries, args, kwargs, verify, capturing);
  return py::make_tuple(py::cast(walked.op), walked.written, walked.arguments, walked.taken);
}

OutputKind OpPlan::output_kind(const OpRecord& op, const std::string& slot, bool in_flight) const {
  if (uninitialized_output_ || uninitialized_slots_.count(slot)) return OutputKind::Uninitialized;
  if (in_flight) return OutputKind::InFlight;
  if (!is_view_) return OutputKind::Read;
  const int base_flags = op.inputs.empty() ? 0 : op.inputs.front().all_flags();
  return base_flags & kFlagUninitialized ? OutputKind::ViewOfUninitialized : OutputKind::View;
}

py::object OpPlan::outputs(EntryRecorder& entries, OpRecord& op, py::handle result,
                           const py::object& written, int64_t index, bool in_flight,
                           bool capturing) const {
  std::vector<Result> results = returned_tensors(entries.probe(), result);
  add_written(results, written);
  py::list taken;
  for (Result& r : results) {
    const OutputKind kind = output_kind(op, r.slot, in_flight);
    const size_t position = op.outputs.size();
    const int flags = entries.output(op, r.slot, r.tensor, index, kind, r.written);
    if (capturing && !in_flight && !(flags & kFlagUninitialized)) {
      taken.append(py::make_tuple(position, py::str(r.slot), r.tensor));
    }
  }
  entries.flush();  // launched before the writer can wait for them
  return capturing ? py::object(taken) : py::none();
}

void bind_op_plan(py::module_& m) {
  m.def(
      "returned_tensors",
      [](const TensorProbe& probe, py::handle result) {
        py::list found;
        for (const Result& r : returned_tensors(probe, result)) {
          found.append(py::make_tuple(r.slot, r.tensor));
        }
        return found;
      },
      py::arg("probe"), py::arg("result"),
      "(slot, tensor) of each plain tensor an op returned, nested lists included.");
  py::class_<OpPlan>(m, "OpPlan",
                     "How an op's arguments and results are recorded, built once per op (see "
                     "op_plan.h).")
      .def(py::init<const std::vector<std::string>&, const std::vector<std::string>&,
                    const std::vector<std::string>&, const py::iterable&, bool, bool,
                    const std::vector<std::string>&, py::object>(),
           py::arg("names"), py::arg("written"), py::arg("write_only"), py::arg("defaults"),
           py::arg("is_view"), py::arg("uninitialized_output"), py::arg("uninitialized_slots"),
           py::arg("encode"))
      .def("inputs", &OpPlan::inputs, py::arg("entries"), py::arg("args"), py::arg("kwargs"),
           py::arg("verify"), py::arg("capturing"),
           "(op, written, arguments, taken): a new OpRecord holding the call's inputs, the "
           "written tensor arguments (slot, tensor) or None, the other arguments as "
           "(name, value) pairs, and when capturing the inputs to capture.");
}

}  // namespace opguard
