#include "op_record.h"

#include <string>

#include "python_text.h"

namespace py = pybind11;

namespace opguard {
namespace {

void int_array(MsgpackOut& out, const std::vector<int64_t>& values) {
  out.array(values.size());
  for (int64_t v : values) out.integer(v);
}

void entries(MsgpackOut& out, const char* key, const std::vector<Entry>& list) {
  out.str(key);
  out.array(list.size());
  for (const Entry& e : list) e.pack(out);
}

// A Python value as msgpack-python's Packer(use_bin_type=True) packs it; other types are
// refused as it refuses them.
void pack_object(MsgpackOut& out, py::handle value) {
  PyObject* v = value.ptr();
  if (v == Py_None) {
    out.nil();
  } else if (PyBool_Check(v)) {
    out.boolean(v == Py_True);
  } else if (PyLong_Check(v)) {
    int overflow = 0;
    const long long n = PyLong_AsLongLongAndOverflow(v, &overflow);
    if (overflow > 0) {
      const unsigned long long u = PyLong_AsUnsignedLongLong(v);
      if (PyErr_Occurred()) throw py::error_already_set();
      out.uint(u);
    } else if (overflow < 0) {
      throw py::value_error("int too small to pack");
    } else {
      if (n == -1 && PyErr_Occurred()) throw py::error_already_set();
      out.integer(n);
    }
  } else if (PyFloat_Check(v)) {
    out.float64(PyFloat_AS_DOUBLE(v));
  } else if (PyUnicode_Check(v)) {
    out.str(utf8(value));
  } else if (PyBytes_Check(v)) {
    out.bin(reinterpret_cast<const uint8_t*>(PyBytes_AS_STRING(v)),
            static_cast<size_t>(PyBytes_GET_SIZE(v)));
  } else if (PyList_Check(v) || PyTuple_Check(v)) {
    const auto items = py::reinterpret_borrow<py::sequence>(value);
    out.array(items.size());
    for (py::handle item : items) pack_object(out, item);
  } else if (PyDict_Check(v)) {
    out.map(static_cast<size_t>(PyDict_Size(v)));
    PyObject *key, *item;
    Py_ssize_t position = 0;
    while (PyDict_Next(v, &position, &key, &item)) {
      pack_object(out, key);
      pack_object(out, item);
    }
  } else {
    throw py::type_error(std::string("can not serialize '") + Py_TYPE(v)->tp_name + "' object");
  }
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

void OpRecord::drop_base() {
  base = py::none();
  base_content.reset();
  base_facts = TensorFacts{};
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

py::object OpRecord::finish(int64_t index, int64_t name_id, int64_t step, int64_t phase,
                            const py::object& forward, const py::object& located,
                            const py::object& arguments, const py::object& rng,
                            const py::object& value, const py::object& origins) {
  head_.clear();
  MsgpackOut out(head_);
  out.str("i"), out.integer(index);
  out.str("o"), out.integer(name_id);
  out.str("s"), out.integer(step);
  out.str("p"), out.integer(phase);
  head_fields_ = 4;
  const auto field = [&](const char* key, py::handle v) {
    out.str(key), pack_object(out, v);
    ++head_fields_;
  };
  if (!forward.is_none()) field("f", forward);
  if (!located.is_none()) {  // (call site, stack)
    const auto site = py::reinterpret_borrow<py::tuple>(located);
    field("c", site[0]);
    field("k", site[1]);
  }
  if (!arguments.is_none() && py::len(arguments) > 0) field("a", arguments);
  if (!rng.is_none()) field("r", rng);
  if (!value.is_none()) field("v", value);
  if (!origins.is_none() && py::len(origins) > 0) field("l", origins);
  drop_base();  // only the outputs needed it
  if (pending()) return py::none();
  return py::bytes(pack());
}

std::string OpRecord::pack() const {
  std::string packed;
  packed.reserve(1 + head_.size() + 96 * (inputs.size() + outputs.size()));
  MsgpackOut out(packed);
  out.map(head_fields_ + 2);
  out.raw(head_);
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
      .def_static("pack_all", &OpRecord::pack_all, py::arg("records"),
                  "The packed records of finished OpRecords, waiting for their GPU "
                  "fingerprints without the GIL.");
}

}  // namespace opguard
