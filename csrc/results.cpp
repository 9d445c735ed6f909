#include "results.h"

namespace py = pybind11;

namespace opguard {
namespace {

// (min, max, mean, absmax, nan_count, inf_count) over the finite values, or None.
py::object stats_tuple(const Fingerprint& fp, Kind kind) {
  if (!has_stats(kind)) return py::none();
  const auto& s = fp.stats;
  py::object none = py::none();
  const bool any = s.finite > 0;
  return py::make_tuple(any ? py::object(py::float_(s.min)) : none,
                        any ? py::object(py::float_(s.max)) : none,
                        any ? py::object(py::float_(s.sum / static_cast<double>(s.finite))) : none,
                        any ? py::object(py::float_(s.absmax)) : none, s.nan, s.inf);
}

py::bytes head_bytes(const Fingerprint& fp) {
  return py::bytes(reinterpret_cast<const char*>(fp.head.data()), fp.head.size());
}

// Below this many bytes hashing takes less time than handing the GIL to another thread and
// getting it back, which the trace writer's thread would turn into a wait on every op.
constexpr int64_t kReleaseGilBytes = 256 << 10;

}  // namespace

Fingerprint fingerprint_cpu_releasing_gil(const TensorView& view, int64_t head_elements,
                                          bool sketch) {
  int64_t nbytes = view.itemsize;
  for (int64_t s : view.sizes) nbytes *= s;
  if (nbytes < kReleaseGilBytes) return fingerprint_cpu(view, head_elements, sketch);
  py::gil_scoped_release release;
  return fingerprint_cpu(view, head_elements, sketch);
}

py::object sketch_bytes(const Fingerprint& fp) {
  if (!fp.sketch) return py::none();
  return py::bytes(reinterpret_cast<const char*>(fp.sketch->data()), fp.sketch->size());
}

py::tuple result_tuple(const Fingerprint& fp, Kind kind) {
  return py::make_tuple(fp.hash, fp.nbytes, head_bytes(fp), stats_tuple(fp, kind),
                        sketch_bytes(fp));
}

}  // namespace opguard
