// CPU fingerprint of a strided tensor, read in place through a raw pointer.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "fingerprint.h"

namespace opguard {

struct TensorView {
  const uint8_t* data;  // address of the first logical element (storage offset applied)
  int64_t itemsize;     // bytes per element
  std::vector<int64_t> sizes;
  std::vector<int64_t> strides;  // in elements
  Kind kind;
};

struct Fingerprint {
  uint64_t hash = 0;
  uint64_t nbytes = 0;        // length of the logical byte stream
  std::vector<uint8_t> head;  // raw bytes of the first elements, in logical order
  Stats stats = Stats::empty();
  std::optional<StoredSketch> sketch;  // the stored sketch ("w"), where the tensor has one
};

// Drops size-1 dimensions and merges dimensions contiguous with their inner neighbour, so most
// views become one or two runs. Shared by the CPU and CUDA paths.
void coalesce(const TensorView& v, std::vector<int64_t>& sizes, std::vector<int64_t>& strides);

// Hashes `view` in logical order without copying it, keeping the raw bytes of its first
// `head_elements` elements and, for kinds with stats, the statistics and (with `sketch`, for
// floating kinds) the sketch. Pure function of the bytes: safe to call with the GIL released.
// `sketch` is false only to measure what the sketch costs (bench/sketch_cpu.py).
Fingerprint fingerprint_cpu(const TensorView& view, int64_t head_elements, bool sketch = true);

}  // namespace opguard
