// The recorder's call-stack walk in C++: it runs for every forward op over a stack that is often
// a hundred frames deep (nn.Module call wrappers, library decorators), where the same walk in
// Python cost ~40 µs per op.
#pragma once

#include <pybind11/pybind11.h>

#include <cstdint>
#include <unordered_map>
#include <vector>

namespace opguard {

// Walks the current thread's Python stack and returns its innermost user frame's site id and
// the id of the whole user stack. Whether a code object is user code, the site id of a (code,
// instruction) and the id of a stack are asked of Python once each and cached; cached code
// objects are kept alive, so their addresses stay unique.
class StackWalker {
 public:
  StackWalker(pybind11::function is_user_code, pybind11::function site_id,
              pybind11::function stack_id);

  // (site id, stack id) of the stack from `start` outwards (the current frame when None), or
  // None when no frame is user code (autograd's threads). Since Python 3.11 a frame object is
  // made on demand for each frame the walk passes: starting at the op's caller skips making
  // them for the recorder's own frames between it and this call.
  pybind11::object capture(const pybind11::object& start);

 private:
  struct SiteKey {
    const PyObject* code;
    int lasti;
    bool operator==(const SiteKey& o) const { return code == o.code && lasti == o.lasti; }
  };
  struct SiteKeyHash {
    size_t operator()(const SiteKey& k) const {
      return std::hash<const void*>()(k.code) * 31 + std::hash<int>()(k.lasti);
    }
  };
  // Hash of a stack's site ids, for the cache of interned stacks.
  struct StackHash {
    size_t operator()(const std::vector<int64_t>& sites) const {
      size_t h = sites.size();
      for (int64_t s : sites) h = h * 1000003u ^ std::hash<int64_t>()(s);
      return h;
    }
  };

  bool is_user(const pybind11::object& code);
  int64_t site(const pybind11::object& frame, const pybind11::object& code, int lasti);

  pybind11::function is_user_code_;
  pybind11::function site_id_;
  pybind11::function stack_id_;
  std::unordered_map<const PyObject*, bool> user_;
  std::unordered_map<SiteKey, int64_t, SiteKeyHash> site_ids_;
  std::unordered_map<std::vector<int64_t>, int64_t, StackHash> stacks_;
  std::vector<pybind11::object> kept_;  // every cached code object, alive for as long as the walker
};

void bind_callstack(pybind11::module_& m);

}  // namespace opguard
