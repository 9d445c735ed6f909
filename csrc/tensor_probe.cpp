#include "tensor_probe.h"

#include <algorithm>
#include <iterator>
#include <string>

#include "names.h"
#include "results.h"
#include "weak_refs.h"
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

#if OPGUARD_WITH_CUDA
// A device tensor whose fingerprint is launched at the next flush, with the others queued by
// the same op (one launch for a _foreach_ op's list). Per thread: each recording thread
// launches on its own streams, at its own op boundaries.
struct QueuedLaunch {
  ContentPtr content;
  TensorView view;
  int device;
  int64_t head_elements;
};
thread_local std::vector<QueuedLaunch> t_queue;
#endif

}  // namespace

int64_t TensorFacts::numel() const {
  int64_t n = 1;
  for (int64_t s : sizes) n *= s;
  return n;
}

TensorProbe::TensorProbe(py::tuple plain_types, py::object strided, py::object dtype_info,
                         py::object raw_stream, py::object gpu)
    : strided_(std::move(strided)),
      dtype_info_(std::move(dtype_info)),
      raw_stream_(std::move(raw_stream)),
      make_gpu_(std::move(gpu)) {
  for (py::handle type : plain_types) plain_types_.push_back(type.ptr());
}

TensorFacts TensorProbe::read(py::handle tensor) {
  const Names& k = names();
  TensorFacts facts;
  facts.dtype = &dtype(attribute(tensor, k.dtype));
  const bool nested = is_true(attribute(tensor, k.is_nested));
  facts.strided = !nested && attribute(tensor, k.layout).is(strided_);
  if (!nested) facts.sizes = ints(attribute(tensor, k.shape));
  if (facts.strided) facts.strides = ints(call(tensor, k.stride));
  facts.cuda = is_true(attribute(tensor, k.is_cuda));
  facts.cpu = !facts.cuda && is_true(attribute(tensor, k.is_cpu));
  if (facts.cuda) facts.device = call(tensor, k.get_device).cast<int>();
  facts.readable = is_plain(tensor) && facts.strided && (facts.cuda || facts.cpu);
  return facts;
}

const TensorFacts* TensorProbe::remembered(py::handle tensor) {
  auto found = remembered_.find(tensor.ptr());
  if (found == remembered_.end() || !still_holds(tensor, found->second)) return nullptr;
  return &found->second.facts;
}

TensorFacts TensorProbe::read_remembered(py::handle tensor) {
  if (const TensorFacts* kept = remembered(tensor)) return *kept;
  TensorFacts facts = read(tensor);
  uintptr_t address = 0;
  if (!facts.readable || !this->address(tensor, facts, &address)) return facts;
  has_lazy_bits(tensor, facts);  // asked now, so that the kept facts answer it
  PyObject* ref = PyWeakref_NewRef(tensor.ptr(), nullptr);
  if (ref == nullptr) {  // a tensor class without weak references: read it every time
    PyErr_Clear();
    return facts;
  }
  if (remembered_.size() >= sweep_at_) sweep_remembered();
  remembered_.insert_or_assign(tensor.ptr(),
                               Remembered{py::reinterpret_steal<py::object>(ref), facts});
  return facts;
}

bool TensorProbe::still_holds(py::handle tensor, const Remembered& kept) {
  if (referent(kept.ref.ptr()) != tensor.ptr() || !is_plain(tensor)) return false;
  const Names& k = names();
  const TensorFacts& facts = kept.facts;
  const TensorFacts fresh;  // asked for its address only
  uintptr_t now = 0;
  return address(tensor, fresh, &now) && now == facts.address &&
         ints(attribute(tensor, k.shape)) == facts.sizes &&
         ints(call(tensor, k.stride)) == facts.strides;
}

void TensorProbe::sweep_remembered() {
  for (auto it = remembered_.begin(); it != remembered_.end();) {
    it = referent(it->second.ref.ptr()) == nullptr ? remembered_.erase(it) : std::next(it);
  }
  sweep_at_ = std::max(kFirstSweep, 2 * remembered_.size());
}

bool TensorProbe::is_plain(py::handle obj) const {
  for (PyObject* type : plain_types_) {
    if (Py_TYPE(obj.ptr()) == reinterpret_cast<PyTypeObject*>(type)) return true;
  }
  return false;
}

bool TensorProbe::is_tensor(py::handle obj) const {
  const int found = PyObject_IsInstance(obj.ptr(), plain_types_.front());
  if (found < 0) throw py::error_already_set();
  return found == 1;
}

ContentPtr TensorProbe::fingerprint(py::handle tensor, const TensorFacts& facts,
                                    int64_t head_elements) {
  if (!facts.readable) return Content::flag(kFlagUnreadable);
  if (has_lazy_bits(tensor, facts)) {
    // torch applies these bits when the tensor is read: fingerprint the values, not the bytes
    const Names& k = names();
    py::object resolved = call(call(tensor, k.resolve_conj), k.resolve_neg);
    return fingerprint(resolved, read(resolved), head_elements);
  }
  uintptr_t address = 0;
  if (!this->address(tensor, facts, &address)) throw py::error_already_set();
  if (facts.cuda) return launch(facts, address, head_elements);
  const TensorView view{reinterpret_cast<const uint8_t*>(address), facts.dtype->itemsize,
                        facts.sizes, facts.strides, facts.dtype->kind};
  return Content::fingerprint(fingerprint_cpu_releasing_gil(view, head_elements),
                              facts.dtype->kind);
}

bool TensorProbe::address(py::handle tensor, const TensorFacts& facts, uintptr_t* out) {
  if (facts.address_known == 0) {
    PyObject* value = PyObject_CallMethodNoArgs(tensor.ptr(), names().data_ptr.ptr());
    if (value == nullptr) {  // no storage: sparse, nested, some subclasses
      PyErr_Clear();
      facts.address_known = -1;
    } else {
      facts.address = static_cast<uintptr_t>(PyLong_AsUnsignedLongLong(value));
      Py_DECREF(value);
      if (PyErr_Occurred()) throw py::error_already_set();
      facts.address_known = 1;
    }
  }
  *out = facts.address;
  return facts.address_known == 1;
}

bool TensorProbe::has_lazy_bits(py::handle tensor, const TensorFacts& facts) {
  if (facts.lazy_bits < 0) {
    const Names& k = names();
    // torch sets the conjugate bit on complex tensors only (it asserts so); any tensor can
    // carry the negative one (the imaginary part of a conjugate view does)
    const Kind kind = facts.dtype->kind;
    const bool complex =
        kind == Kind::Complex32 || kind == Kind::Complex64 || kind == Kind::Complex128;
    facts.lazy_bits =
        (complex && is_true(call(tensor, k.is_conj))) || is_true(call(tensor, k.is_neg));
  }
  return facts.lazy_bits == 1;
}

bool TensorFacts::contiguous() const {
  if (numel() == 0) return true;
  int64_t expected = 1;
  for (size_t d = sizes.size(); d-- > 0;) {
    if (sizes[d] == 1) continue;
    if (strides[d] != expected) return false;
    expected *= sizes[d];
  }
  return true;
}

bool TensorProbe::views_derive_from(py::handle tensor, const TensorFacts& facts) {
  return facts.readable && facts.contiguous() && !has_lazy_bits(tensor, facts);
}

int64_t TensorProbe::version(py::handle tensor) {
  PyObject* value = PyObject_GetAttr(tensor.ptr(), names().version.ptr());
  if (value == nullptr) {  // inference tensors have no version counter
    PyErr_Clear();
    return -1;
  }
  const long long v = PyLong_AsLongLong(value);
  Py_DECREF(value);
  if (v == -1 && PyErr_Occurred()) throw py::error_already_set();
  return v;
}

const DtypeInfo& TensorProbe::dtype(py::handle dtype) {
  auto found = dtypes_.find(dtype.ptr());
  if (found != dtypes_.end()) return found->second;
  py::tuple info = dtype_info_(dtype);
  // dtype objects are interned singletons: keep this one alive as the key
  keep_.push_back(py::reinterpret_borrow<py::object>(dtype));
  return dtypes_
      .emplace(dtype.ptr(),
               DtypeInfo{info[0].cast<std::string>(), static_cast<Kind>(info[1].cast<int>()),
                         info[2].cast<int64_t>()})
      .first->second;
}

std::string TensorProbe::device_name(py::handle tensor, const TensorFacts& facts) {
  if (facts.cuda) return "cuda:" + std::to_string(facts.device);
  if (facts.cpu) return "cpu";
  return py::str(attribute(tensor, names().device)).cast<std::string>();
}

ContentPtr TensorProbe::launch(const TensorFacts& facts, uintptr_t address, int64_t head_elements) {
#if OPGUARD_WITH_CUDA
  if (!gpu_) gpu_ = make_gpu_();
  ContentPtr content = Content::gpu(&gpu_.cast<cuda::GpuFingerprinter&>());
  t_queue.push_back(
      QueuedLaunch{content,
                   TensorView{reinterpret_cast<const uint8_t*>(address), facts.dtype->itemsize,
                              facts.sizes, facts.strides, facts.dtype->kind},
                   facts.device, head_elements});
  return content;
#else
  (void)facts, (void)address, (void)head_elements;
  throw std::runtime_error("OpGuard was built without CUDA: cannot fingerprint a GPU tensor");
#endif
}

void TensorProbe::flush() {
#if OPGUARD_WITH_CUDA
  if (t_queue.empty()) return;
  std::vector<QueuedLaunch> queue;
  queue.swap(t_queue);
  auto& fingerprinter = gpu_.cast<cuda::GpuFingerprinter&>();
  std::vector<TensorView> views;
  std::vector<cuda::Ticket> tickets;
  for (size_t i = 0; i < queue.size();) {
    // consecutive launches on one device with one head length go together, on the device's
    // current stream: the one the op ran on (flushes happen at the op's boundaries)
    size_t j = i;
    views.clear();
    tickets.clear();
    while (j < queue.size() && queue[j].device == queue[i].device &&
           queue[j].head_elements == queue[i].head_elements) {
      views.push_back(queue[j++].view);
    }
    const QueuedLaunch& q = queue[i];
    const auto stream = raw_stream_(q.device).cast<uintptr_t>();
    // Keeping the GIL avoids handing it to the trace writer on every op; only a full result
    // ring (which the writer empties) is waited for without it.
    size_t done =
        fingerprinter.launch_many(views, q.device, stream, q.head_elements, 0.0, &tickets);
    if (done < views.size()) {
      views.erase(views.begin(), views.begin() + static_cast<ptrdiff_t>(done));
      py::gil_scoped_release release;
      fingerprinter.launch_many(views, q.device, stream, q.head_elements, kRingWaitSeconds,
                                &tickets);
    }
    for (size_t k = 0; k < tickets.size(); ++k) {
      queue[i + k].content->launched(tickets[k]);
    }
    i = j;
  }
#endif
}

double TensorProbe::ring_load() {
#if OPGUARD_WITH_CUDA
  if (gpu_) return gpu_.cast<cuda::GpuFingerprinter&>().load();
#endif
  return 0.0;
}

void TensorProbe::discard() {
#if OPGUARD_WITH_CUDA
  t_queue.clear();
#endif
}

void bind_tensor_probe(py::module_& m) {
  py::class_<TensorProbe>(m, "TensorProbe",
                          "Reads a tensor's entry metadata and starts its fingerprint natively.")
      .def(py::init<py::tuple, py::object, py::object, py::object, py::object>(),
           py::arg("plain_types"), py::arg("strided"), py::arg("dtype_info"), py::arg("raw_stream"),
           py::arg("gpu"))
      .def(
          "readable",
          [](TensorProbe& self, py::handle tensor) { return self.read(tensor).readable; },
          py::arg("tensor"),
          "Whether the tensor's memory can be read (plain, strided, on the CPU or a GPU).")
      .def(
          "fingerprint",
          [](TensorProbe& self, py::handle tensor, int64_t head_elements) {
            ContentPtr content = self.fingerprint(tensor, self.read(tensor), head_elements);
            self.flush();
            return content_to_python(content);
          },
          py::arg("tensor"), py::arg("head_elements"),
          "Content fields (CPU), a PendingFields (CUDA, on the current stream) or "
          "{'f': FLAG_UNREADABLE}.")
      .def("ring_load", &TensorProbe::ring_load,
           "The share of the GPU result rings waiting to be collected (0 before any GPU "
           "tensor).");
}

}  // namespace opguard
