#include "state_record.h"

#include <string>

#include "msgpack_out.h"

namespace py = pybind11;

namespace opguard {

std::string state_label(const std::string& kind, int64_t name_id, const std::string& slot) {
  std::string label;
  MsgpackOut out(label);
  out.array(4);  // [kind, name id, slot, tensor entry]
  out.str(kind), out.integer(name_id), out.str(slot);
  return label;
}

std::shared_ptr<StateBatch> fingerprint_all(TensorProbe& probe, const py::list& tensors,
                                            const py::list& labels, int64_t head_elements,
                                            bool sketch) {
  if (tensors.size() != labels.size()) {
    throw py::value_error("fingerprint_all: as many labels as tensors are needed");
  }
  auto batch = std::make_shared<StateBatch>();
  batch->sketch = sketch;
  batch->tensors.reserve(tensors.size());
  try {
    for (size_t i = 0; i < tensors.size(); ++i) {
      PyObject* label = PyList_GET_ITEM(labels.ptr(), static_cast<Py_ssize_t>(i));
      if (!PyBytes_Check(label)) throw py::type_error("fingerprint_all: labels are bytes");
      const py::handle tensor = PyList_GET_ITEM(tensors.ptr(), static_cast<Py_ssize_t>(i));
      TensorFacts facts = probe.read_remembered(tensor);
      ContentPtr content = probe.fingerprint(tensor, facts, head_elements);
      batch->tensors.push_back(StateTensor{
          std::string(PyBytes_AS_STRING(label), static_cast<size_t>(PyBytes_GET_SIZE(label))),
          facts.dtype, std::move(facts.sizes), std::move(content)});
    }
  } catch (...) {
    probe.discard();  // launches queued for tensors before the failing one never run
    throw;
  }
  probe.flush();
  return batch;
}

py::bytes pack_entries(const py::list& batches) {
  std::vector<std::shared_ptr<StateBatch>> parts;
  parts.reserve(batches.size());
  size_t count = 0;
  for (py::handle b : batches) {
    parts.push_back(b.cast<std::shared_ptr<StateBatch>>());
    count += parts.back()->tensors.size();
  }
  std::string packed;
  {
    py::gil_scoped_release release;
    packed.reserve(8 + 128 * count);
    MsgpackOut out(packed);
    out.array(count);
    for (const auto& part : parts) {
      for (const StateTensor& t : part->tensors) {
        t.content->resolve();
        out.raw(t.label);
        out.map(2 + t.content->field_count(0, part->sketch));
        out.str("d"), out.str(t.dtype->name);
        out.str("s"), out.array(t.sizes.size());
        for (int64_t s : t.sizes) out.integer(s);
        t.content->pack(out, 0, part->sketch);
      }
    }
  }
  return py::bytes(packed);
}

void bind_state_record(py::module_& m) {
  py::class_<StateBatch, std::shared_ptr<StateBatch>>(
      m, "StateBatch", "State tensors fingerprinted together (GPU ones possibly still running).")
      .def("__len__", [](const StateBatch& b) { return b.tensors.size(); });
  m.def(
      "state_label",
      [](const std::string& kind, int64_t name_id, const std::string& slot) {
        return py::bytes(state_label(kind, name_id, slot));
      },
      py::arg("kind"), py::arg("name_id"), py::arg("slot"),
      "The packed start [kind, name id, slot, … of a step-level state entry.");
  m.def("fingerprint_all", &fingerprint_all, py::arg("probe"), py::arg("tensors"),
        py::arg("labels"), py::arg("head_elements"), py::arg("sketch") = false,
        "Fingerprints a list of tensors at once (GPU ones launched by one flush), each with "
        "its state_label: a StateBatch for pack_entries (sketch: their entries keep their "
        "sketch).");
  m.def("pack_entries", &pack_entries, py::arg("batches"),
        "The batches' state entries in order, packed as one msgpack array, waiting for their "
        "GPU fingerprints without the GIL.");
}

}  // namespace opguard
