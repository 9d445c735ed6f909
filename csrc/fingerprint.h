// The OpGuard fingerprint: one algorithm shared by the CPU and CUDA paths.
//
// A tensor's fingerprint is defined over its *logical byte stream*: the raw bytes of its
// elements in row-major logical order (so a tensor and its contiguous copy agree), cut into
// little-endian 64-bit words, the last one zero-padded. The hash is
//
//     sum over j of mix(word_j, j)   (mod 2^64)
//
// where mix is a bijection in the word for every fixed index j. Integer addition is
// associative and commutative, so any parallel reduction order gives the same value (CPU and
// GPU agree bit for bit); a single changed element changes exactly one word and therefore the
// hash; moving an element changes its index and therefore (with overwhelming probability) the
// hash, which the XOR-reduction of torch.hash_tensor cannot see.
//
// Hashing words rather than elements means a 2-byte dtype costs one mix per four elements.
#pragma once

#include <math.h>

#include <array>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define OPG_HD __host__ __device__ __forceinline__
#else
#define OPG_HD inline
#endif

namespace opguard {

// Element kinds the stats pass understands. Values are part of the Python binding contract
// (opguard/fingerprint.py mirrors them); append only.
enum class Kind : int32_t {
  Opaque = 0,  // hashed, no stats (quantized, bit, packed sub-byte dtypes)
  Bool = 1,
  UInt = 2,  // unsigned integers of itemsize bytes
  Int = 3,   // signed integers of itemsize bytes
  Float16 = 4,
  BFloat16 = 5,
  Float32 = 6,
  Float64 = 7,
  Complex32 = 8,    // two float16
  Complex64 = 9,    // two float32
  Complex128 = 10,  // two float64
  F8E4M3FN = 11,
  F8E4M3FNUZ = 12,
  F8E5M2 = 13,
  F8E5M2FNUZ = 14,
  F8E8M0FNU = 15,
};

constexpr uint64_t kIndexKey = 0x9E3779B97F4A7C15ull;
constexpr uint64_t kIndexSalt = 0x632BE59BD9B4E019ull;

// Murmur3's 64-bit finaliser: a bijection with full avalanche.
OPG_HD uint64_t fmix64(uint64_t x) {
  x ^= x >> 33;
  x *= 0xFF51AFD7ED558CCDull;
  x ^= x >> 33;
  x *= 0xC4CEB9FE1A85EC53ull;
  x ^= x >> 33;
  return x;
}

// The per-word term: XOR with an index-dependent key (a bijection for fixed j), then avalanche.
OPG_HD uint64_t mix_word(uint64_t word, uint64_t index) {
  return fmix64(word ^ (index * kIndexKey + kIndexSalt));
}

OPG_HD float half_to_float(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1Fu;
  uint32_t mant = h & 0x3FFu;
  uint32_t bits;
  if (exp == 0) {
    if (mant == 0) {
      bits = sign;
    } else {  // subnormal: normalise
      int e = -1;
      do {
        mant <<= 1;
        ++e;
      } while ((mant & 0x400u) == 0);
      bits = sign | static_cast<uint32_t>(127 - 15 - e) << 23 | (mant & 0x3FFu) << 13;
    }
  } else if (exp == 0x1F) {
    bits = sign | 0x7F800000u | mant << 13;
  } else {
    bits = sign | (exp + 127 - 15) << 23 | mant << 13;
  }
  float f;
  memcpy(&f, &bits, sizeof f);
  return f;
}

OPG_HD float bf16_to_float(uint16_t b) {
  const uint32_t bits = static_cast<uint32_t>(b) << 16;
  float f;
  memcpy(&f, &bits, sizeof f);
  return f;
}

// Generic 8-bit minifloat decoder. `fnuz` formats have a single NaN (0x80), no infinity and
// no negative zero; e4m3fn has no infinity and NaN at all-ones; e5m2 is IEEE-like.
OPG_HD float minifloat_to_float(uint8_t v, int exp_bits, int mant_bits, int bias, bool fnuz,
                                bool ieee_specials) {
  const float nan = __builtin_nanf("");
  if (fnuz && v == 0x80) return nan;
  const int sign = v >> 7;
  const int exp = (v >> mant_bits) & ((1 << exp_bits) - 1);
  const int mant = v & ((1 << mant_bits) - 1);
  const int exp_max = (1 << exp_bits) - 1;
  if (ieee_specials && exp == exp_max) {
    if (mant != 0) return nan;
    return sign ? -__builtin_inff() : __builtin_inff();
  }
  if (!ieee_specials && !fnuz && exp == exp_max && mant == (1 << mant_bits) - 1) return nan;
  float value;
  if (exp == 0) {
    value = ldexpf(static_cast<float>(mant), 1 - bias - mant_bits);
  } else {
    value = ldexpf(static_cast<float>(mant + (1 << mant_bits)), exp - bias - mant_bits);
  }
  return sign ? -value : value;
}

// Decodes component `c` (0 = real, 1 = imaginary) of an element into a double for the stats.
// Only valid for kinds with stats (not Opaque).
OPG_HD double decode_component(const uint8_t* p, Kind kind, int itemsize, int c) {
  switch (kind) {
    case Kind::Bool:
      return p[0] != 0 ? 1.0 : 0.0;
    case Kind::UInt: {
      uint64_t u = 0;
      memcpy(&u, p, itemsize);
      return static_cast<double>(u);
    }
    case Kind::Int: {
      switch (itemsize) {
        case 1:
          return static_cast<double>(static_cast<int8_t>(p[0]));
        case 2: {
          int16_t v;
          memcpy(&v, p, 2);
          return v;
        }
        case 4: {
          int32_t v;
          memcpy(&v, p, 4);
          return v;
        }
        default: {
          int64_t v;
          memcpy(&v, p, 8);
          return static_cast<double>(v);
        }
      }
    }
    case Kind::Float16:
    case Kind::Complex32: {
      uint16_t h;
      memcpy(&h, p + 2 * c, 2);
      return half_to_float(h);
    }
    case Kind::BFloat16: {
      uint16_t h;
      memcpy(&h, p, 2);
      return bf16_to_float(h);
    }
    case Kind::Float32:
    case Kind::Complex64: {
      float f;
      memcpy(&f, p + 4 * c, 4);
      return f;
    }
    case Kind::Float64:
    case Kind::Complex128: {
      double d;
      memcpy(&d, p + 8 * c, 8);
      return d;
    }
    case Kind::F8E4M3FN:
      return minifloat_to_float(p[0], 4, 3, 7, false, false);
    case Kind::F8E4M3FNUZ:
      return minifloat_to_float(p[0], 4, 3, 8, true, false);
    case Kind::F8E5M2:
      return minifloat_to_float(p[0], 5, 2, 15, false, true);
    case Kind::F8E5M2FNUZ:
      return minifloat_to_float(p[0], 5, 2, 16, true, false);
    case Kind::F8E8M0FNU:
      return p[0] == 0xFF ? static_cast<double>(__builtin_nanf("")) : ldexp(1.0, p[0] - 127);
    default:
      return 0.0;
  }
}

OPG_HD int components_of(Kind kind) {
  return (kind == Kind::Complex32 || kind == Kind::Complex64 || kind == Kind::Complex128) ? 2 : 1;
}

OPG_HD bool has_stats(Kind kind) { return kind != Kind::Opaque; }

// Running statistics over the finite values of a tensor (complex: over both components).
// Merging is exact for counts/min/max; `sum` is accumulated in a fixed order by each backend,
// so it is deterministic for a given backend and launch configuration.
struct Stats {
  double min;
  double max;
  double sum;
  double absmax;
  uint64_t finite;
  uint64_t nan;
  uint64_t inf;

  OPG_HD static Stats empty() {
    return Stats{__builtin_inf(), -__builtin_inf(), 0.0, 0.0, 0, 0, 0};
  }

  OPG_HD void add(double v) {
    if (v != v) {
      ++nan;
    } else if (v == __builtin_inf() || v == -__builtin_inf()) {
      ++inf;
    } else {
      min = v < min ? v : min;
      max = v > max ? v : max;
      const double a = v < 0 ? -v : v;
      absmax = a > absmax ? a : absmax;
      sum += v;
      ++finite;
    }
  }

  OPG_HD void merge(const Stats& o) {
    min = o.min < min ? o.min : min;
    max = o.max > max ? o.max : max;
    absmax = o.absmax > absmax ? o.absmax : absmax;
    sum += o.sum;
    finite += o.finite;
    nan += o.nan;
    inf += o.inf;
  }
};

// The sketch (opguard/store/sketch.py defines it; the constants must be equal): a count sketch of
// the values in logical order, from which the diff estimates two runs' relative L2 distance.
// Logical element i belongs to group g = i / kSketchGroup, whose word is sketch_word(g); the
// element goes to the word's bucket with the sign of the word's bit (i % kSketchGroup). One hash
// per group of eight keeps it cheap beside the fingerprint's stats pass. A NaN or an infinity
// adds 0 (sketch_value), so the finite part of a tensor (an attention mask's scores) is sketched.
constexpr uint64_t kSketchSalt = 0xD6E8FEB86659FD93ull;
constexpr int kSketchBuckets = 14;
constexpr int kSketchGroup = 8;
constexpr int kSketchFractionBits = 28;
constexpr int kSketchStoredBytes = 4 + 4 * kSketchBuckets;  // float32 norm, int32 buckets
constexpr int32_t kSketchSaturated = INT32_MIN;

using StoredSketch = std::array<uint8_t, kSketchStoredBytes>;

OPG_HD uint64_t sketch_word(uint64_t group) { return fmix64(group * kIndexKey + kSketchSalt); }

// The bucket of a group: the word's high 32 bits scaled to [0, kSketchBuckets) (a 32 x 32-bit
// product: one instruction on the GPU).
OPG_HD int sketch_bucket(uint64_t word) {
  const auto high = static_cast<uint32_t>(word >> 32);
  return static_cast<int>((static_cast<uint64_t>(high) * kSketchBuckets) >> 32);
}

// What an element adds to the sketch: its value where finite, 0 for a NaN or an infinity (one
// comparison and a select: |v| <= DBL_MAX is false exactly for those).
OPG_HD double sketch_value(double v) { return fabs(v) <= __DBL_MAX__ ? v : 0.0; }

// `v` with the sign of element `position` (0..7) of the group whose word is `word`: the sign
// bit flipped where the word's bit is set (a bit operation, no multiply or branch).
OPG_HD double sketch_signed(uint64_t word, int position, double v) {
  uint64_t bits;
  memcpy(&bits, &v, 8);
  bits ^= ((word >> position) & 1u) << 63;
  memcpy(&v, &bits, 8);
  return v;
}

// Whether tensors of a kind get a sketch (when they have a finite value):
// the real floating-point kinds.
OPG_HD constexpr bool has_sketch(Kind kind) {
  switch (kind) {
    case Kind::Float16:
    case Kind::BFloat16:
    case Kind::Float32:
    case Kind::Float64:
    case Kind::F8E4M3FN:
    case Kind::F8E4M3FNUZ:
    case Kind::F8E5M2:
    case Kind::F8E5M2FNUZ:
    case Kind::F8E8M0FNU:
      return true;
    default:
      return false;
  }
}

// A sketch being accumulated: the sum of squares and the float64 buckets. Sums of disjoint
// parts merge by addition (in a fixed order per backend: deterministic).
struct SketchSums {
  double squares;
  double buckets[kSketchBuckets];

  OPG_HD static SketchSums empty() {
    SketchSums s;
    s.squares = 0.0;
    for (int b = 0; b < kSketchBuckets; ++b) s.buckets[b] = 0.0;
    return s;
  }

  OPG_HD void merge(const SketchSums& o) {
    squares += o.squares;
    for (int b = 0; b < kSketchBuckets; ++b) buckets[b] += o.buckets[b];
  }
};

// The stored form of a tensor's sketch (opguard/store/sketch.py: the float32 norm, then each
// bucket as int32 in steps of 2^(E - 28), E the frexp exponent of that norm, rounded half away
// from zero, INT32_MIN outside int32's range; little-endian), or false where the tensor has
// none: not a floating kind, no finite value, or a norm beyond float32.
inline bool store_sketch(Kind kind, const Stats& stats, const SketchSums& sums, StoredSketch& out) {
  if (!has_sketch(kind) || stats.finite == 0) return false;
  const float norm = static_cast<float>(sqrt(sums.squares));
  if (!(fabsf(norm) <= __FLT_MAX__)) return false;
  int exponent = 0;
  frexp(static_cast<double>(norm), &exponent);
  const double step = ldexp(1.0, exponent - kSketchFractionBits);
  memcpy(out.data(), &norm, 4);  // x86-64 and aarch64 Linux are little-endian
  for (int b = 0; b < kSketchBuckets; ++b) {
    const double v = sums.buckets[b];
    const double magnitude = floor(fabs(v) / step + 0.5);
    const double q = v < 0 ? -magnitude : magnitude;
    const int32_t stored =
        q > INT32_MIN && q <= INT32_MAX ? static_cast<int32_t>(q) : kSketchSaturated;
    memcpy(out.data() + 4 + 4 * b, &stored, 4);
  }
  return true;
}

}  // namespace opguard
