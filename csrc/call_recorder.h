// The dispatch mode's per-op path in one native call: an ATen call's inputs walked, the op run
// between CUPTI's push and pop, its outputs walked, its phase and call site found, and its
// record finished and queued for the trace writer. The same path as Python glue around the
// native walks cost ~12 µs of interpreter time per op on a GPU host's CPU, a third of what the
// recorder added to a host-bound op (docs/PERFORMANCE.md).
//
// The Python mode (opguard/recorder/mode.py) decides which calls take this path. It records
// the others itself (collectives, random ops, --capture, compiled regions) and then finishes
// them here too (`finish`), so phases, call sites and records are made in one place.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <memory>
#include <unordered_map>

#include "callstack.h"
#include "op_plan.h"
#include "op_record.h"
#include "provenance.h"

namespace opguard {

class CallRecorder {
 public:
  // `entries` (EntryRecorder) and `walker` (StackWalker) do the walks; `writer` is the trace
  // writer (append, wake, make_room, error); `steps` holds the step counter and the optimizer
  // flag; `autograd` is torch's (current autograd node, grad enabled, sequence number)
  // functions; `phases` the trace's (forward, backward, optimizer, other) codes; the writer
  // packs (make_room) once the GPU result rings are `ring_drain` full and writes (wake) as each
  // backward pass starts; `fail` is a weak reference to the callable that stops recording on a
  // failure of the recorder.
  CallRecorder(pybind11::object entries, pybind11::object walker, pybind11::object writer,
               pybind11::object steps, pybind11::tuple autograd, pybind11::tuple phases,
               double ring_drain, pybind11::object fail);

  // Records one call of the op `plan` describes (name `name_id`), made from Python frame
  // `caller`, and returns its result. An error of the op itself propagates; an error of the
  // recorder stops recording and the op still runs once.
  pybind11::object call(const OpPlan& plan, int64_t name_id, pybind11::handle func,
                        const pybind11::tuple& args, const pybind11::dict& kwargs,
                        const pybind11::object& caller);

  // Finishes op `next_index`, whose inputs `op` holds and which returned `out`: its outputs,
  // phase, call site and record, which is queued. The other fields are those of
  // OpPlan::outputs and OpRecord::finish (`origins`: the call-site ids of the source lines a
  // generated kernel came from). Returns the outputs to capture when `capturing`.
  pybind11::object finish(const OpPlan& plan, const std::shared_ptr<OpRecord>& op,
                          pybind11::handle out, const pybind11::object& written, int64_t name_id,
                          const pybind11::object& arguments, const pybind11::object& rng,
                          bool in_flight, bool capturing, const pybind11::object& caller,
                          const pybind11::object& origins);

  // (call site, stack) of the forward op an autograd node of this sequence number came
  // from, or None: a backward op's call site is its forward op's.
  pybind11::object forward_site(uint64_t sequence_nr) const;
  // Drops per-step state at a step boundary: the forward call sites of backward ops.
  void forget_step() { forward_sites_.clear(); }

  int64_t next_index = 0;     // the index the next recorded op gets
  int64_t region_phase = -1;  // the phase of ops inside a compiled region (-1: from grad mode)
  bool verify = false;        // read every input again (record --verify-inputs)
  bool kernels = false;       // CUPTI collects GPU activity: tie launches to ops

 private:
  struct Forward {
    int64_t index;
    pybind11::object located;
  };
  struct Location {
    int64_t phase;
    pybind11::object forward, located;
  };

  Location locate(int64_t index, const pybind11::object& caller);
  const Forward* forward_of(uint64_t sequence_nr) const;
  // Stops recording and reports the exception being handled.
  void fail();

  pybind11::object entries_owner_, walker_owner_;
  EntryRecorder& entries_;
  StackWalker& walker_;
  pybind11::object append_, wake_, make_room_, steps_, fail_;
  pybind11::object current_node_, grad_enabled_, sequence_nr_;
  int64_t forward_, backward_, optimizer_, other_;
  double ring_drain_;
  bool in_backward_ = false;  // the last op recorded ran in a backward pass
  int64_t last_sequence_nr_ = -1;
  std::unordered_map<int64_t, Forward> forward_sites_;  // by autograd sequence number
};

void bind_call_recorder(pybind11::module_& m);

}  // namespace opguard
