#include "pending.h"

#include <cstring>
#include <unordered_set>

#include "names.h"
#include "results.h"
#include "tensor_probe.h"

namespace py = pybind11;

namespace opguard {
namespace {

constexpr double kCollectSeconds = 600.0;  // a kernel queued behind this long a step is stuck

}  // namespace

py::dict derived_fields(uint64_t base_hash, const std::vector<int64_t>& geometry, int64_t nbytes) {
  // little-endian u64 base hash, then each geometry value as a little-endian i64
  std::vector<uint8_t> bytes(8 * (1 + geometry.size()));
  std::memcpy(bytes.data(), &base_hash, 8);
  std::memcpy(bytes.data() + 8, geometry.data(), 8 * geometry.size());
  const TensorView view{bytes.data(), 1, {static_cast<int64_t>(bytes.size())}, {1}, Kind::Opaque};
  const Names& k = names();
  py::dict fields;
  fields[k.h] = py::int_(fingerprint_cpu(view, 0).hash);
  fields[k.z] = py::int_(nbytes);
  fields[k.f] = py::int_(kFlagView);
  return fields;
}

#if OPGUARD_WITH_CUDA
PendingFields::PendingFields(py::object fingerprinter) : fingerprinter_(std::move(fingerprinter)) {}

void PendingFields::check_launched() const {
  if (ticket_.seq == 0) {
    throw std::runtime_error("a GPU fingerprint was never launched (recording stopped first)");
  }
}

void PendingFields::complete(const Fingerprint& fp) {
  fields_ = entry_fields(fp, static_cast<Kind>(ticket_.kind));
  hash_ = fp.hash;
  fingerprinter_ = py::none();
}
#endif

PendingFields::PendingFields(py::object base, std::vector<int64_t> geometry, int64_t nbytes)
    : base_(std::move(base)), geometry_(std::move(geometry)), nbytes_(nbytes) {}

PendingFields* PendingFields::gpu_root() {
  PendingFields* p = this;
  while (p->base_) p = &p->base_.cast<PendingFields&>();
  return p;
}

py::dict PendingFields::resolve() {
  if (fields_) return *fields_;
  if (base_) {
    auto& base = base_.cast<PendingFields&>();
    base.resolve();
    fields_ = derived_fields(base.hash_, geometry_, nbytes_);
    return *fields_;
  }
#if OPGUARD_WITH_CUDA
  check_launched();
  auto& fingerprinter = fingerprinter_.cast<cuda::GpuFingerprinter&>();
  Fingerprint fp;
  {
    py::gil_scoped_release release;
    fp = fingerprinter.collect(ticket_, kCollectSeconds);
  }
  complete(fp);
  return *fields_;
#else
  throw std::logic_error("a GPU fingerprint in a build without CUDA");
#endif
}

void PendingFields::resolve_all(const py::list& pending) {
#if OPGUARD_WITH_CUDA
  std::vector<PendingFields*> launched;  // in order, once each
  std::unordered_set<PendingFields*> seen;
  for (py::handle item : pending) {
    PendingFields* root = item.cast<PendingFields&>().gpu_root();
    if (!root->fields_ && seen.insert(root).second) {
      root->check_launched();
      launched.push_back(root);
    }
  }
  std::vector<cuda::GpuFingerprinter*> fingerprinters;
  for (PendingFields* p : launched) {
    fingerprinters.push_back(&p->fingerprinter_.cast<cuda::GpuFingerprinter&>());
  }
  std::vector<Fingerprint> results(launched.size());
  {
    py::gil_scoped_release release;
    for (size_t i = 0; i < launched.size(); ++i) {
      results[i] = fingerprinters[i]->collect(launched[i]->ticket_, kCollectSeconds);
    }
  }
  for (size_t i = 0; i < launched.size(); ++i) launched[i]->complete(results[i]);
#else
  (void)pending;
#endif
}

void bind_pending(py::module_& m) {
  py::class_<PendingFields>(m, "PendingFields",
                            "Content fields of a GPU fingerprint (or of a view derived from "
                            "one), known once its kernel has run.")
      .def("resolve", &PendingFields::resolve,
           "The entry's content fields, waiting for the GPU if needed (once).")
      .def_static("resolve_all", &PendingFields::resolve_all, py::arg("pending"),
                  "Resolves a list of PendingFields, waiting without the GIL once.");
}

}  // namespace opguard
