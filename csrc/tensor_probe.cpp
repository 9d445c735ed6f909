#include "tensor_probe.h"

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "results.h"
#if OPGUARD_WITH_CUDA
#include "fingerprint_cuda.h"
#endif

namespace py = pybind11;

namespace opguard {
namespace {

py::object attribute(py::handle obj, const py::str& name) {
  PyObject* value = PyObject_GetAttr(obj.ptr(), name.ptr());
  if (value == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(value);
}

py::object call(py::handle obj, const py::str& method) {
  PyObject* value = PyObject_CallMethodNoArgs(obj.ptr(), method.ptr());
  if (value == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::object>(value);
}

bool is_true(const py::object& value) { return value.ptr() == Py_True; }

// torch.Size and stride() are tuples of Python ints.
std::vector<int64_t> ints(const py::object& tuple) {
  if (!PyTuple_Check(tuple.ptr())) throw py::type_error("expected a tuple of ints");
  const Py_ssize_t n = PyTuple_GET_SIZE(tuple.ptr());
  std::vector<int64_t> out(static_cast<size_t>(n));
  for (Py_ssize_t i = 0; i < n; ++i) {
    const long long v = PyLong_AsLongLong(PyTuple_GET_ITEM(tuple.ptr(), i));
    if (v == -1 && PyErr_Occurred()) throw py::error_already_set();
    out[static_cast<size_t>(i)] = v;
  }
  return out;
}

py::list as_list(const py::object& tuple) {
  PyObject* list = PySequence_List(tuple.ptr());
  if (list == nullptr) throw py::error_already_set();
  return py::reinterpret_steal<py::list>(list);
}

struct DtypeInfo {
  py::str name;  // stored name (float32, bfloat16)
  Kind kind;
  int64_t itemsize;
};

class TensorProbe {
 public:
  // plain_types: the tensor classes whose memory is read (torch.Tensor, nn.Parameter);
  // strided: torch.strided; dtype_info(dtype) -> (name, kind code, itemsize), asked once per
  // dtype; raw_stream(device) -> the current stream of a CUDA device as an integer; gpu() ->
  // the process's GpuFingerprinter, asked for on the first CUDA tensor.
  TensorProbe(py::tuple plain_types, py::object strided, py::object dtype_info,
              py::object raw_stream, py::object gpu)
      : strided_(std::move(strided)),
        dtype_info_(std::move(dtype_info)),
        raw_stream_(std::move(raw_stream)),
        make_gpu_(std::move(gpu)) {
    for (py::handle type : plain_types) plain_types_.push_back(type.ptr());
  }

  // The metadata every entry has, read or not: {"n", "d", "s", "v", "t" (strided only)}.
  py::dict describe(py::handle tensor, py::handle slot) {
    py::dict entry;
    entry[key_slot_] = slot;
    entry[key_dtype_] = dtype(attribute(tensor, dtype_attr_)).name;
    const bool nested = is_true(attribute(tensor, is_nested_attr_));
    // a nested tensor has no single shape: its entry has none (its memory is not read either)
    entry[key_shape_] = nested ? py::list() : as_list(attribute(tensor, shape_attr_));
    entry[key_device_] = device_name(tensor);
    if (!nested && attribute(tensor, layout_attr_).is(strided_)) {
      entry[key_strides_] = as_list(call(tensor, stride_method_));
    }
    return entry;
  }

  // Starts the fingerprint of `tensor`: the entry's content fields for a CPU tensor, a GPU
  // ticket for a CUDA tensor (its kernel runs on the current stream), None when its memory
  // cannot be read (meta, sparse, a subclass, another device).
  py::object fingerprint(py::handle tensor, int64_t head_elements) {
    if (!readable(tensor)) return py::none();
    py::object t = py::reinterpret_borrow<py::object>(tensor);
    if (is_true(call(t, is_conj_method_)) || is_true(call(t, is_neg_method_))) {
      // torch applies these bits lazily: the stored bytes are not the values
      t = call(call(t, resolve_conj_method_), resolve_neg_method_);
    }
    const DtypeInfo& d = dtype(attribute(t, dtype_attr_));
    const auto address = call(t, data_ptr_method_).cast<uintptr_t>();
    const TensorView view{reinterpret_cast<const uint8_t*>(address), d.itemsize,
                          ints(attribute(t, shape_attr_)), ints(call(t, stride_method_)), d.kind};
    if (is_true(attribute(t, is_cuda_attr_))) return launch(t, view, head_elements);
    return entry_fields(fingerprint_cpu_releasing_gil(view, head_elements), d.kind);
  }

  // Plain strided tensors with real storage on the CPU or a CUDA device (not meta, sparse,
  // nested or subclasses): the tensors whose memory is read.
  bool readable(py::handle tensor) {
    bool plain = false;
    for (PyObject* type : plain_types_)
      plain = plain || Py_TYPE(tensor.ptr()) == (PyTypeObject*)type;
    return plain && attribute(tensor, layout_attr_).is(strided_) &&
           !is_true(attribute(tensor, is_nested_attr_)) &&
           (is_true(attribute(tensor, is_cuda_attr_)) || is_true(attribute(tensor, is_cpu_attr_)));
  }

 private:
  const DtypeInfo& dtype(const py::object& dtype) {
    auto found = dtypes_.find(dtype.ptr());
    if (found != dtypes_.end()) return found->second;
    py::tuple info = dtype_info_(dtype);
    // dtype objects are interned singletons: keep this one alive as the key
    keep_.push_back(dtype);
    return dtypes_
        .emplace(dtype.ptr(),
                 DtypeInfo{info[0].cast<py::str>(), static_cast<Kind>(info[1].cast<int>()),
                           info[2].cast<int64_t>()})
        .first->second;
  }

  py::object device_name(py::handle tensor) {
    if (is_true(attribute(tensor, is_cuda_attr_))) {
      const auto index = static_cast<size_t>(call(tensor, get_device_method_).cast<int64_t>());
      while (cuda_names_.size() <= index) {
        cuda_names_.push_back(py::str("cuda:" + std::to_string(cuda_names_.size())));
      }
      return cuda_names_[index];
    }
    if (is_true(attribute(tensor, is_cpu_attr_))) return cpu_name_;
    return py::str(attribute(tensor, device_attr_));
  }

  py::object launch(const py::object& tensor, const TensorView& view, int64_t head_elements) {
#if OPGUARD_WITH_CUDA
    if (!gpu_) gpu_ = make_gpu_();
    auto& fingerprinter = gpu_.cast<cuda::GpuFingerprinter&>();
    const int device = call(tensor, get_device_method_).cast<int>();
    const auto stream = raw_stream_(device).cast<uintptr_t>();
    // Keeping the GIL avoids handing it to the trace writer on every launch; only a full
    // result ring (which the writer empties) is waited for without it.
    cuda::Ticket ticket = fingerprinter.launch(view, device, stream, head_elements, 0.0);
    if (ticket.seq == 0) {
      py::gil_scoped_release release;
      ticket = fingerprinter.launch(view, device, stream, head_elements, kRingWaitSeconds);
    }
    return py::cast(ticket);
#else
    (void)tensor, (void)view, (void)head_elements;
    throw std::runtime_error("OpGuard was built without CUDA: cannot fingerprint a GPU tensor");
#endif
  }

  static constexpr double kRingWaitSeconds = 60.0;

  std::vector<PyObject*> plain_types_;  // borrowed: classes outlive the recorder
  py::object strided_, dtype_info_, raw_stream_, make_gpu_, gpu_;
  std::unordered_map<PyObject*, DtypeInfo> dtypes_;
  std::vector<py::object> keep_;
  std::vector<py::object> cuda_names_;
  py::str cpu_name_{"cpu"};
  py::str key_slot_{"n"}, key_dtype_{"d"}, key_shape_{"s"}, key_device_{"v"}, key_strides_{"t"};
  py::str dtype_attr_{"dtype"}, shape_attr_{"shape"}, layout_attr_{"layout"},
      device_attr_{"device"}, is_cuda_attr_{"is_cuda"}, is_cpu_attr_{"is_cpu"},
      is_nested_attr_{"is_nested"};
  py::str stride_method_{"stride"}, data_ptr_method_{"data_ptr"}, get_device_method_{"get_device"},
      is_conj_method_{"is_conj"}, is_neg_method_{"is_neg"}, resolve_conj_method_{"resolve_conj"},
      resolve_neg_method_{"resolve_neg"};
};

}  // namespace

void bind_tensor_probe(py::module_& m) {
  py::class_<TensorProbe>(m, "TensorProbe",
                          "Reads a tensor's entry metadata and starts its fingerprint natively.")
      .def(py::init<py::tuple, py::object, py::object, py::object, py::object>(),
           py::arg("plain_types"), py::arg("strided"), py::arg("dtype_info"), py::arg("raw_stream"),
           py::arg("gpu"))
      .def("describe", &TensorProbe::describe, py::arg("tensor"), py::arg("slot"),
           "{'n': slot, 'd': dtype, 's': shape, 'v': device, 't': strides (strided only)}")
      .def("readable", &TensorProbe::readable, py::arg("tensor"),
           "Whether the tensor's memory can be read (plain, strided, on the CPU or a GPU).")
      .def("fingerprint", &TensorProbe::fingerprint, py::arg("tensor"), py::arg("head_elements"),
           "Content fields (CPU), a GpuTicket (CUDA, on the current stream) or None "
           "(unreadable memory).");
}

}  // namespace opguard
