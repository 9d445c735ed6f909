// GPU fingerprints: the algorithm of fingerprint.h, launched on the stream an op ran on, with
// results landing in mapped pinned host memory. No host synchronisation: the host polls a
// per-block sequence number that each block writes after its result.
#pragma once

#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <vector>

#include "fingerprint_cpu.h"

namespace opguard {
namespace cuda {

constexpr int kMaxDims = 16;
constexpr int kHeadBytes = 128;  // 8 elements of up to 16 bytes

// One block's share of a tensor's fingerprint, written by the GPU into host memory.
struct alignas(16) Partial {
  uint64_t hash;
  double min;
  double max;
  double absmax;
  double sum;
  uint64_t nan;
  uint64_t inf;
  SketchSums sketch;  // sketched kinds only
  // The launch's sequence number, written last (after a system fence): the partial is complete.
  // 64 bits never repeat, so ring slots need no resetting between launches (a host write to
  // each of a launch's partials cost more than the launch itself).
  volatile uint64_t seq;
};

struct Ticket {
  uint64_t seq = 0;     // launch sequence number, written by the GPU into each partial
  uint64_t first = 0;   // first partial in the ring (absolute position)
  uint32_t blocks = 0;  // partials this launch writes
  uint64_t head_slot = 0;
  uint64_t nbytes = 0;
  uint64_t numel = 0;
  int itemsize = 1;
  int kind = 0;
  int head_bytes = 0;
};

struct Plan;  // how one tensor is fingerprinted (fingerprint_cuda.cu)

// Owns the mapped result rings. launch() runs on the thread that ran the op, collect() on the
// trace writer's thread; the ring bookkeeping is guarded by a mutex.
class GpuFingerprinter {
 public:
  // blocks_per_sm: the largest grid of one tensor's launch, per SM of the device.
  GpuFingerprinter(uint64_t partial_capacity, uint64_t head_capacity, int blocks_per_sm);
  ~GpuFingerprinter();
  GpuFingerprinter(const GpuFingerprinter&) = delete;
  GpuFingerprinter& operator=(const GpuFingerprinter&) = delete;

  // Enqueues the fingerprint of a device tensor on `stream` (a cudaStream_t as an integer) of
  // `device`. Waits (up to `timeout_s`) only when the result rings are full; with a timeout of
  // zero it never waits and returns a ticket with `seq == 0` instead (the caller may then wait
  // without holding locks the collecting thread needs, e.g. Python's GIL).
  Ticket launch(const TensorView& view, int device, uintptr_t stream, int64_t head_elements,
                double timeout_s);
  // launch() of each view, in order, all on `device` and `stream`; runs of contiguous tensors
  // of one kind share one kernel launch (results identical to launching them one by one).
  // Appends their tickets; returns how many were launched: all, or with a zero timeout and
  // full rings, those before the first that found no space.
  size_t launch_many(const std::vector<TensorView>& views, int device, uintptr_t stream,
                     int64_t head_elements, double timeout_s, std::vector<Ticket>* tickets);
  bool ready(const Ticket& t) const;
  // Waits for the ticket's kernels, reduces the partials in block order, frees ring space.
  Fingerprint collect(const Ticket& t, double timeout_s);
  uint64_t launches() const { return seq_; }  // tensors fingerprinted
  // The fraction of the result rings held by results not collected yet.
  double load() const;
  uint64_t kernel_launches() const { return kernel_launches_; }

 private:
  void reclaim();
  bool wait_for_space(uint64_t blocks, uint64_t heads, double timeout_s);
  Plan plan(const TensorView& view, int64_t head_elements) const;
  Ticket issue(Plan& plan);  // ring slots for one tensor; the mutex is held
  Ticket launch_planned(Plan& plan, int device, uintptr_t stream, double timeout_s);

  Partial* partials_ = nullptr;  // host pointer (mapped; same address on the device with UVA)
  uint8_t* heads_ = nullptr;
  uint64_t partial_capacity_;
  uint64_t max_blocks_ = 528;  // blocks per launch: a few per SM
  uint64_t head_capacity_;
  uint64_t seq_ = 0;
  uint64_t kernel_launches_ = 0;
  uint64_t partial_head_ = 0;  // next partial to hand out (absolute, modulo capacity in use)
  uint64_t head_next_ = 0;
  // Outstanding tickets in launch order and whether each has been collected: ring space is
  // returned in launch order.
  struct Outstanding {
    uint64_t seq, first, blocks, head_slot;
    bool collected;
  };
  std::deque<Outstanding> outstanding_;
  mutable std::mutex mutex_;
  uint64_t partial_tail_ = 0;
  uint64_t head_tail_ = 0;
};

// Whether a CUDA driver and device are usable; fills `why` when not.
bool available(std::string* why);

}  // namespace cuda
}  // namespace opguard
