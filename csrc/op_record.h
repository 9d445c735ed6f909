// One op's record as the recorder builds it: its tensor entries in native form, and the rest of
// the record (index, name, step, phase, call site, arguments) packed by Python. Packed into the
// trace's msgpack map once every content is known: at once when none waits for the GPU, else on
// the trace writer's thread, which resolves and packs a batch of records without the GIL.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "content.h"
#include "msgpack_out.h"
#include "tensor_probe.h"

namespace opguard {

// A tensor entry of a record (keys of opguard/store/schema.py).
struct Entry {
  std::string slot;            // "n"
  const DtypeInfo* dtype;      // "d"
  std::vector<int64_t> sizes;  // "s"
  std::string device;          // "v"
  bool strided = false;        // "t" (strides) only for strided tensors
  std::vector<int64_t> strides;
  int flags = 0;          // the entry's own flags (view, written), merged into "f"
  int64_t producer = -1;  // "p": (op index, output slot) when a recorded op wrote it
  int64_t producer_slot = 0;
  ContentPtr content;  // "h", "z", "b", "m", "f"; null: none (in flight, a view
                       // whose content is not derivable)

  int all_flags() const { return flags | (content ? content->flags() : 0); }
  void pack(MsgpackOut& out) const;
};

class OpRecord {
 public:
  std::vector<Entry> inputs, outputs;
  // The op's first tensor input and its content: the base of a view op's outputs.
  pybind11::object base;
  ContentPtr base_content;

  // Whether some content still waits for the GPU.
  bool pending() const;
  // Waits for the GPU contents (without the GIL).
  void resolve();
  // Takes the rest of the record, `head` (a msgpack map of at most 13 fields, packed by
  // Python), and returns the whole record packed, or None when it must wait for the GPU.
  pybind11::object finish(pybind11::bytes head);
  // The packed record; its contents must be resolved.
  std::string pack() const;
  // Resolves and packs a batch of finished records, waiting for the GPU and packing without
  // the GIL.
  static pybind11::list pack_all(const pybind11::list& records);

 private:
  std::string head_;
};

void bind_op_record(pybind11::module_& m);

}  // namespace opguard
