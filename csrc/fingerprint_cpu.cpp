#include "fingerprint_cpu.h"

#include <algorithm>
#include <array>
#include <cstring>
#include <type_traits>

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

// Decoders specialised on the kind and item size (no runtime memcpy length, no loops, no
// branches), for the stats pass. Component `i` of a run: element i / comps, part i % comps.
inline float bits_to_float(uint32_t b) {
  float f;
  std::memcpy(&f, &b, 4);
  return f;
}
inline uint32_t float_to_bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, 4);
  return b;
}

// Exact and branch-free: the exponent/mantissa bits shifted into a float and rescaled by
// 2^(127-15) handle normals and subnormals alike; all-ones exponents become Inf/NaN.
inline float half_to_float_fast(uint16_t h) {
  const uint32_t em = h & 0x7FFFu;
  const float scaled = bits_to_float(em << 13) * 0x1p112f;
  const uint32_t special = 0x7F800000u | (em & 0x3FFu) << 13;
  const uint32_t bits = em >= 0x7C00u ? special : float_to_bits(scaled);
  return bits_to_float(bits | static_cast<uint32_t>(h & 0x8000u) << 16);
}

// 256-entry tables for the 8-bit float formats, filled once from the reference decoder.
template <Kind K>
const float* minifloat_table() {
  static const auto table = [] {
    std::array<float, 256> t{};
    for (int v = 0; v < 256; ++v) {
      const uint8_t b = static_cast<uint8_t>(v);
      t[v] = static_cast<float>(decode_component(&b, K, 1, 0));
    }
    return t;
  }();
  return table.data();
}

template <Kind K, int ISZ>
inline double decode_fast(const uint8_t* p, int64_t i, const float* table) {
  if constexpr (K == Kind::Bool) {
    return p[i] != 0 ? 1.0 : 0.0;
  } else if constexpr (K == Kind::UInt || K == Kind::Int) {
    using U = std::conditional_t<
        ISZ == 1, uint8_t,
        std::conditional_t<ISZ == 2, uint16_t, std::conditional_t<ISZ == 4, uint32_t, uint64_t>>>;
    using S = std::make_signed_t<U>;
    U u;
    std::memcpy(&u, p + i * ISZ, ISZ);
    if constexpr (K == Kind::Int)
      return static_cast<double>(static_cast<S>(u));
    else
      return static_cast<double>(u);
  } else if constexpr (K == Kind::Float16 || K == Kind::Complex32) {
    uint16_t h;
    std::memcpy(&h, p + 2 * i, 2);
    return half_to_float_fast(h);
  } else if constexpr (K == Kind::BFloat16) {
    uint16_t h;
    std::memcpy(&h, p + 2 * i, 2);
    return bits_to_float(static_cast<uint32_t>(h) << 16);
  } else if constexpr (K == Kind::Float32 || K == Kind::Complex64) {
    float f;
    std::memcpy(&f, p + 4 * i, 4);
    return f;
  } else if constexpr (K == Kind::Float64 || K == Kind::Complex128) {
    double d;
    std::memcpy(&d, p + 8 * i, 8);
    return d;
  } else {  // 8-bit floats
    return table[p[i]];
  }
}

// Two doubles (one SSE2 or NEON register) and their bits: the sketch's arithmetic on pairs.
using Pair = double __attribute__((vector_size(16)));
using PairBits = uint64_t __attribute__((vector_size(16)));

// The sign bits of two consecutive elements of a sketch group, by the two bits of its word that
// choose them: (bit l) << 63 to XOR into element l of the pair.
constexpr PairBits kSignMasks[4] = {
    {0, 0}, {1ull << 63, 0}, {0, 1ull << 63}, {1ull << 63, 1ull << 63}};

// A pair with its NaNs and infinities zeroed (sketch_value on two lanes: a compare and an AND).
inline Pair finite_or_zero(Pair v) {
  const PairBits magnitude = reinterpret_cast<PairBits>(v) & ~(1ull << 63);
  const PairBits finite = reinterpret_cast<Pair>(magnitude) <= __DBL_MAX__;  // all ones or 0
  return reinterpret_cast<Pair>(reinterpret_cast<PairBits>(v) & finite);
}

// Accumulates stats for a run of contiguous elements, branch-free: each component is
// classified with one comparison (|v| <= DBL_MAX is false exactly for NaN and +-Inf) and
// folded in with selects, in eight lanes with a fixed pattern (deterministic sum order).
// With kSketch (floating kinds: one component per element), the run's elements, logical
// indices `first`, `first + 1`, ..., also go into `sketch` in the same pass: each eight-lane
// block is one group when `first` is a multiple of eight (one hash, signs by XOR on pairs, one
// bucket add), else it straddles two (the next group's word carried to the next block: still
// one hash); the run's last elements are added one by one. NaNs and infinities add 0.
template <Kind K, int ISZ, bool kSketch>
void stats_run(const uint8_t* p, int64_t count, uint64_t first, Stats& out, SketchSums& sketch) {
  constexpr int kLanes = 8;
  static_assert(kLanes == kSketchGroup, "a block of lanes is a sketch group");
  constexpr double kInf = __builtin_inf();
  const float* table = nullptr;
  if constexpr (K == Kind::F8E4M3FN || K == Kind::F8E4M3FNUZ || K == Kind::F8E5M2 ||
                K == Kind::F8E5M2FNUZ || K == Kind::F8E8M0FNU)
    table = minifloat_table<K>();
  double mn[kLanes], mx[kLanes], sum[kLanes], amax[kLanes];
  uint64_t fin[kLanes], nan[kLanes];
  for (int l = 0; l < kLanes; ++l) {
    mn[l] = kInf;
    mx[l] = -kInf;
    sum[l] = 0.0;
    amax[l] = 0.0;
    fin[l] = 0;
    nan[l] = 0;
  }
  const int64_t n = count * components_of(K);
  auto step = [&](int l, double v) {
    const double a = __builtin_fabs(v);
    const bool finite = a <= __DBL_MAX__;
    const double lo = finite ? v : kInf, hi = finite ? v : -kInf;
    mn[l] = lo < mn[l] ? lo : mn[l];
    mx[l] = hi > mx[l] ? hi : mx[l];
    const double fa = finite ? a : 0.0;
    amax[l] = fa > amax[l] ? fa : amax[l];
    sum[l] += finite ? v : 0.0;
    fin[l] += finite;
    nan[l] += v != v;
  };
  int64_t i = 0;
  if constexpr (kSketch) {
    Pair squares[kLanes / 2] = {};  // lane l in squares[l / 2][l % 2]
    double buckets[kSketchBuckets] = {};
    const int shift = static_cast<int>(first % kSketchGroup);
    uint64_t group = first / kSketchGroup;
    if (shift == 0) {
      for (; i + kLanes <= n; i += kLanes, ++group) {
        const uint64_t word = sketch_word(group);
        double v[kLanes];
        for (int l = 0; l < kLanes; ++l) v[l] = decode_fast<K, ISZ>(p, i + l, table);
        for (int l = 0; l < kLanes; ++l) step(l, v[l]);
        Pair pairs[kLanes / 2];
        std::memcpy(pairs, v, sizeof v);
        for (int k = 0; k < kLanes / 2; ++k) {
          pairs[k] = finite_or_zero(pairs[k]);
          squares[k] += pairs[k] * pairs[k];
          const PairBits signs = kSignMasks[(word >> (2 * k)) & 3];
          pairs[k] = reinterpret_cast<Pair>(reinterpret_cast<PairBits>(pairs[k]) ^ signs);
        }
        const Pair total = (pairs[0] + pairs[1]) + (pairs[2] + pairs[3]);
        buckets[sketch_bucket(word)] += total[0] + total[1];
      }
    } else {  // lanes [0, 8 - shift) end group `group`, the others start the next one
      uint64_t word = sketch_word(group);
      for (; i + kLanes <= n; i += kLanes, ++group) {
        const uint64_t next = sketch_word(group + 1);
        double this_group = 0.0, next_group = 0.0;
        for (int l = 0; l < kLanes; ++l) {
          const double raw = decode_fast<K, ISZ>(p, i + l, table);
          step(l, raw);
          const double v = sketch_value(raw);
          squares[l / 2][l % 2] += v * v;
          const bool here = shift + l < kSketchGroup;
          const double s = sketch_signed(here ? word : next, (shift + l) % kSketchGroup, v);
          this_group += here ? s : 0.0;
          next_group += here ? 0.0 : s;
        }
        buckets[sketch_bucket(word)] += this_group;
        buckets[sketch_bucket(next)] += next_group;
        word = next;
      }
    }
    for (; i < n; ++i) {
      const double raw = decode_fast<K, ISZ>(p, i, table);
      step(0, raw);
      const double v = sketch_value(raw);
      squares[0][0] += v * v;
      const uint64_t index = first + static_cast<uint64_t>(i);
      const uint64_t word = sketch_word(index / kSketchGroup);
      buckets[sketch_bucket(word)] +=
          sketch_signed(word, static_cast<int>(index % kSketchGroup), v);
    }
    SketchSums run = SketchSums::empty();
    for (int l = 0; l < kLanes; ++l) run.squares += squares[l / 2][l % 2];
    for (int b = 0; b < kSketchBuckets; ++b) run.buckets[b] = buckets[b];
    sketch.merge(run);
  } else {
    for (; i + kLanes <= n; i += kLanes)
      for (int l = 0; l < kLanes; ++l) step(l, decode_fast<K, ISZ>(p, i + l, table));
    for (; i < n; ++i) step(0, decode_fast<K, ISZ>(p, i, table));
  }
  for (int l = 0; l < kLanes; ++l) {
    Stats s{mn[l], mx[l], sum[l], amax[l], fin[l], nan[l], 0};
    out.merge(s);
  }
  out.inf += static_cast<uint64_t>(n) - [&] {
    uint64_t t = 0;
    for (int l = 0; l < kLanes; ++l) t += fin[l] + nan[l];
    return t;
  }();
}

// A run's stats (and sketch): `first` is the logical index of its first element.
using StatsFn = void (*)(const uint8_t* p, int64_t count, uint64_t first, Stats& out,
                         SketchSums& sketch);

template <Kind K>
StatsFn by_itemsize(int64_t itemsize) {
  switch (itemsize) {
    case 1:
      return &stats_run<K, 1, false>;
    case 2:
      return &stats_run<K, 2, false>;
    case 4:
      return &stats_run<K, 4, false>;
    case 8:
      return &stats_run<K, 8, false>;
    default:
      return nullptr;
  }
}

template <Kind K>
StatsFn floating(bool sketch) {
  return sketch ? &stats_run<K, 0, true> : &stats_run<K, 0, false>;
}

StatsFn stats_fn_for(Kind kind, int64_t itemsize, bool sketch) {
  switch (kind) {
    case Kind::UInt:
      return by_itemsize<Kind::UInt>(itemsize);
    case Kind::Int:
      return by_itemsize<Kind::Int>(itemsize);
#define OPG_CASE(K) \
  case Kind::K:     \
    return &stats_run<Kind::K, 0, false>;
      OPG_CASE(Bool)
      OPG_CASE(Complex32)
      OPG_CASE(Complex64)
      OPG_CASE(Complex128)
#undef OPG_CASE
#define OPG_CASE(K) \
  case Kind::K:     \
    return floating<Kind::K>(sketch);
      OPG_CASE(Float16)
      OPG_CASE(BFloat16)
      OPG_CASE(Float32)
      OPG_CASE(Float64)
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

Fingerprint fingerprint_cpu(const TensorView& view, int64_t head_elements, bool sketch) {
  Fingerprint fp;
  int64_t numel = 1;
  for (int64_t s : view.sizes) numel *= s;
  if (numel == 0) return fp;

  const int64_t isz = view.itemsize;
  const StatsFn stats = stats_fn_for(view.kind, view.itemsize, sketch);
  SketchSums sums = SketchSums::empty();
  uint64_t next_index = 0;  // the logical index of the next element consumed
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
      if (stats) stats(p + off, n / isz, next_index + off / isz, fp.stats, sums);
    }
    next_index += count;
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
  StoredSketch stored;
  if (sketch && store_sketch(view.kind, fp.stats, sums, stored)) fp.sketch = stored;
  return fp;
}

}  // namespace opguard
