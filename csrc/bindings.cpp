// Python bindings of opguard._C. The extension is not built against libtorch: callers pass a
// raw address, element size, sizes and strides, so it does not break with torch's C++ ABI.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <string>

#include "call_recorder.h"
#include "callstack.h"
#include "content.h"
#include "fingerprint_cpu.h"
#include "op_plan.h"
#include "op_record.h"
#include "opscan.h"
#include "provenance.h"
#include "results.h"
#include "state_record.h"
#include "tensor_probe.h"
#if OPGUARD_WITH_CUDA
#include "cupti_activity.h"
#include "fingerprint_cuda.h"
#endif

namespace py = pybind11;
using opguard::Fingerprint;
using opguard::Kind;
using opguard::TensorView;

namespace {

constexpr int kFingerprintVersion = 1;

TensorView make_view(uintptr_t address, int64_t itemsize, std::vector<int64_t> sizes,
                     std::vector<int64_t> strides, int kind_code) {
  if (sizes.size() != strides.size()) throw py::value_error("sizes and strides differ in length");
  if (itemsize <= 0) throw py::value_error("itemsize must be positive");
  return TensorView{reinterpret_cast<const uint8_t*>(address), itemsize, std::move(sizes),
                    std::move(strides), static_cast<Kind>(kind_code)};
}

py::tuple fingerprint(uintptr_t address, int64_t itemsize, std::vector<int64_t> sizes,
                      std::vector<int64_t> strides, int kind_code, int64_t head_elements,
                      bool sketch) {
  const TensorView view =
      make_view(address, itemsize, std::move(sizes), std::move(strides), kind_code);
  return opguard::result_tuple(opguard::fingerprint_cpu_releasing_gil(view, head_elements, sketch),
                               view.kind);
}

uint64_t hash_buffer(py::buffer buffer) {
  py::buffer_info info = buffer.request();
  TensorView view{
      static_cast<const uint8_t*>(info.ptr), 1, {info.size * info.itemsize}, {1}, Kind::Opaque};
  return opguard::fingerprint_cpu_releasing_gil(view, 0).hash;
}

#if OPGUARD_WITH_CUDA
void bind_cuda(py::module_& m) {
  using opguard::cuda::GpuFingerprinter;
  py::class_<GpuFingerprinter>(m, "GpuFingerprinter",
                               "Fingerprints device tensors on their stream, without syncing.")
      .def(py::init<uint64_t, uint64_t, int>(), py::arg("partial_capacity") = 1 << 20,
           py::arg("head_capacity") = 1 << 17,
           // 32 resident warps per SM hide DRAM latency (bench/fingerprint_gpu.py)
           py::arg("blocks_per_sm") = 4)
      .def_property_readonly("launches", &GpuFingerprinter::launches,
                             "Tensors fingerprinted so far.")
      .def_property_readonly("kernel_launches", &GpuFingerprinter::kernel_launches,
                             "Kernel launches so far (a _foreach_ op's list shares one).");

  namespace cupti = opguard::cupti;
  m.def("cupti_start", &cupti::start, py::arg("library"),
        "Loads libcupti and enables kernel/memcpy/memset activity; '' or why not.");
  m.def("cupti_push", &cupti::push, py::arg("op"), "Ties GPU work launched from now to `op`.");
  m.def("cupti_pop", &cupti::pop);
  m.def("cupti_recorder_enter", &cupti::recorder_enter,
        "The calling thread records ops and now does OpGuard's own work (never reported).");
  m.def("cupti_recorder_leave", &cupti::recorder_leave, py::arg("last_recorded"),
        "Back to user code, after op `last_recorded`: its launches outside ops are unclaimed.");
  m.def("cupti_watch_unclaimed", &cupti::watch_unclaimed, py::arg("on"),
        "Whether GPU work launched outside any recorded op is reported.");
  m.def(
      "cupti_drain",
      [](bool all) {
        std::vector<std::pair<uint64_t, std::string>> by_op;
        {
          py::gil_scoped_release release;
          by_op = cupti::pack_by_op(cupti::drain(all));
        }
        py::list out(by_op.size());
        for (size_t i = 0; i < by_op.size(); ++i) {
          out[i] = py::make_tuple(by_op[i].first, py::bytes(by_op[i].second));
        }
        return out;
      },
      py::arg("all") = false,
      "[(op, packed kernel entries)], ops in order: each op's entries of the trace (schema.py) "
      "for the GPU activity drained, one msgpack array; an entry with u=1 was launched after "
      "op `op`, outside any recorded op.");
  m.def("cupti_pause", &cupti::pause,
        "Turns kernel collection off (callbacks and activity) until cupti_resume.");
  m.def("cupti_resume", &cupti::resume, "Turns it back on; '' or why not.");
  m.def("cupti_stop", &cupti::stop);
  m.def("cupti_counters", [] {
    const cupti::Counters c = cupti::counters();
    return py::dict(py::arg("buffers") = c.buffers, py::arg("records") = c.records,
                    py::arg("activities") = c.activities, py::arg("correlations") = c.correlations,
                    py::arg("unclaimed") = c.unclaimed);
  });
}
#endif

py::tuple cuda_status() {
#if OPGUARD_WITH_CUDA
  std::string why;
  if (opguard::cuda::available(&why)) return py::make_tuple(true, "available");
  return py::make_tuple(false, "CUDA is unavailable: " + why);
#else
  return py::make_tuple(false, "OpGuard was built without CUDA (OPGUARD_CUDA=OFF or no nvcc)");
#endif
}

}  // namespace

PYBIND11_MODULE(_C, m) {
  m.doc() = "OpGuard's native recorder core: tensor fingerprints on the CPU and the GPU.";
  m.attr("FINGERPRINT_VERSION") = kFingerprintVersion;
  m.attr("CUDA_BUILT") = static_cast<bool>(OPGUARD_WITH_CUDA);
  m.def("fingerprint", &fingerprint, py::arg("address"), py::arg("itemsize"), py::arg("sizes"),
        py::arg("strides"), py::arg("kind"), py::arg("head_elements") = 8, py::arg("sketch") = true,
        "Fingerprint of a CPU tensor given by raw address, element size, sizes and strides "
        "(in elements). Returns (hash, nbytes, head_bytes, stats, sketch) where stats is "
        "(min, max, mean, absmax, nan_count, inf_count) over finite values, or None, and "
        "sketch the stored sketch (opguard/store/sketch.py, 60 bytes) or None. sketch=False "
        "leaves the sketch out (None): what it costs is measured so (bench/sketch_cpu.py).");
  m.def("hash_buffer", &hash_buffer, py::arg("buffer"),
        "Fingerprint of a contiguous byte buffer (same algorithm as a uint8 tensor).");
  m.def("cuda_status", &cuda_status,
        "(usable, reason): whether GPU fingerprints can run here, and why not.");
  opguard::bind_opscan(m);
  opguard::bind_callstack(m);
  opguard::bind_tensor_probe(m);
  opguard::bind_content(m);
  opguard::bind_op_record(m);
  opguard::bind_provenance(m);
  opguard::bind_op_plan(m);
  opguard::bind_call_recorder(m);
  opguard::bind_state_record(m);
#if OPGUARD_WITH_CUDA
  bind_cuda(m);
#endif
}
