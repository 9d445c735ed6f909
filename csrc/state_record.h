// Step-level records (opguard/store/states.py): the training state's tensors at a step boundary
// (gradients, parameters, optimizer states, buffers, RNG states, the loss).
//
// A step's few hundred tensors are fingerprinted by one call, so that one flush launches them
// all (runs of contiguous tensors of one dtype share a kernel) instead of a Python round trip
// and a launch per tensor, and the record is packed on the trace writer's thread, where GPU
// results are waited for without the GIL: the training thread never waits for the GPU.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "content.h"
#include "tensor_probe.h"

namespace opguard {

// One tensor of the state: its label (the packed start of its entry, see state_label), what
// its entry keeps of it (dtype and shape: no strides or device, to keep a step small) and its
// content (a CPU fingerprint, a pending GPU one, or the unreadable flag).
struct StateTensor {
  std::string label;
  const DtypeInfo* dtype;
  std::vector<int64_t> sizes;
  ContentPtr content;
};

// Tensors fingerprinted by one fingerprint_all call; `sketch`: their entries keep their sketch
// ("w": the loss, gradients, parameters and buffers, whose distances the tolerant step-level
// diff judges), else leave it out (optimizer states: a step's record stays small).
struct StateBatch {
  std::vector<StateTensor> tensors;
  bool sketch = false;
};

// The packed start of a state entry: a 4-element array's header, kind, name id and slot (the
// tensor entry follows). Made once per state tensor name, not per step.
std::string state_label(const std::string& kind, int64_t name_id, const std::string& slot);

// Fingerprints `tensors` (plain tensors; anything unreadable gets the unreadable flag) with
// `labels[i]` (state_label bytes) for tensors[i]: CPU ones now, GPU ones queued on each
// device's current stream and launched by one flush; `sketch`: their entries keep their sketch.
std::shared_ptr<StateBatch> fingerprint_all(TensorProbe& probe, const pybind11::list& tensors,
                                            const pybind11::list& labels, int64_t head_elements,
                                            bool sketch);

// The state entries of every batch, in order, as one packed msgpack array (a step record's
// entries, opguard/store/states.py), waiting for GPU fingerprints without the GIL.
pybind11::bytes pack_entries(const pybind11::list& batches);

void bind_state_record(pybind11::module_& m);

}  // namespace opguard
