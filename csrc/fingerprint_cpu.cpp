#include "fingerprint_cpu.h"

#include <algorithm>
#include <cstring>

namespace opguard {
namespace {

uint64_t load_le64(const uint8_t* p) {
  uint64_t w;
  std::memcpy(&w, p, sizeof w);  // x86-64 and aarch64 Linux are little-endian
  return w;
}

// Consumes the logical byte stream in arbitrary segments and sums mix(word, index).
class WordHasher {
 public:
  void feed(const uint8_t* p, size_t n) {
    total_ += n;
    if (carry_len_ > 0) {
      const size_t take = std::min(n, 8 - carry_len_);
      std::memcpy(carry_ + carry_len_, p, take);
      carry_len_ += take;
      p += take;
      n -= take;
      if (carry_len_ < 8) return;
      hash_ += mix_word(load_le64(carry_), index_++);
      carry_len_ = 0;
    }
    const size_t words = n / 8;
    // Four independent sums keep the multiply pipelines full; addition mod 2^64 is
    // associative, so the result equals the single-sum definition.
    uint64_t h0 = 0, h1 = 0, h2 = 0, h3 = 0;
    size_t k = 0;
    for (; k + 4 <= words; k += 4) {
      h0 += mix_word(load_le64(p + 8 * k), index_ + k);
      h1 += mix_word(load_le64(p + 8 * k + 8), index_ + k + 1);
      h2 += mix_word(load_le64(p + 8 * k + 16), index_ + k + 2);
      h3 += mix_word(load_le64(p + 8 * k + 24), index_ + k + 3);
    }
    for (; k < words; ++k) h0 += mix_word(load_le64(p + 8 * k), index_ + k);
    hash_ += h0 + h1 + h2 + h3;
    index_ += words;
    const size_t rest = n - 8 * words;
    if (rest) {
      std::memcpy(carry_, p + 8 * words, rest);
      carry_len_ = rest;
    }
  }

  uint64_t finish() {
    if (carry_len_ > 0) {
      std::memset(carry_ + carry_len_, 0, 8 - carry_len_);
      hash_ += mix_word(load_le64(carry_), index_++);
      carry_len_ = 0;
    }
    return hash_;
  }

  uint64_t total() const { return total_; }

 private:
  uint64_t hash_ = 0;
  uint64_t index_ = 0;
  uint64_t total_ = 0;
  uint8_t carry_[8] = {};
  size_t carry_len_ = 0;
};

// Accumulates stats for a run of contiguous elements. Eight lanes in a fixed pattern keep the
// loop free of a serial dependency on `sum` while staying deterministic.
template <Kind K>
void stats_run(const uint8_t* p, int64_t count, int64_t itemsize, Stats& out) {
  constexpr int kLanes = 8;
  Stats lanes[kLanes];
  for (auto& l : lanes) l = Stats::empty();
  const int comps = components_of(K);
  int64_t i = 0;
  for (; i + kLanes <= count; i += kLanes)
    for (int l = 0; l < kLanes; ++l)
      for (int c = 0; c < comps; ++c)
        lanes[l].add(decode_component(p + (i + l) * itemsize, K, static_cast<int>(itemsize), c));
  for (; i < count; ++i)
    for (int c = 0; c < comps; ++c)
      lanes[0].add(decode_component(p + i * itemsize, K, static_cast<int>(itemsize), c));
  for (auto& l : lanes) out.merge(l);
}

using StatsFn = void (*)(const uint8_t*, int64_t, int64_t, Stats&);

StatsFn stats_fn_for(Kind kind) {
  switch (kind) {
#define OPG_CASE(K) \
  case Kind::K:     \
    return &stats_run<Kind::K>;
    OPG_CASE(Bool)
    OPG_CASE(UInt)
    OPG_CASE(Int)
    OPG_CASE(Float16)
    OPG_CASE(BFloat16)
    OPG_CASE(Float32)
    OPG_CASE(Float64)
    OPG_CASE(Complex32)
    OPG_CASE(Complex64)
    OPG_CASE(Complex128)
    OPG_CASE(F8E4M3FN)
    OPG_CASE(F8E4M3FNUZ)
    OPG_CASE(F8E5M2)
    OPG_CASE(F8E5M2FNUZ)
    OPG_CASE(F8E8M0FNU)
#undef OPG_CASE
    default:
      return nullptr;
  }
}

}  // namespace

void coalesce(const TensorView& v, std::vector<int64_t>& sizes, std::vector<int64_t>& strides) {
  sizes.clear();
  strides.clear();
  for (size_t d = 0; d < v.sizes.size(); ++d) {
    if (v.sizes[d] == 1) continue;
    if (!sizes.empty() && strides.back() == v.strides[d] * v.sizes[d]) {
      sizes.back() *= v.sizes[d];
      strides.back() = v.strides[d];
    } else {
      sizes.push_back(v.sizes[d]);
      strides.push_back(v.strides[d]);
    }
  }
}

Fingerprint fingerprint_cpu(const TensorView& view, int64_t head_elements) {
  Fingerprint fp;
  int64_t numel = 1;
  for (int64_t s : view.sizes) numel *= s;
  if (numel == 0) return fp;

  const int64_t isz = view.itemsize;
  const StatsFn stats = stats_fn_for(view.kind);
  WordHasher hasher;
  const int64_t head_bytes = std::min(head_elements, numel) * isz;
  fp.head.reserve(static_cast<size_t>(head_bytes));

  // A run is a segment of elements adjacent in memory and in logical order.
  auto consume_run = [&](const uint8_t* p, int64_t count) {
    const int64_t bytes = count * isz;
    constexpr int64_t kChunk = 1 << 14;  // hash and stats per L1-sized chunk: one pass over DRAM
    for (int64_t off = 0; off < bytes; off += kChunk) {
      const int64_t n = std::min(kChunk, bytes - off);
      hasher.feed(p + off, static_cast<size_t>(n));
      if (stats) stats(p + off, n / isz, isz, fp.stats);
    }
    const int64_t missing = head_bytes - static_cast<int64_t>(fp.head.size());
    if (missing > 0) fp.head.insert(fp.head.end(), p, p + std::min(missing, bytes));
  };

  std::vector<int64_t> sizes, strides;
  coalesce(view, sizes, strides);
  if (sizes.empty() || (sizes.size() == 1 && strides[0] == 1)) {
    consume_run(view.data, numel);
  } else {
    const int ndim = static_cast<int>(sizes.size());
    const bool inner_contiguous = strides[ndim - 1] == 1;
    const int outer_dims = inner_contiguous ? ndim - 1 : ndim;
    const int64_t run = inner_contiguous ? sizes[ndim - 1] : 1;
    std::vector<int64_t> index(outer_dims, 0);
    int64_t offset = 0;
    // Strided single elements are staged so the hasher sees long segments.
    std::vector<uint8_t> staging;
    if (!inner_contiguous) staging.reserve(1 << 14);
    auto flush_staging = [&] {
      if (!staging.empty()) consume_run(staging.data(), static_cast<int64_t>(staging.size()) / isz);
      staging.clear();
    };
    for (int64_t done = 0; done < numel; done += run) {
      const uint8_t* p = view.data + offset * isz;
      if (inner_contiguous) {
        consume_run(p, run);
      } else {
        staging.insert(staging.end(), p, p + isz);
        if (static_cast<int64_t>(staging.size()) >= (1 << 14)) flush_staging();
      }
      for (int d = outer_dims - 1; d >= 0; --d) {  // odometer increment
        offset += strides[d];
        if (++index[d] < sizes[d]) break;
        offset -= strides[d] * sizes[d];
        index[d] = 0;
      }
    }
    flush_staging();
  }
  fp.hash = hasher.finish();
  fp.nbytes = hasher.total();
  return fp;
}

}  // namespace opguard
