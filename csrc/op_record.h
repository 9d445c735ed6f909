// One op's record as the recorder builds it: its tensor entries in native form, and the rest of
// the record (index, name, step, phase, call site, arguments), packed as the op finishes. Packed
// into the trace's msgpack map once every content is known: at once when none waits for the GPU,
// else on the trace writer's thread, which resolves and packs a batch of records without the
// GIL.
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
  // Set for a view op: its first tensor input, that input's content and what the input walk
  // read of it are kept as the base of its outputs (read once, not again for each view). Only
  // view ops keep it: holding it while the op runs would keep a compiled region's first input
  // alive after Inductor frees it (it clears the argument list as it goes).
  bool keeps_base = false;
  pybind11::object base;
  ContentPtr base_content;
  TensorFacts base_facts;

  // Forgets the first input: only a view op's outputs need it.
  void drop_base();
  // Whether some content still waits for the GPU.
  bool pending() const;
  // Waits for the GPU contents (without the GIL).
  void resolve();
  // Takes the rest of the record (keys of opguard/store/schema.py; None: absent) and returns
  // the whole record packed, or None when it must wait for the GPU. `arguments`, `rng`,
  // `value` and `origins` hold None, bool, int, float, str, bytes, lists, tuples and dicts of
  // them.
  pybind11::object finish(int64_t index, int64_t name_id, int64_t step, int64_t phase,
                          const pybind11::object& forward, const pybind11::object& located,
                          const pybind11::object& arguments, const pybind11::object& rng,
                          const pybind11::object& value, const pybind11::object& origins);
  // The packed record; its contents must be resolved.
  std::string pack() const;
  // Resolves and packs a batch of finished records, waiting for the GPU and packing without
  // the GIL.
  static pybind11::list pack_all(const pybind11::list& records);

 private:
  std::string head_;  // the fields before the entries, packed
  size_t head_fields_ = 0;
};

void bind_op_record(pybind11::module_& m);

}  // namespace opguard
