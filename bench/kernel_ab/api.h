// Plain-C interface of one variant of csrc/fingerprint_cuda.cu (harness only).
#pragma once
#include <cstdint>

struct HView {
  const uint8_t* data;
  int64_t itemsize;
  int ndim;
  int64_t sizes[16];
  int64_t strides[16];
  int kind;
};

struct HResult {
  uint64_t hash, nbytes;
  double min, max, sum, absmax;
  uint64_t finite, nan, inf;
  int32_t has_sketch;
  uint8_t sketch[60];
  int32_t head_len;
  uint8_t head[128];
};
