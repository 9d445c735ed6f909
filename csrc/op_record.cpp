#include "op_record.h"

#include <stdexcept>

namespace py = pybind11;

namespace opguard {
namespace {

// "x" and "y", the entry lists, added to the head's fields: a fixmap stays a fixmap.
constexpr size_t kMaxHeadFields = 13;

void int_array(MsgpackOut& out, const std::vector<int64_t>& values) {
  out.array(values.size());
  for (int64_t v : values) out.integer(v);
}

void entries(MsgpackOut& out, const char* key, const std::vector<Entry>& list) {
  out.str(key);
  out.array(list.size());
  for (const Entry& e : list) e.pack(out);
}

}  // namespace

void Entry::pack(MsgpackOut& out) const {
  const size_t content_fields = content ? content->field_count(flags) : (flags != 0);
  out.map(4 + strided + content_fields + (producer >= 0));
  out.str("n"), out.str(slot);
  out.str("d"), out.str(dtype->name);
  out.str("s"), int_array(out, sizes);
  out.str("v"), out.str(device);
  if (strided) out.str("t"), int_array(out, strides);
  if (content) {
    content->pack(out, flags);
  } else if (flags != 0) {
    out.str("f"), out.integer(flags);
  }
  if (producer >= 0) {
    out.str("p"), out.array(2);
    out.integer(producer), out.integer(producer_slot);
  }
}

bool OpRecord::pending() const {
  for (const auto* list : {&inputs, &outputs}) {
    for (const Entry& e : *list) {
      if (e.content && e.content->pending()) return true;
    }
  }
  return false;
}

void OpRecord::resolve() {
  for (auto* list : {&inputs, &outputs}) {
    for (Entry& e : *list) {
      if (e.content) e.content->resolve();
    }
  }
}

py::object OpRecord::finish(py::bytes head) {
  head_ = head;
  const auto first = head_.empty() ? 0 : static_cast<uint8_t>(head_[0]);
  if ((first & 0xf0) != 0x80 || (first & 0x0f) > kMaxHeadFields) {
    throw std::invalid_argument("a record head is a msgpack map of at most 13 fields");
  }
  base = py::none();  // only the outputs needed it
  base_content.reset();
  if (pending()) return py::none();
  return py::bytes(pack());
}

std::string OpRecord::pack() const {
  std::string packed;
  packed.reserve(head_.size() + 96 * (inputs.size() + outputs.size()));
  MsgpackOut out(packed);
  out.map((static_cast<uint8_t>(head_[0]) & 0x0f) + 2);
  out.raw(std::string_view(head_).substr(1));
  entries(out, "x", inputs);
  entries(out, "y", outputs);
  return packed;
}

py::list OpRecord::pack_all(const py::list& records) {
  std::vector<std::shared_ptr<OpRecord>> batch;
  batch.reserve(records.size());
  for (py::handle r : records) batch.push_back(r.cast<std::shared_ptr<OpRecord>>());
  std::vector<std::string> packed(batch.size());
  {
    py::gil_scoped_release release;
    for (size_t i = 0; i < batch.size(); ++i) {
      batch[i]->resolve();
      packed[i] = batch[i]->pack();
    }
  }
  py::list out(batch.size());
  for (size_t i = 0; i < batch.size(); ++i) {
    out[i] = py::bytes(packed[i]);
  }
  return out;
}

void bind_op_record(py::module_& m) {
  py::class_<OpRecord, std::shared_ptr<OpRecord>>(
      m, "OpRecord", "One op's record: its tensor entries, packed with the rest once known.")
      .def(py::init<>())
      .def_property_readonly("input_count", [](const OpRecord& r) { return r.inputs.size(); })
      .def_property_readonly("output_count", [](const OpRecord& r) { return r.outputs.size(); })
      .def_property_readonly(
          "first_input_flags",
          [](const OpRecord& r) { return r.inputs.empty() ? 0 : r.inputs.front().all_flags(); },
          "The flags of its first tensor input (0 without inputs).")
      .def(
          "drop_base",
          [](OpRecord& r) {
            r.base = py::none();
            r.base_content.reset();
          },
          "Forgets its first input: only a view op's outputs need it.")
      .def("finish", &OpRecord::finish, py::arg("head"),
           "Takes the rest of the record (a packed msgpack map); returns the whole record "
           "packed, or None while a GPU fingerprint is pending (then pack_all packs it).")
      .def_static("pack_all", &OpRecord::pack_all, py::arg("records"),
                  "The packed records of finished OpRecords, waiting for their GPU "
                  "fingerprints without the GIL.");
}

}  // namespace opguard
