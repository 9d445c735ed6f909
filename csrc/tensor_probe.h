// What the recorder reads of a torch tensor for each trace entry (dtype, shape, strides,
// device) and the start of its fingerprint. Each entry used to cost ~20 Python-level attribute
// reads, calls and dict updates (~20 µs for a GPU output on a GPT-2 step with 7,500 entries);
// here the same attributes are read through the CPython API, once per tensor.
// The extension still does not link libtorch: the tensor is only ever used as a Python object.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "content.h"
#include "fingerprint.h"

namespace opguard {

// The trace's entry flags (FLAG_* in opguard/store/schema.py; a test keeps them equal).
constexpr int kFlagView = 1;
constexpr int kFlagUninitialized = 2;
constexpr int kFlagUnreadable = 4;
constexpr int kFlagWritten = 8;

struct DtypeInfo {
  std::string name;  // stored name (float32, bfloat16)
  Kind kind;
  int64_t itemsize;
};

// One read of a tensor's Python attributes: everything its entry and fingerprint need.
struct TensorFacts {
  bool readable = false;  // plain, strided, not nested, on the CPU or a CUDA device
  bool strided = false;   // has strides (entry key "t")
  bool cuda = false;
  bool cpu = false;
  int device = -1;  // CUDA device index
  const DtypeInfo* dtype = nullptr;
  std::vector<int64_t> sizes;  // empty for a nested tensor (it has no single shape)
  std::vector<int64_t> strides;
  // Asked of torch on first use (TensorProbe::address, has_lazy_bits), then remembered: an
  // entry needs each up to three times.
  mutable int8_t address_known = 0;  // 0: not asked yet, 1: `address` holds it, -1: none
  mutable uintptr_t address = 0;
  mutable int8_t lazy_bits = -1;  // -1: not asked yet

  int64_t numel() const;
  // Whether a strided tensor is contiguous in torch's default sense (is_contiguous(): size-1
  // dimensions take any stride, an empty tensor is contiguous), without asking torch.
  bool contiguous() const;
  int64_t nbytes() const { return numel() * dtype->itemsize; }
};

class TensorProbe {
 public:
  // plain_types: the tensor classes whose memory is read (torch.Tensor first, nn.Parameter);
  // strided: torch.strided; dtype_info(dtype) -> (name, kind code, itemsize), asked once per
  // dtype; raw_stream(device) -> the current stream of a CUDA device as an integer; gpu() ->
  // the process's GpuFingerprinter, asked for on the first CUDA tensor.
  TensorProbe(pybind11::tuple plain_types, pybind11::object strided, pybind11::object dtype_info,
              pybind11::object raw_stream, pybind11::object gpu);

  TensorFacts read(pybind11::handle tensor);
  // read() for a tensor of the training state, which every step boundary reads again
  // (parameters, optimizer states: the same objects step after step): their facts, first
  // element's address and lazy bits included, are kept from the last read and reused while the
  // object is alive and still has that address, shape and strides, which is checked by three
  // attribute reads instead of ten. What else could change with all three kept (dtype, device,
  // lazy bits) changes only by assigning `.data` a reinterpretation of the same memory.
  TensorFacts read_remembered(pybind11::handle tensor);
  // isinstance(obj, torch.Tensor)
  bool is_tensor(pybind11::handle obj) const;
  // Whether obj is exactly one of the plain tensor classes (no subclass).
  bool is_plain(pybind11::handle obj) const;
  // The device name an entry stores ("cpu", "cuda:0").
  std::string device_name(pybind11::handle tensor, const TensorFacts& facts);
  // The content of a CPU tensor (its fingerprint), of a CUDA tensor (pending: its kernel is
  // queued for the current stream and launched by flush()), or {"f": unreadable} when its
  // memory cannot be read.
  ContentPtr fingerprint(pybind11::handle tensor, const TensorFacts& facts, int64_t head_elements);
  // Launches the GPU fingerprints this thread queued, runs of them in one kernel; called before
  // the op runs (for its inputs) and before its record is queued (for its outputs).
  void flush();
  // Drops this thread's queued launches (recording stopped); their fields never resolve.
  void discard();
  // The fraction of the GPU result rings waiting to be collected (0 before any GPU tensor).
  double ring_load();
  // The first element's address; false when the tensor has no storage (sparse, nested).
  bool address(pybind11::handle tensor, const TensorFacts& facts, uintptr_t* out);
  // Whether the conjugate or negative bit is set: its stored bytes are not its values.
  bool has_lazy_bits(pybind11::handle tensor, const TensorFacts& facts);
  // Whether views of this tensor can take fingerprints derived from its own: its memory is
  // read, it is contiguous and it has no lazy bits.
  bool views_derive_from(pybind11::handle tensor, const TensorFacts& facts);
  // The tensor's version counter; -1 for inference tensors (never trusted).
  int64_t version(pybind11::handle tensor);

 private:
  const DtypeInfo& dtype(pybind11::handle dtype);
  ContentPtr launch(const TensorFacts& facts, uintptr_t address, int64_t head_elements);

  static constexpr double kRingWaitSeconds = 60.0;
  // Entries of dead tensors are dropped when the kept facts reach this many, then twice as
  // many as survived the last sweep (losses and RNG states are new objects every step).
  static constexpr size_t kFirstSweep = 4096;

  // A tensor's facts as read_remembered keeps them; `ref` is a weak reference to the tensor:
  // an entry whose tensor died is never taken for a new object at the same address.
  struct Remembered {
    pybind11::object ref;
    TensorFacts facts;
  };
  // The kept facts of `tensor`, when they still hold; nullptr otherwise.
  const TensorFacts* remembered(pybind11::handle tensor);
  bool still_holds(pybind11::handle tensor, const Remembered& kept);
  void sweep_remembered();

  std::vector<PyObject*> plain_types_;  // borrowed: classes outlive the recorder
  pybind11::object strided_, dtype_info_, raw_stream_, make_gpu_, gpu_;
  std::unordered_map<PyObject*, DtypeInfo> dtypes_;
  std::unordered_map<PyObject*, Remembered> remembered_;
  size_t sweep_at_ = kFirstSweep;
  std::vector<pybind11::object> keep_;
};

void bind_tensor_probe(pybind11::module_& m);

}  // namespace opguard
