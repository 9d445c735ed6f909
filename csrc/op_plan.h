// An op's arguments and results walked the way the recorder records them, in one native call
// each per op: tensor arguments become the op's input entries, the tensors it returns or
// writes its output entries, and the other arguments [name, value] pairs that msgpack carries.
// The same walks in Python cost a function call and several isinstance checks per argument
// and per result, on every op.
#pragma once

#include <pybind11/pybind11.h>

#include <memory>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "provenance.h"

namespace opguard {

// A tensor an op returned or wrote, in output order.
struct Result {
  std::string slot;
  pybind11::handle tensor;
  bool written;
};

// The plain tensors an op returned, nested lists included, in the slots "0", "1", "1[0]"... A
// tensor subclass wrapping another (_c10d_functional::_wrap_tensor_autograd) is left out: it
// may hold no storage, and its content is recorded where it is unwrapped.
std::vector<Result> returned_tensors(const TensorProbe& probe, pybind11::handle result);

// One call's inputs as the input walk left them (OpPlan::walk_inputs).
struct WalkedInputs {
  std::shared_ptr<OpRecord> op;  // the record, holding the input entries
  pybind11::object written;      // (slot, tensor) of the written tensor arguments, or None
  pybind11::list arguments;      // (name, value) of the non-tensor arguments
  pybind11::object taken;        // when capturing, (position, slot, tensor) to capture; else None
};

// What the walks need of an op's schema, built once per op overload (OpInfo.plan).
class OpPlan {
 public:
  // `names`: the arguments' names, in order; `written`: the arguments it writes (in place,
  // out=); `write_only`: the out= ones, whose old content is not an input; `defaults`: (name,
  // encoded value, position) of non-tensor arguments recorded when left out; `is_view`: its
  // outputs are views of its first input; `uninitialized_output`: its outputs hold memory
  // nobody wrote (torch.empty); `uninitialized_slots`: the outputs holding partly unwritten
  // memory; `encode`: the Python encoder of non-tensor values other than None, bool, int,
  // float, str and lists of them.
  OpPlan(const std::vector<std::string>& names, const std::vector<std::string>& written,
         const std::vector<std::string>& write_only, const pybind11::iterable& defaults,
         bool is_view, bool uninitialized_output,
         const std::vector<std::string>& uninitialized_slots, pybind11::object encode);

  // Adds the inputs of one call to a new OpRecord, launching their GPU fingerprints, and returns
  // (op, written, arguments, taken):
  // `written` lists (slot, tensor) of the written tensor arguments, None when there are none;
  // `arguments` the (name, value) pairs of the non-tensor ones; `taken`, when `capturing`,
  // (input position, slot, tensor) of each input whose memory was written (None otherwise).
  pybind11::tuple inputs(EntryRecorder& entries, const pybind11::tuple& args,
                         const pybind11::dict& kwargs, bool verify, bool capturing) const;
  // The same walk, for native callers (CallRecorder).
  WalkedInputs walk_inputs(EntryRecorder& entries, const pybind11::tuple& args,
                           const pybind11::dict& kwargs, bool verify, bool capturing) const;

  // Adds the outputs of op `index` to `op`, launching their GPU fingerprints: the plain tensors
  // `result` holds (nested lists included), then the `written` arguments it did not return.
  // `in_flight`: a collective's result still being computed. Returns, when `capturing`, (output
  // position, slot, tensor) of each output whose memory was read (None otherwise).
  pybind11::object outputs(EntryRecorder& entries, OpRecord& op, pybind11::handle result,
                           const pybind11::object& written, int64_t index, bool in_flight,
                           bool capturing) const;

  // A non-tensor value as the trace stores it (None, numbers, strings and lists here, the
  // rest by the Python encoder).
  pybind11::object encode(pybind11::handle value) const;

 private:
  enum Role : int { kWritten = 1, kWriteOnly = 2 };
  struct Default {
    pybind11::str name;
    pybind11::object value;
    size_t position;
  };
  struct InputWalk;

  int role(const std::string& name) const;
  OutputKind output_kind(const OpRecord& op, const std::string& slot, bool in_flight) const;

  std::vector<pybind11::str> names_;
  std::vector<std::string> name_texts_;
  std::unordered_map<std::string, int> roles_;
  std::vector<Default> defaults_;
  bool is_view_, uninitialized_output_;
  std::unordered_set<std::string> uninitialized_slots_;
  pybind11::object encode_;
};

void bind_op_plan(pybind11::module_& m);

}  // namespace opguard
