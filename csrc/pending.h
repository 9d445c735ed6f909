// Content fields that are known only once the GPU has computed them: a device tensor's
// fingerprint (its kernel may still be running), or a view's fingerprint derived from such a
// tensor's. Resolved once, on the trace writer's thread; every record that reuses a
// fingerprint shares the same object.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "fingerprint_cpu.h"
#if OPGUARD_WITH_CUDA
#include "fingerprint_cuda.h"
#endif

namespace opguard {

// {"h", "z", "f": view} of a view whose content is its base's (hash `base_hash`) read through
// `geometry` = (byte offset, kind, itemsize, *sizes, *strides): equal bases and equal geometry
// mean equal views, so the hash keeps every comparison the diff makes without reading memory.
pybind11::dict derived_fields(uint64_t base_hash, const std::vector<int64_t>& geometry,
                              int64_t nbytes);

class PendingFields {
 public:
#if OPGUARD_WITH_CUDA
  // A fingerprint queued on `fingerprinter` (kept alive until collected); its ticket is set
  // when the queue is launched (TensorProbe::flush).
  explicit PendingFields(pybind11::object fingerprinter);
  void launched(const cuda::Ticket& ticket) { ticket_ = ticket; }
#endif
  // A view of `base` (a PendingFields) with this geometry (see derived_fields).
  PendingFields(pybind11::object base, std::vector<int64_t> geometry, int64_t nbytes);

  pybind11::dict resolve();
  // Resolves many at once: one wait without the GIL for the batch. Collecting them one by one
  // hands the GIL back and forth with the training thread on every tensor, which cost more host
  // time than the recorder's own work on a GPU step.
  static void resolve_all(const pybind11::list& pending);

 private:
  PendingFields* gpu_root();

  std::optional<pybind11::dict> fields_;
  uint64_t hash_ = 0;
#if OPGUARD_WITH_CUDA
  pybind11::object fingerprinter_;
  cuda::Ticket ticket_;
  void complete(const Fingerprint& fp);
  void check_launched() const;
#endif
  pybind11::object base_;  // derived: the base's PendingFields
  std::vector<int64_t> geometry_;
  int64_t nbytes_ = 0;
};

void bind_pending(pybind11::module_& m);

}  // namespace opguard
