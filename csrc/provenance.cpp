#include "provenance.h"

#include <algorithm>
#include <climits>

#include "names.h"
#include "weak_refs.h"

namespace py = pybind11;

namespace opguard {
namespace {

bool alive(const py::object& ref) { return referent(ref.ptr()) != nullptr; }

// The tensor's storage object and its address; a null object when it has none (meta, sparse,
// nested, some subclasses).
py::object storage_of(py::handle tensor, uintptr_t* address) {
  PyObject* storage = PyObject_CallMethodNoArgs(tensor.ptr(), names().untyped_storage.ptr());
  if (storage == nullptr) {
    PyErr_Clear();
    return py::object();
  }
  py::object owned = py::reinterpret_steal<py::object>(storage);
  PyObject* ptr = PyObject_CallMethodNoArgs(storage, names().data_ptr.ptr());
  if (ptr == nullptr) {
    PyErr_Clear();
    return py::object();
  }
  *address = static_cast<uintptr_t>(PyLong_AsUnsignedLongLong(ptr));
  Py_DECREF(ptr);
  if (PyErr_Occurred()) throw py::error_already_set();
  return owned;
}

bool is_uninitialized(const ContentPtr& content) {
  return content && (content->flags() & kFlagUninitialized);
}

}  // namespace

EntryRecorder::EntryRecorder(py::object probe, int64_t head_elements)
    : probe_owner_(std::move(probe)),
      probe_(probe_owner_.cast<TensorProbe&>()),
      head_elements_(head_elements) {}

std::pair<EntryRecorder::KnownPtr, bool> EntryRecorder::find(py::handle tensor,
                                                             const TensorFacts& facts) {
  int64_t version = LLONG_MIN;  // read once, when a candidate needs it
  bool swapped = false;
  auto found = by_object_.find(reinterpret_cast<uintptr_t>(tensor.ptr()));
  if (found != by_object_.end() && referent(found->second->ref.ptr()) == tensor.ptr()) {
    version = probe_.version(tensor);
    // `x.data = y` (an EMA update, Module._apply) swaps x's memory without an op or a version
    // bump: the address and geometry tell
    if (found->second->valid_for(version)) {
      if (same_geometry(*found->second, tensor, facts)) return {found->second, true};
      swapped = true;
    }
  }
  uintptr_t storage = 0;
  if (!storage_of(tensor, &storage)) return {nullptr, false};
  auto by_storage = by_storage_.find(storage);
  if (by_storage == by_storage_.end() || !alive(by_storage->second->storage_ref)) {
    return {nullptr, false};
  }
  KnownPtr known = by_storage->second;
  if (version == LLONG_MIN) version = probe_.version(tensor);
  const bool exact = same_geometry(*known, tensor, facts);
  if (!known->valid_for(version)) {
    if (!swapped) return {nullptr, false};
    // A swapped tensor counts its writes on its own version counter, not on the one of its
    // storage's writer (a parameter after `module.to(device)`): nothing wrote it since it was
    // known, and the storage holds what its writer left. Known anew on its own counter, which
    // its views share, so that they are found by storage too.
    if (exact)
      known = remember(tensor, facts, known->index, known->slot, known->content, false, true);
  }
  return {known, exact};
}

bool EntryRecorder::same_geometry(const Known& known, py::handle tensor, const TensorFacts& facts) {
  uintptr_t address = 0;
  const bool has_address = probe_.address(tensor, facts, &address);
  return has_address == known.has_address && address == known.address &&
         facts.dtype == known.dtype && facts.strided == known.strided &&
         facts.sizes == known.sizes && facts.strides == known.strides;
}

EntryRecorder::KnownPtr EntryRecorder::remember(py::handle tensor, const TensorFacts& facts,
                                                int64_t index, int64_t slot, ContentPtr content,
                                                bool written, bool owns_storage) {
  auto known = std::make_shared<Known>();
  known->ref = weak_reference(tensor);
  known->index = index;
  known->slot = slot;
  known->version = probe_.version(tensor);
  known->content = std::move(content);
  known->has_address = probe_.address(tensor, facts, &known->address);
  known->dtype = facts.dtype;
  known->sizes = facts.sizes;
  known->strides = facts.strides;
  known->strided = facts.strided;
  known->nbytes = facts.nbytes();
  by_object_[reinterpret_cast<uintptr_t>(tensor.ptr())] = known;
  if (owns_storage) {
    uintptr_t storage = 0;
    py::object storage_object = storage_of(tensor, &storage);
    if (storage_object) {
      known->derivable = probe_.views_derive_from(tensor, facts);
      known->storage_ref = weak_reference(storage_object);
      by_storage_[storage] = known;
    }
  }
  if (written) unsettled_.emplace_back(py::reinterpret_borrow<py::object>(tensor), known);
  if (by_object_.size() + by_storage_.size() > sweep_at_) sweep();
  return known;
}

void EntryRecorder::sweep() {
  // Entries of dead tensors and freed storages never match again (identity and liveness are
  // checked on lookup); dropping them only bounds memory. Amortised: the threshold doubles.
  for (auto it = by_object_.begin(); it != by_object_.end();) {
    it = alive(it->second->ref) ? std::next(it) : by_object_.erase(it);
  }
  for (auto it = by_storage_.begin(); it != by_storage_.end();) {
    it = alive(it->second->storage_ref) ? std::next(it) : by_storage_.erase(it);
  }
  sweep_at_ = std::max(kFirstSweep, 2 * (by_object_.size() + by_storage_.size()));
}

bool EntryRecorder::Known::compiled_scratch() const {
  return index < 0 && is_uninitialized(content);
}

void EntryRecorder::unwritten(py::handle tensor) {
  remember(tensor, probe_.read(tensor), -1, 0, Content::flag(kFlagUninitialized), false, true);
}

void EntryRecorder::settle() {
  for (auto& [tensor, known] : unsettled_) known->version = probe_.version(tensor);
  unsettled_.clear();
}

ContentPtr EntryRecorder::read(py::handle tensor, const TensorFacts& facts) {
  ++reads_;
  return probe_.fingerprint(tensor, facts, head_elements_);
}

Entry EntryRecorder::entry(TensorFacts facts, py::handle tensor, std::string slot) {
  Entry e;
  e.slot = std::move(slot);
  e.dtype = facts.dtype;
  e.device = probe_.device_name(tensor, facts);
  e.strided = facts.strided;
  e.sizes = std::move(facts.sizes);
  if (facts.strided) e.strides = std::move(facts.strides);
  return e;
}

// A view's content is a function of its base's content and of the view's geometry (offset,
// dtype, sizes, strides), so equal bases and equal geometry mean equal views. Null when the
// view reaches outside its base's bytes [base_address, base_address + base_nbytes)
// (base_nbytes < 0: the base is not contiguous, or has lazy bits), the view has lazy bits or
// the base's content is unknown; the view is then read when an op uses it. The base is
// contiguous, so a contiguous view of all its bytes from its start, of its dtype, holds its
// values in its logical order (and shares its sketch).
ContentPtr EntryRecorder::view_content(py::handle view, const TensorFacts& facts,
                                       uintptr_t base_address, int64_t base_nbytes,
                                       const DtypeInfo* base_dtype, const ContentPtr& base) {
  if (!base || !base->has_hash() || base_nbytes < 0 || !facts.readable) return nullptr;
  if (probe_.has_lazy_bits(view, facts)) return nullptr;
  uintptr_t address = 0;
  if (!probe_.address(view, facts, &address)) return nullptr;
  const int64_t itemsize = facts.dtype->itemsize;
  const auto offset = static_cast<int64_t>(address - base_address);
  int64_t lo = offset, hi = offset + itemsize;
  for (size_t d = 0; d < facts.sizes.size(); ++d) {
    if (facts.sizes[d] == 0) {
      lo = hi = offset;
      break;
    }
    const int64_t span = (facts.sizes[d] - 1) * facts.strides[d] * itemsize;
    lo += std::min<int64_t>(0, span);
    hi += std::max<int64_t>(0, span);
  }
  if (lo < 0 || hi > base_nbytes) return nullptr;
  std::vector<int64_t> geometry{offset, static_cast<int64_t>(facts.dtype->kind), itemsize};
  geometry.insert(geometry.end(), facts.sizes.begin(), facts.sizes.end());
  geometry.insert(geometry.end(), facts.strides.begin(), facts.strides.end());
  const int64_t nbytes = facts.numel() * itemsize;
  const bool base_order =
      offset == 0 && facts.dtype == base_dtype && nbytes == base_nbytes && facts.contiguous();
  return Content::view_of(base, std::move(geometry), nbytes, base_order);
}

int EntryRecorder::input(OpRecord& op, std::string slot, py::handle tensor, bool verify) {
  TensorFacts facts = probe_.read(tensor);
  auto [known, exact] = find(tensor, facts);
  ContentPtr content;
  if (known && exact) {
    if (verify && !known->compiled_scratch()) {
      content = read(tensor, facts);
    } else {
      if (!known->content) known->content = read(tensor, facts);
      content = known->content;
    }
  } else {
    if (known && is_uninitialized(known->content)) {
      content = known->content;  // an alias of memory nobody has written yet
    } else if (known) {          // a view of a known write, re-wrapped by C++ code
      content = view_content(tensor, facts, known->address, known->derivable ? known->nbytes : -1,
                             known->dtype, known->content);
    }
    if (!content) content = read(tensor, facts);
    remember(tensor, facts, known ? known->index : -1, known ? known->slot : 0, content, false,
             known == nullptr);
  }
  if (op.keeps_base && op.inputs.empty()) {  // with the address and lazy bits asked above
    op.base = py::reinterpret_borrow<py::object>(tensor);
    op.base_content = content;
    op.base_facts = facts;
  }
  Entry e = entry(std::move(facts), tensor, std::move(slot));
  if (known && known->index >= 0) e.producer = known->index, e.producer_slot = known->slot;
  e.content = std::move(content);
  const int flags = e.all_flags();
  op.inputs.push_back(std::move(e));
  return flags;
}

int EntryRecorder::output(OpRecord& op, std::string slot, py::handle tensor, int64_t index,
                          OutputKind how, bool written) {
  TensorFacts facts = probe_.read(tensor);
  ContentPtr content;
  const bool view = how == OutputKind::View || how == OutputKind::ViewOfUninitialized;
  if (how == OutputKind::Uninitialized || how == OutputKind::ViewOfUninitialized) {
    content = Content::flag(kFlagUninitialized);
  } else if (how == OutputKind::Read) {
    content = read(tensor, facts);
  } else if (how == OutputKind::View && op.base && !op.base.is_none()) {
    const TensorFacts& base = op.base_facts;
    uintptr_t base_address = 0;
    const bool derivable =
        probe_.views_derive_from(op.base, base) && probe_.address(op.base, base, &base_address);
    content = view_content(tensor, facts, base_address, derivable ? base.nbytes() : -1, base.dtype,
                           op.base_content);
  }
  const auto out_slot = static_cast<int64_t>(op.outputs.size());
  remember(tensor, facts, index, out_slot, content, written, !view);
  Entry e = entry(std::move(facts), tensor, std::move(slot));
  if (view) e.flags |= kFlagView;
  if (written) e.flags |= kFlagWritten;
  e.content = std::move(content);
  const int flags = e.all_flags();
  op.outputs.push_back(std::move(e));
  return flags;
}

void bind_provenance(py::module_& m) {
  py::class_<EntryRecorder>(m, "EntryRecorder",
                            "Trace entries of op inputs and outputs, with each tensor's "
                            "producer and known fingerprint (see provenance.h).")
      .def(py::init<py::object, int64_t>(), py::arg("probe"), py::arg("head_elements"))
      .def("discard", &EntryRecorder::discard,
           "Drops GPU fingerprints not launched yet (recording stopped).")
      .def("unwritten", &EntryRecorder::unwritten, py::arg("tensor"),
           "Knows a tensor as memory nobody has written (allocated by compiled code).")
      .def_property_readonly("reads", &EntryRecorder::reads);
  m.attr("FLAG_VIEW") = kFlagView;
  m.attr("FLAG_UNINITIALIZED") = kFlagUninitialized;
  m.attr("FLAG_UNREADABLE") = kFlagUnreadable;
  m.attr("FLAG_WRITTEN") = kFlagWritten;
}

}  // namespace opguard
