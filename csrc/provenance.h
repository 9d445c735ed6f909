// Where each live tensor came from, and what its content fingerprint is: the recorder's per-tensor
// path (entry, lookup, fingerprint, bookkeeping) in one native call per tensor.
//
// The recorder asks this before reading a tensor: if a recorded op wrote it (or it is a view of
// something recorded) and nothing wrote it since, its fingerprint is already known and its
// producer is that op. Two lookups:
//
// 1. by Python object (weakly held), for tensors that stay alive in Python, while they still
//    hold the memory they were known with (`x.data = y` swaps it without an op);
// 2. by storage, for the last non-view write of each storage (and leaves read so far), while that
//    storage is alive: an exact geometry match is that tensor; anything else is a view of it
//    (C++ composites create views and pass them on in new Python objects, as F.linear does with
//    weight.t()), whose fingerprint is derived from its base's.
//
// The storage must be alive (a weak reference to its Python object, which torch keeps for as long
// as the storage lives) because the allocator reuses addresses: a freed storage's address may now
// hold an unrelated tensor with an equal version number. Validity is the version counter torch
// bumps on every in-place write (shared by views of one storage). In-place ops bump it after the
// dispatch mode returns, so written tensors are "settled" (their version re-read) when the next
// op starts.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "content.h"
#include "op_record.h"
#include "tensor_probe.h"

namespace opguard {

// How an op's output gets its content fields (the recorder decides from the op's schema).
enum class OutputKind : int {
  Read = 0,                 // fingerprint its memory
  Uninitialized = 1,        // torch.empty and friends: content meaningless
  InFlight = 2,             // a collective still running: its first reader fingerprints it
  View = 3,                 // derived from the base (the op's first input) when possible
  ViewOfUninitialized = 4,  // a view of memory nobody has written yet
};

class EntryRecorder {
 public:
  // `probe`: the TensorProbe that reads tensors; `head_elements`: raw elements kept per entry.
  EntryRecorder(pybind11::object probe, int64_t head_elements);

  // Adds the entry of an op input to `op` and returns its flags. `verify`: read it even when
  // its producer's fingerprint is still valid.
  int input(OpRecord& op, std::string slot, pybind11::handle tensor, bool verify);
  // Adds the entry of output `op.outputs.size()` of op `index` and returns its flags. A view's
  // content derives from the op's first input (`op.base`) when it can.
  int output(OpRecord& op, std::string slot, pybind11::handle tensor, int64_t index,
             OutputKind kind, bool written);
  // Knows `tensor` as memory nobody has written: compiled code allocated it outside the
  // dispatcher. A kernel that reads it before a recorded op writes it (an in-place output
  // Inductor computes inside the kernel that reads it) gets the uninitialized flag, through any
  // alias, rather than a fingerprint of whatever the allocator's last user left there.
  void unwritten(pybind11::handle tensor);
  // Re-reads the versions of the last op's written tensors (bumped after it returned).
  void settle();
  void flush() { probe_.flush(); }
  void discard() { probe_.discard(); }
  double ring_load() { return probe_.ring_load(); }
  TensorProbe& probe() { return probe_; }
  // Tensors whose memory was read (or whose GPU read was launched) so far.
  int64_t reads() const { return reads_; }

 private:
  struct Known {
    pybind11::object ref;  // weak reference to the tensor
    int64_t index = -1;    // producing op; -1 for a leaf
    int64_t slot = 0;
    int64_t version = -1;
    ContentPtr content;  // null: not read yet
    bool has_address = false;
    uintptr_t address = 0;
    const DtypeInfo* dtype = nullptr;
    std::vector<int64_t> sizes, strides;
    bool strided = false;
    int64_t nbytes = 0;
    // Set when it holds its storage's latest content: a weak reference to the storage, and
    // whether views of it (found by storage) take fingerprints derived from its own.
    pybind11::object storage_ref;
    bool derivable = false;

    bool valid_for(int64_t current) const { return version >= 0 && version == current; }
    // Memory compiled code allocated that no recorded op has written (unwritten()): no code
    // of the user's reaches it, so --verify-inputs has no unseen write to find there, and a
    // read would fingerprint what the allocator's last user left.
    bool compiled_scratch() const;
  };
  using KnownPtr = std::shared_ptr<Known>;

  std::pair<KnownPtr, bool> find(pybind11::handle tensor, const TensorFacts& facts);
  KnownPtr remember(pybind11::handle tensor, const TensorFacts& facts, int64_t index, int64_t slot,
                    ContentPtr content, bool written, bool owns_storage);
  ContentPtr read(pybind11::handle tensor, const TensorFacts& facts);
  // The entry of a tensor whose facts are no longer needed (its sizes and strides move in).
  Entry entry(TensorFacts facts, pybind11::handle tensor, std::string slot);
  // A view's content derived from its base's (of dtype `base_dtype`); null when it cannot be
  // (see view_content in the .cpp).
  ContentPtr view_content(pybind11::handle view, const TensorFacts& facts, uintptr_t base_address,
                          int64_t base_nbytes, const DtypeInfo* base_dtype, const ContentPtr& base);
  bool same_geometry(const Known& known, pybind11::handle tensor, const TensorFacts& facts);
  void sweep();

  pybind11::object probe_owner_;
  TensorProbe& probe_;
  int64_t head_elements_;
  std::unordered_map<uintptr_t, KnownPtr> by_object_;   // id(tensor) ->
  std::unordered_map<uintptr_t, KnownPtr> by_storage_;  // storage address ->
  std::vector<std::pair<pybind11::object, KnownPtr>> unsettled_;
  size_t sweep_at_ = kFirstSweep;
  int64_t reads_ = 0;
  static constexpr size_t kFirstSweep = 1 << 14;
};

void bind_provenance(pybind11::module_& m);

}  // namespace opguard
