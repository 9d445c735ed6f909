// Python bindings of opguard._C. The extension is not built against libtorch: callers pass a
// raw address, element size, sizes and strides, so it does not break with torch's C++ ABI.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include "fingerprint_cpu.h"

namespace py = pybind11;
using opguard::Fingerprint;
using opguard::Kind;
using opguard::TensorView;

namespace {

constexpr int kFingerprintVersion = 1;

py::object stats_tuple(const Fingerprint& fp, Kind kind) {
  if (!opguard::has_stats(kind)) return py::none();
  const auto& s = fp.stats;
  py::object none = py::none();
  const bool any = s.finite > 0;
  return py::make_tuple(any ? py::object(py::float_(s.min)) : none,
                        any ? py::object(py::float_(s.max)) : none,
                        any ? py::object(py::float_(s.sum / static_cast<double>(s.finite))) : none,
                        any ? py::object(py::float_(s.absmax)) : none, s.nan, s.inf);
}

py::tuple fingerprint(uintptr_t address, int64_t itemsize, std::vector<int64_t> sizes,
                      std::vector<int64_t> strides, int kind_code, int64_t head_elements) {
  if (sizes.size() != strides.size()) throw py::value_error("sizes and strides differ in length");
  if (itemsize <= 0) throw py::value_error("itemsize must be positive");
  const Kind kind = static_cast<Kind>(kind_code);
  TensorView view{reinterpret_cast<const uint8_t*>(address), itemsize, std::move(sizes),
                  std::move(strides), kind};
  Fingerprint fp;
  {
    py::gil_scoped_release release;
    fp = opguard::fingerprint_cpu(view, head_elements);
  }
  return py::make_tuple(fp.hash, fp.nbytes,
                        py::bytes(reinterpret_cast<const char*>(fp.head.data()), fp.head.size()),
                        stats_tuple(fp, kind));
}

uint64_t hash_buffer(py::buffer buffer) {
  py::buffer_info info = buffer.request();
  TensorView view{
      static_cast<const uint8_t*>(info.ptr), 1, {info.size * info.itemsize}, {1}, Kind::Opaque};
  py::gil_scoped_release release;
  return opguard::fingerprint_cpu(view, 0).hash;
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "OpGuard's native recorder core: tensor fingerprints.";
  m.attr("FINGERPRINT_VERSION") = kFingerprintVersion;
  m.def("fingerprint", &fingerprint, py::arg("address"), py::arg("itemsize"), py::arg("sizes"),
        py::arg("strides"), py::arg("kind"), py::arg("head_elements") = 8,
        "Fingerprint of a CPU tensor given by raw address, element size, sizes and strides "
        "(in elements). Returns (hash, nbytes, head_bytes, stats) where stats is "
        "(min, max, mean, absmax, nan_count, inf_count) over finite values, or None.");
  m.def("hash_buffer", &hash_buffer, py::arg("buffer"),
        "Fingerprint of a contiguous byte buffer (same algorithm as a uint8 tensor).");
}
