// The content fields of a trace entry ("h", "z", "b", "m", "w", or a flag "f"): known when the op
// is recorded (a CPU fingerprint, a flag), or only once the GPU has computed them (a device
// tensor's fingerprint whose kernel may still be running, or a view's fingerprint derived from
// one). Every record that reuses a fingerprint shares one Content.
//
// Content holds no Python objects: the trace writer's thread resolves GPU contents and packs the
// records that hold them without the GIL (op_record.h). Before, each GPU record was completed
// and packed as Python dicts on that thread, taking the GIL from the training for ~25 µs per op.
#pragma once

#include <pybind11/pybind11.h>

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "fingerprint_cpu.h"
#include "msgpack_out.h"
#if OPGUARD_WITH_CUDA
#include "fingerprint_cuda.h"
#endif

namespace opguard {

class Content;
using ContentPtr = std::shared_ptr<Content>;

class Content {
 public:
  // {"f": flag}: memory not read (unreadable, uninitialized).
  static ContentPtr flag(int flag);
  // A fingerprint taken now (on the CPU).
  static ContentPtr fingerprint(Fingerprint fp, Kind kind);
  // {"h", "z", "f": view} of a view whose content is its base's read through `geometry` =
  // (byte offset, kind, itemsize, *sizes, *strides): equal bases and equal geometry mean equal
  // views, so the hash keeps every comparison the diff makes without reading memory. `base`
  // must carry a hash (has_hash()); when it is still on the GPU, so is the view's. With
  // `base_order` (the view holds the base's values in the base's logical order: a reshape, an
  // alias), the base's sketch ("w") is the view's too; other views have none.
  static ContentPtr view_of(const ContentPtr& base, std::vector<int64_t> geometry, int64_t nbytes,
                            bool base_order);
#if OPGUARD_WITH_CUDA
  // A fingerprint queued on `fingerprinter`, which lives as long as the process; its ticket is
  // set when the queue is launched (TensorProbe::flush).
  static ContentPtr gpu(cuda::GpuFingerprinter* fingerprinter);
  void launched(const cuda::Ticket& ticket) { ticket_ = ticket; }
#endif

  // The entry flags it carries (FLAG_UNINITIALIZED, FLAG_UNREADABLE, FLAG_VIEW).
  int flags() const { return flags_; }
  // Whether it has a hash views can derive theirs from (a fingerprint, now or on the GPU).
  bool has_hash() const { return state_ != State::Flag; }
  // Whether its fields wait for the GPU.
  bool pending() const { return !resolved_.load(std::memory_order_acquire); }

  // Waits for its GPU fields, if any (the caller should not hold the GIL). Only one thread
  // resolves (the trace writer's); the recording thread may read a content the moment it is
  // resolved, which the release/acquire of `resolved_` makes safe.
  void resolve();
  // The number of its fields, and their keys and values (resolved first), with the entry's own
  // flags `entry_flags` (view, written) merged into its "f" (present when any flag is set),
  // and its sketch ("w") where `with_sketch` (step-level entries keep it for the tensors the
  // tolerant step-level diff judges only, so that a step's record stays small).
  size_t field_count(int entry_flags, bool with_sketch = true) const;
  void pack(MsgpackOut& out, int entry_flags, bool with_sketch = true) const;
  // Its fields as a dict, resolving them first (waiting for the GPU without the GIL).
  pybind11::dict to_dict();

 private:
  enum class State { Flag, Fingerprint, View };
  // One allocation for the content and its count (make_shared), which needs a public
  // constructor: the tag keeps it to this class.
  struct Make {
    explicit Make() = default;
  };
  static ContentPtr make(State state) { return std::make_shared<Content>(Make{}, state); }
  // A view's hash (and sketch) from its resolved base's.
  void derive_from(const Content& base, const std::vector<int64_t>& geometry);

 public:
  Content(Make, State state) : state_(state) {}

 private:
  State state_;
  std::atomic<bool> resolved_{true};
  int flags_ = 0;
  Fingerprint fp_;  // Fingerprint: all of it; View: hash, nbytes and maybe the sketch
  Kind kind_ = Kind::Opaque;
#if OPGUARD_WITH_CUDA
  cuda::GpuFingerprinter* fingerprinter_ = nullptr;
  cuda::Ticket ticket_;
#endif
  ContentPtr base_;  // a view derived on resolution: the base's content
  std::vector<int64_t> geometry_;
  bool base_order_ = false;  // a view whose sketch is its base's
};

// Its fields as a dict, or a PendingFields when they wait for the GPU.
pybind11::object content_to_python(const ContentPtr& content);

// Adds PendingFields: the Python face of a GPU fingerprint (TensorProbe.fingerprint).
void bind_content(pybind11::module_& m);

}  // namespace opguard
