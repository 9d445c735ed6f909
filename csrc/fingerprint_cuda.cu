#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <stdexcept>
#include <string>
#include <thread>
#include <type_traits>

#include "cupti_activity.h"
#include "fingerprint_cuda.h"

namespace opguard {
namespace cuda {
namespace {

constexpr int kThreads = 256;
// Loads of a 2-byte kind a thread has in flight through shared memory (staged_body), on the
// GPUs where that was measured to pay: on an H200, 512 MiB of bfloat16 read at 2,665 GB/s with
// four stages (with the packed min and max, PairMinMax) against 2,541 without them, 2,449 with two.
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
constexpr int kStages = 4;
#else
constexpr int kStages = 0;
#endif

// A thread's sketch buckets lie kColumnBytes apart in shared memory (ThreadSketch); a bucket's
// offset from bucket 0 fits the bits of kOffsetMask (16 buckets at most).
constexpr uint32_t kColumnBytes = kThreads * sizeof(double);
constexpr uint32_t kOffsetMask = 15 * kColumnBytes;
static_assert((kColumnBytes & (kColumnBytes - 1)) == 0 && kColumnBytes >= 256,
              "bucket_offset() masks; field() keeps the sign bits below the offset");
static_assert(kSketchBuckets <= 16 && 16 * kColumnBytes <= 0x10000, "field() is 16 bits");

struct Args {
  const uint8_t* data;
  uint64_t nbytes;
  uint64_t nwords;
  uint64_t numel;
  int64_t sizes[kMaxDims];  // coalesced, innermost last
  int64_t strides[kMaxDims];
  int32_t ndim;
  int32_t itemsize;
  int32_t kind;
  int32_t head_bytes;
  Partial* partials;
  uint8_t* head;
  uint64_t seq;
};

// One tensor of a multi-tensor launch: contiguous, its kind and item size the launch's.
struct Piece {
  const uint8_t* data;
  uint64_t nbytes;
  Partial* partials;
  uint8_t* head;
  uint64_t seq;
  int32_t head_bytes;
  uint32_t blocks;
};

constexpr int kMaxPieces = 64;  // keeps MultiArgs within the 4 KiB of kernel parameters

struct MultiArgs {
  Piece pieces[kMaxPieces];
  uint32_t first_block[kMaxPieces];
  int32_t count;
  int32_t itemsize;
  int32_t kind;
};

void check(cudaError_t err, const char* what) {
  if (err != cudaSuccess) {
    throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(err));
  }
}

// Per-thread statistics in the accumulation type of the element kind.
// The sum is kept in double whatever the element type: a float sum of large values overflows.
// The largest finite magnitude is not tracked: publish() derives it from min and max.
template <typename Acc>
struct ThreadStats {
  Acc mn = INFINITY, mx = -INFINITY;
  double sum = 0;
  uint32_t nan = 0, inf = 0;

  __device__ __forceinline__ void add(Acc v) {
    const Acc a = v < 0 ? -v : v;
    const bool finite = a < static_cast<Acc>(INFINITY);
    nan += v != v;
    inf += a == static_cast<Acc>(INFINITY);
    mn = finite && v < mn ? v : mn;
    mx = finite && v > mx ? v : mx;
    sum += finite ? static_cast<double>(v) : 0.0;
  }

  // The values of one 16-byte load. When they are all finite (their float sum is: a NaN or an
  // infinity makes it non-finite; so does an overflow, which only costs the slow path), min
  // and max are one min/max instruction each and nothing is counted: about half the
  // instructions of add() per value, and the sum is added value by value in the same order,
  // so the results are add()'s.
  template <int N>
  __device__ __forceinline__ void add_all(const Acc (&v)[N]) {
    if (all_finite(v)) {
      add_finite(v);
    } else {
      add_each(v);
    }
  }

  // add_all's test and its two paths, for callers that do more work under the same test (the
  // sketch of a load, which skips sketch_value's test when its values are finite).
  template <int N>
  __device__ __forceinline__ static bool all_finite(const Acc (&v)[N]) {
    Acc total = v[0];
#pragma unroll
    for (int i = 1; i < N; ++i) total += v[i];
    return fabs(total) < static_cast<Acc>(INFINITY);
  }
  template <int N>
  __device__ __forceinline__ void add_finite(const Acc (&v)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) {
      mn = fmin(mn, v[i]);
      mx = fmax(mx, v[i]);
      sum += static_cast<double>(v[i]);
    }
  }
  // add_finite()'s sum alone, for callers that take the min and max otherwise (PairMinMax).
  template <int N>
  __device__ __forceinline__ void add_sums(const Acc (&v)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) sum += static_cast<double>(v[i]);
  }
  template <int N>
  __device__ __forceinline__ void add_each(const Acc (&v)[N]) {
#pragma unroll
    for (int i = 0; i < N; ++i) add(v[i]);
  }
};

// Element decoding specialised for the common dtypes; everything else goes through the shared
// generic decoder of fingerprint.h.
template <int K>
struct Decode {
  using Acc = double;
  static constexpr int kComponentBytes = 0;  // use the generic path
};
template <>
struct Decode<static_cast<int>(Kind::Float32)> {
  using Acc = float;
  static constexpr int kComponentBytes = 4;
  __device__ static float get(uint64_t w, int c) {
    return __uint_as_float(static_cast<uint32_t>(w >> (32 * c)));
  }
};
template <>
struct Decode<static_cast<int>(Kind::BFloat16)> {
  using Acc = float;
  static constexpr int kComponentBytes = 2;
  __device__ static float get(uint64_t w, int c) {
    return __uint_as_float(static_cast<uint32_t>((w >> (16 * c)) & 0xFFFFu) << 16);
  }
};
template <>
struct Decode<static_cast<int>(Kind::Float16)> {
  using Acc = float;
  static constexpr int kComponentBytes = 2;
  __device__ static float get(uint64_t w, int c) {
    return __half2float(__ushort_as_half(static_cast<unsigned short>(w >> (16 * c))));
  }
};
template <>
struct Decode<static_cast<int>(Kind::Float64)> {
  using Acc = double;
  static constexpr int kComponentBytes = 8;
  __device__ static double get(uint64_t w, int) { return __longlong_as_double(w); }
};

// Stats of the valid bytes of one word of the logical stream (component-aligned: component
// sizes divide 8, and 16-byte elements are two 8-byte components).
template <int K>
__device__ __forceinline__ void word_stats(uint64_t w, int valid, const Args& a,
                                           ThreadStats<typename Decode<K>::Acc>& st) {
  using D = Decode<K>;
  if constexpr (D::kComponentBytes > 0) {
#pragma unroll
    for (int c = 0; c < 8 / D::kComponentBytes; ++c) {
      if (c * D::kComponentBytes < valid) st.add(D::get(w, c));
    }
  } else {
    const Kind kind = static_cast<Kind>(K);
    if (!has_stats(kind)) return;
    const int comp = a.itemsize / components_of(kind);
    const int step = comp < 8 ? comp : 8;
    uint8_t bytes[8];
    memcpy(bytes, &w, 8);
    for (int off = 0; off < valid; off += step) {
      st.add(decode_component(bytes + off, kind, a.itemsize, 0));
    }
  }
}

// The two words of the logical stream that a 16-byte load holds.
__device__ __forceinline__ void split_words(const uint4& r, uint64_t& w0, uint64_t& w1) {
  w0 = (static_cast<uint64_t>(r.y) << 32) | r.x;
  w1 = (static_cast<uint64_t>(r.w) << 32) | r.z;
}

// Stats of two consecutive words of the logical stream (one 16-byte load), all valid.
template <int K>
__device__ __forceinline__ void chunk_stats(uint64_t w0, uint64_t w1, const Args& a,
                                            ThreadStats<typename Decode<K>::Acc>& st) {
  using D = Decode<K>;
  if constexpr (D::kComponentBytes > 0) {
    constexpr int kPerWord = 8 / D::kComponentBytes;
    typename D::Acc v[2 * kPerWord];
#pragma unroll
    for (int c = 0; c < kPerWord; ++c) {
      v[c] = D::get(w0, c);
      v[kPerWord + c] = D::get(w1, c);
    }
    st.add_all(v);
  } else {
    word_stats<K>(w0, 8, a, st);
    word_stats<K>(w1, 8, a, st);
  }
}

// A thread's share of a tensor's sketch (fingerprint.h), for the sketched kinds (elsewhere
// every call is a no-op): its sum of squares in a register, its buckets in its own column of
// shared memory (a bucket chosen at run time would move a register array to local memory).
// A word of the logical stream holds at most eight elements of a real kind, all of one group
// (group = word / itemsize), and so do the two words of a 16-byte load for itemsizes of two
// bytes or more: one hash and one bucket add per load.
template <int K>
struct ThreadSketch {
  static constexpr bool kOn = has_sketch(static_cast<Kind>(K));
  static constexpr int kItemsize = Decode<K>::kComponentBytes;  // 0: the tensor's (float8: 1)
  double squares = 0.0;

  __device__ __forceinline__ static double (&columns()) [kSketchBuckets][kThreads] {
    __shared__ double s_columns[kSketchBuckets][kThreads];
    return s_columns;
  }

  __device__ __forceinline__ ThreadSketch() {
    clear();
  }

  __device__ __forceinline__ void clear() {
    squares = 0.0;
    if constexpr (kOn) {
#pragma unroll
      for (int b = 0; b < kSketchBuckets; ++b) columns()[b][threadIdx.x] = 0.0;
    }
  }

  __device__ __forceinline__ static int itemsize(const Args& a) {
    return kItemsize > 0 ? kItemsize : a.itemsize;
  }

  // `v` with its sign flipped where bit `c` of `signs` is set: a shift and an XOR on its high
  // word (sketch_signed's 64-bit shift by a run-time amount costs several instructions).
  __device__ __forceinline__ static double flip(double v, uint32_t signs, int c) {
    const int high = __double2hiint(v) ^ static_cast<int>((signs << (31 - c)) & 0x80000000u);
    return __hiloint2double(high, __double2loint(v));
  }

  // flip() of a double whose low word is zero, as every float16 and bfloat16 value's is (their
  // significands are 11 and 8 bits): the compiler pairs the flipped high word with a zero
  // rather than copying the low word into a new register pair for each value.
  __device__ __forceinline__ static double flip_whole(double v, uint32_t signs, int c) {
    return __hiloint2double(__double2hiint(v) ^ static_cast<int>((signs << (31 - c)) & 0x80000000u),
                            0);
  }

  // The signed sum of the elements in the first `valid` bytes of word `j` (at least one);
  // bit c of `signs` is the sign bit of its element c (its group's word shifted to the word's
  // first element). Their squares go to `squares`; NaNs and infinities add 0.
  __device__ __forceinline__ double signed_sum(uint64_t w, int valid, uint32_t signs,
                                               const Args& a) {
    double sum;
    if constexpr (kItemsize > 0) {
#pragma unroll
      for (int c = 0; c < 8 / kItemsize; ++c) {
        if (c == 0 || c * kItemsize < valid) {
          const double v = sketch_value(Decode<K>::get(w, c));
          squares += v * v;
          sum = c == 0 ? flip(v, signs, 0) : sum + flip(v, signs, c);
        }
      }
    } else {
      const int size = a.itemsize;
      uint8_t bytes[8];
      memcpy(bytes, &w, 8);
      sum = 0.0;
      for (int c = 0; c * size < valid; ++c) {
        const double v =
            sketch_value(decode_component(bytes + c * size, static_cast<Kind>(K), size, 0));
        squares += v * v;
        sum += flip(v, signs, c);
      }
    }
    return sum;
  }

  // The sign bits of word `j`'s elements: its group's word shifted to the word's first element.
  __device__ __forceinline__ static uint32_t signs_of(uint64_t group_word, uint64_t j,
                                                      const Args& a) {
    const int first = static_cast<int>(j * (8 / itemsize(a)) % kSketchGroup);
    return static_cast<uint32_t>(group_word) >> first;
  }

  __device__ __forceinline__ void add(uint64_t group_word, double sum) {
    columns()[sketch_bucket(group_word)][threadIdx.x] += sum;
  }

  // Word `j` of the logical stream, its first `valid` bytes holding elements.
  __device__ __forceinline__ void word(uint64_t w, uint64_t j, int valid, const Args& a) {
    if constexpr (kOn) {
      const uint64_t group_word = sketch_word(j / itemsize(a));
      add(group_word, signed_sum(w, valid, signs_of(group_word, j, a), a));
    }
  }

  // Words `j` and `j + 1` (`j` even), all valid: one 16-byte load.
  __device__ __forceinline__ void pair(uint64_t w0, uint64_t w1, uint64_t j, const Args& a) {
    if constexpr (kOn && kItemsize > 1) {
      const uint64_t group_word = sketch_word(j / kItemsize);
      const uint32_t signs = signs_of(group_word, j, a);
      add(group_word, signed_sum(w0, 8, signs, a) + signed_sum(w1, 8, signs >> (8 / kItemsize), a));
    } else {
      word(w0, j, 8, a);
      word(w1, j + 1, 8, a);
    }
  }

  // The kinds whose 16-byte loads take chunk_sketch() below (those with a Decode
  // specialisation: float16, bfloat16, float32, float64), and how many consecutive loads of
  // theirs make one group (two bytes an element: one; four: two; eight: four).
  static constexpr bool kFast = kOn && kItemsize > 1;
  static constexpr int kLoadsPerGroup = kItemsize / 2;

  // The sign bits of 16-byte load `p`'s elements (words 2p and 2p + 1), its group's word being
  // `group_word`: signs_of(group_word, 2 * p, a) with the division by the item size folded.
  __device__ __forceinline__ static int sign_shift(uint64_t p) {
    if constexpr (kFast) return static_cast<int>(p % kLoadsPerGroup) * (16 / kItemsize);
    return 0;
  }

  // Where add() adds for `group_word`, from this thread's column: sketch_bucket(group_word) *
  // kColumnBytes, as one product and a mask (the high word times kSketchBuckets * kColumnBytes,
  // over 2^32, is the bucket times kColumnBytes plus less than kColumnBytes).
  __device__ __forceinline__ static uint32_t bucket_offset(uint64_t group_word) {
    const auto high = static_cast<uint32_t>(group_word >> 32);
    return __umulhi(high, kSketchBuckets * kColumnBytes) & ~(kColumnBytes - 1);
  }

  // A group word's bucket offset and sign bits in one 16-bit field: bits 0..7 its sign bits,
  // the bits of kOffsetMask its bucket_offset(); the others are not read.
  __device__ __forceinline__ static uint32_t field(uint64_t group_word) {
    return (bucket_offset(group_word) & kOffsetMask) |
           (static_cast<uint32_t>(group_word) & ~kOffsetMask);
  }

  __device__ __forceinline__ void add_at(uint32_t offset, double sum) {
    auto* column = reinterpret_cast<uint8_t*>(&columns()[0][threadIdx.x]);
    *reinterpret_cast<double*>(column + offset) += sum;
  }

  // pair() of one 16-byte load whose values `v` (both words' elements, in order) are all
  // finite, given its bucket's offset and its sign bits: sketch_value's test per value is left
  // out (the caller has tested them all at once) and the double of each value is the one the
  // stats add (one conversion for both); each value's square, signed value and the two words'
  // sums are pair()'s, in pair()'s order, so the sums are bit for bit pair()'s.
  template <typename Acc, int N>
  __device__ __forceinline__ void pair_finite(const Acc (&v)[N], uint32_t offset, uint32_t signs) {
    constexpr int kPerWord = N / 2;
    double sums[2];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
#pragma unroll
      for (int c = 0; c < kPerWord; ++c) {
        const double x = static_cast<double>(v[h * kPerWord + c]);
        squares += x * x;
        const double signed_x = kItemsize == 2 ? flip_whole(x, signs, h * kPerWord + c)
                                               : flip(x, signs, h * kPerWord + c);
        sums[h] = c == 0 ? signed_x : sums[h] + signed_x;
      }
    }
    add_at(offset, sums[0] + sums[1]);
  }

  // pair() given its bucket's offset and its sign bits (any values).
  __device__ __forceinline__ void pair_given(uint64_t w0, uint64_t w1, uint32_t offset,
                                             uint32_t signs, const Args& a) {
    add_at(offset, signed_sum(w0, 8, signs, a) + signed_sum(w1, 8, signs >> (8 / kItemsize), a));
  }
};

// The values of one 16-byte load (words w0 and w1 of a kind with a Decode specialisation).
template <int K, int N>
__device__ __forceinline__ void decode_load(uint64_t w0, uint64_t w1,
                                            typename Decode<K>::Acc (&v)[N]) {
  using D = Decode<K>;
  constexpr int kPerWord = 8 / D::kComponentBytes;
  static_assert(N == 2 * kPerWord, "a load's values");
#pragma unroll
  for (int c = 0; c < kPerWord; ++c) {
    v[c] = D::get(w0, c);
    v[kPerWord + c] = D::get(w1, c);
  }
}

// The min and max of a 2-byte kind's finite values taken two at a time: a 32-bit word of a load
// is a pair of the kind's numbers, and one bf16x2 (f16x2) min or max takes both, where the float
// path takes two instructions per value. The min and max of finite values are exact, and do not
// depend on how the values are grouped (the hardware orders -0 below +0 in both widths, as the
// float min and max do), so fold() gives the stats what add_finite() would have.
template <int K>
struct PairMinMax {
  static constexpr bool kBF16 = K == static_cast<int>(Kind::BFloat16);
  static_assert(kBF16 || K == static_cast<int>(Kind::Float16), "2-byte floats only");
  static constexpr uint32_t kPosInf = kBF16 ? 0x7F807F80u : 0x7C007C00u;
  uint32_t mn = kPosInf, mx = kPosInf | 0x80008000u;  // +inf and -inf in both halves

  // The min (kMax: the max) of the pairs a and b, half by half.
  template <bool kMax>
  __device__ __forceinline__ static uint32_t extreme2(uint32_t a, uint32_t b) {
    uint32_t d;
    if constexpr (kBF16 && kMax) {
      asm("max.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    } else if constexpr (kBF16) {
      asm("min.bf16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    } else if constexpr (kMax) {
      asm("max.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    } else {
      asm("min.f16x2 %0, %1, %2;" : "=r"(d) : "r"(a), "r"(b));
    }
    return d;
  }
  template <bool kMax>
  __device__ __forceinline__ static uint32_t extreme(uint32_t acc, const uint4& r) {
    return extreme2<kMax>(extreme2<kMax>(acc, r.x), extreme2<kMax>(r.y, extreme2<kMax>(r.z, r.w)));
  }

  // The eight values of one 16-byte load, all finite.
  __device__ __forceinline__ void add(const uint4& r) {
    mn = extreme<false>(mn, r);
    mx = extreme<true>(mx, r);
  }

  __device__ __forceinline__ void fold(ThreadStats<float>& st) const {
    using D = Decode<K>;
    st.mn = fmin(st.mn, fmin(D::get(mn, 0), D::get(mn, 1)));
    st.mx = fmax(st.mx, fmax(D::get(mx, 0), D::get(mx, 1)));
  }
};

// Stats and sketch of one 16-byte load, words 2p and 2p + 1 of the logical stream, all valid,
// of a kind with ThreadSketch<K>::kFast: chunk_stats() and ThreadSketch::pair() under one test
// (add_all's: the values' float sum is finite), with the load's bucket offset and sign bits
// given (the main body gets them cheaply). Every stat and sum is computed as those two do.
template <int K, int N>
__device__ __forceinline__ void chunk_sketch(uint64_t w0, uint64_t w1,
                                             const typename Decode<K>::Acc (&v)[N], bool finite,
                                             uint32_t offset, uint32_t signs, const Args& a,
                                             ThreadStats<typename Decode<K>::Acc>& st,
                                             ThreadSketch<K>& sk) {
  if (finite) {
    st.add_finite(v);
    sk.pair_finite(v, offset, signs);
  } else {
    st.add_each(v);
    sk.pair_given(w0, w1, offset, signs, a);
  }
}

// chunk_stats() and ThreadSketch::pair() of 16-byte load `p` (words 2p and 2p + 1, all valid);
// kTrusted as for contiguous_body().
template <int K, bool kTrusted = false>
__device__ __forceinline__ void chunk(uint64_t w0, uint64_t w1, uint64_t p, const Args& a,
                                      ThreadStats<typename Decode<K>::Acc>& st,
                                      ThreadSketch<K>& sk) {
  using Sketch = ThreadSketch<K>;
  if constexpr (Sketch::kFast) {
    const uint64_t group_word = sketch_word(p / Sketch::kLoadsPerGroup);
    typename Decode<K>::Acc v[16 / Decode<K>::kComponentBytes];
    decode_load<K>(w0, w1, v);
    chunk_sketch<K>(w0, w1, v, kTrusted || st.all_finite(v), Sketch::bucket_offset(group_word),
                    static_cast<uint32_t>(group_word) >> Sketch::sign_shift(p), a, st, sk);
  } else {
    chunk_stats<K>(w0, w1, a, st);
    sk.pair(w0, w1, 2 * p, a);
  }
}

// Byte offset of logical element `e` in memory.
__device__ __forceinline__ int64_t element_offset(const Args& a, uint64_t e) {
  int64_t offset = 0;
  for (int d = a.ndim - 1; d >= 0; --d) {
    const uint64_t size = static_cast<uint64_t>(a.sizes[d]);
    offset += static_cast<int64_t>(e % size) * a.strides[d];
    e /= size;
  }
  return offset * a.itemsize;
}

// Word `j` of the logical byte stream, gathered element by element (strided tensors).
__device__ uint64_t strided_word(const Args& a, uint64_t j, int* valid) {
  const uint64_t start = j * 8;
  const uint64_t end = start + 8 < a.nbytes ? start + 8 : a.nbytes;
  *valid = static_cast<int>(end - start);
  uint64_t w = 0;
  for (uint64_t b = start; b < end;) {
    const uint64_t e = b / a.itemsize;
    const uint64_t within = b % a.itemsize;
    const uint8_t* p = a.data + element_offset(a, e) + within;
    const uint64_t take = min(static_cast<uint64_t>(a.itemsize) - within, end - b);
    for (uint64_t k = 0; k < take; ++k) w |= static_cast<uint64_t>(p[k]) << (8 * (b - start + k));
    b += take;
  }
  return w;
}

// Word `j` of a contiguous stream at any alignment, zero-padded at the end.
__device__ __forceinline__ uint64_t contiguous_word(const Args& a, uint64_t j, int* valid) {
  const uint64_t start = j * 8;
  if (start + 8 <= a.nbytes && (reinterpret_cast<uintptr_t>(a.data) & 7) == 0) {
    *valid = 8;
    return *reinterpret_cast<const uint64_t*>(a.data + start);
  }
  const uint64_t end = start + 8 < a.nbytes ? start + 8 : a.nbytes;
  *valid = static_cast<int>(end - start);
  uint64_t w = 0;
  for (uint64_t b = start; b < end; ++b) w |= static_cast<uint64_t>(a.data[b]) << (8 * (b - start));
  return w;
}

template <typename T>
__device__ __forceinline__ T warp_sum(T v) {
  for (int o = 16; o > 0; o >>= 1) v += __shfl_down_sync(0xFFFFFFFFu, v, o);
  return v;
}
template <typename T>
__device__ __forceinline__ T warp_min(T v) {
  for (int o = 16; o > 0; o >>= 1) v = min(v, __shfl_down_sync(0xFFFFFFFFu, v, o));
  return v;
}
template <typename T>
__device__ __forceinline__ T warp_max(T v) {
  for (int o = 16; o > 0; o >>= 1) v = max(v, __shfl_down_sync(0xFFFFFFFFu, v, o));
  return v;
}

// One level of publish_sketch()'s warp sums: a lane keeps half of its first 2 * kHalf values,
// the upper half where bit `2 * kHalf` of its lane is set, and adds to each the same value's
// partial of its partner lane (lane ^ 2 * kHalf), to which it sends the other half.
template <int kHalf>
__device__ __forceinline__ void halve(double (&values)[16], int lane) {
  const bool upper = (lane & (2 * kHalf)) != 0;
#pragma unroll
  for (int k = 0; k < kHalf; ++k) {
    const double send = upper ? values[k] : values[k + kHalf];
    const double keep = upper ? values[k + kHalf] : values[k];
    values[k] = keep + __shfl_xor_sync(0xFFFFFFFFu, send, 2 * kHalf);
  }
}

// The block's sketch sums reduced in a fixed tree into `totals` (shared memory). Each warp sums its
// lanes' 15 values (padded to 16) by halving (halve() at offsets 16, 8, 4 and 2, then both lanes of
// a pair add theirs): 16 shuffles of a double instead of 15 warp_sum()s' 75. Every sum is
// warp_sum()'s: lane l adds lane l + offset's partial to its own at each offset, as there,
// and the partner lane adds the same two in the other order, which gives the same double; so
// the results are bit for bit warp_sum()'s. Lane 2v (v < 15) ends with value v's warp sum.
// Each value's warp sums are then added by a thread of its own (one thread adding them all
// would wait on 15 x 7 shared loads in series, a cost every block of the many small launches
// pays), before publish()'s barrier; after it thread 0 writes the totals with the stats, so a
// block waits on one system fence, not two in turn.
template <int K>
__device__ void publish_sketch(const ThreadSketch<K>& sk, double (&totals)[1 + kSketchBuckets]) {
  constexpr int kValues = 1 + kSketchBuckets;
  static_assert(kValues <= 16, "halve() sums 16 values");
  __shared__ double s_values[kValues][kThreads / 32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  double values[16];
  values[0] = sk.squares;
#pragma unroll
  for (int b = 0; b < kSketchBuckets; ++b) values[1 + b] = sk.columns()[b][threadIdx.x];
#pragma unroll
  for (int v = kValues; v < 16; ++v) values[v] = 0.0;
  halve<8>(values, lane);  // values[k]: value k, or 8 + k where lane bit 4 is set
  halve<4>(values, lane);  // ... plus 4 where bit 3 is set
  halve<2>(values, lane);
  halve<1>(values, lane);  // values[0]: value (lane >> 1), of the lanes of its pair
  values[0] += __shfl_xor_sync(0xFFFFFFFFu, values[0], 1);
  const int held = lane >> 1;
  if ((lane & 1) == 0 && held < kValues) s_values[held][warp] = values[0];
  __syncthreads();
  const int value = threadIdx.x;
  if (value < kValues) {
    double total = s_values[value][0];
    for (int w = 1; w < kThreads / 32; ++w) total += s_values[value][w];
    totals[value] = total;
  }
}

// Reduces the block's hash, stats and sketch in a fixed tree and publishes them as one partial.
template <typename Acc, int K>
__device__ void publish(const Args& a, uint32_t block, uint64_t hash, const ThreadStats<Acc>& st,
                        const ThreadSketch<K>& sk) {
  Partial* out = a.partials + block;
  __shared__ double s_totals[1 + kSketchBuckets];  // the sketch's
  if constexpr (ThreadSketch<K>::kOn) publish_sketch(sk, s_totals);
  __shared__ uint64_t s_hash[kThreads / 32];
  __shared__ double s_min[kThreads / 32], s_max[kThreads / 32], s_sum[kThreads / 32];
  __shared__ uint64_t s_nan[kThreads / 32], s_inf[kThreads / 32];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  uint64_t h = warp_sum(hash);
  double mn = warp_min(static_cast<double>(st.mn));
  double mx = warp_max(static_cast<double>(st.mx));
  double sm = warp_sum(static_cast<double>(st.sum));
  uint64_t nn = warp_sum(static_cast<uint64_t>(st.nan));
  uint64_t ni = warp_sum(static_cast<uint64_t>(st.inf));
  if (lane == 0) {
    s_hash[warp] = h;
    s_min[warp] = mn;
    s_max[warp] = mx;
    s_sum[warp] = sm;
    s_nan[warp] = nn;
    s_inf[warp] = ni;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kThreads / 32; ++w) {
      h += s_hash[w];
      mn = min(mn, s_min[w]);
      mx = max(mx, s_max[w]);
      sm += s_sum[w];
      nn += s_nan[w];
      ni += s_inf[w];
    }
    out->hash = h;
    out->min = mn;
    out->max = mx;
    out->absmax = mn <= mx ? fmax(fabs(mn), fabs(mx)) : 0.0;  // the largest finite magnitude
    out->sum = sm;
    out->nan = nn;
    out->inf = ni;
    if constexpr (ThreadSketch<K>::kOn) {
      out->sketch.squares = s_totals[0];
#pragma unroll
      for (int b = 0; b < kSketchBuckets; ++b) out->sketch.buckets[b] = s_totals[1 + b];
    }
    __threadfence_system();
    out->seq = a.seq;
  }
}

// Block 0 copies the first bytes of the logical stream for the host to show.
__device__ __forceinline__ void write_head(const Args& a, uint32_t block, bool contiguous) {
  if (block == 0 && threadIdx.x < a.head_bytes) {
    const int b = threadIdx.x;
    const uint8_t* src =
        contiguous ? a.data + b : a.data + element_offset(a, b / a.itemsize) + b % a.itemsize;
    a.head[b] = *src;
    __threadfence_system();  // visible to the host before block 0 publishes its sequence number
  }
}

// Copies 16 bytes from global to shared memory without holding registers while they travel
// (cp.async, sm_80 and later), in groups committed and awaited in order.
__device__ __forceinline__ void copy_async(uint4* dst, const uint4* src) {
  const auto shared = static_cast<uint32_t>(__cvta_generic_to_shared(dst));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(shared), "l"(src) : "memory");
}
__device__ __forceinline__ void commit_copies() {
  asm volatile("cp.async.commit_group;" ::: "memory");
}
template <int kPending>
__device__ __forceinline__ void await_copies() {
  asm volatile("cp.async.wait_group %0;" ::"n"(kPending) : "memory");
}

// The slots of staged_body()'s loads, one set per block whichever pass (trusted or not) uses it.
using StageSlots = uint4[kStages > 0 ? kStages : 1][kThreads];
__device__ __forceinline__ StageSlots& stage_slots() {
  __shared__ StageSlots slots;
  return slots;
}

// contiguous_body() for the 2-byte kinds: the same loads in the same order (so the same sums),
// each group of eight values one load, but staged through shared memory: kStages of a thread's
// loads are in flight while it works on one, and they hold no registers (the register bound of
// four blocks per SM left the compiler issuing two of the loop's four loads in flight).
template <int K, bool kTrusted>
__device__ __forceinline__ void staged_body(const Args& a, uint64_t p, uint64_t stride,
                                            uint64_t& hash, ThreadStats<float>& st,
                                            ThreadSketch<K>& sk) {
  auto& slots = stage_slots();
  const uint64_t pairs = a.nbytes / 16;
  // this thread's loads: p, p + stride, ... (fewer than 2^32 of them)
  const uint32_t count = p < pairs ? static_cast<uint32_t>((pairs - p - 1) / stride + 1) : 0;
  const uint4* next = reinterpret_cast<const uint4*>(a.data) + p;
#pragma unroll
  for (int s = 0; s < kStages; ++s) {
    if (s < count) copy_async(&slots[s][threadIdx.x], next);
    commit_copies();
    next += stride;
  }
  const uint64_t key_step = 2 * stride * kIndexKey;
  uint64_t key = 2 * p * kIndexKey + kIndexSalt;
  const uint64_t group_step = stride * kIndexKey;
  uint64_t group_key = p * kIndexKey + kSketchSalt;
  PairMinMax<K> pair_minmax;
  // Load i waits for its copy (the i-th group: kStages - 1 younger ones may be pending) and
  // refills its slot with load i + kStages once its values are in registers.
  auto step = [&](int s, bool refill) {
    await_copies<kStages - 1>();
    const uint4 r = slots[s][threadIdx.x];
    if (refill) copy_async(&slots[s][threadIdx.x], next);
    commit_copies();
    next += stride;
    uint64_t w0, w1;
    split_words(r, w0, w1);
    hash += fmix64(w0 ^ key) + fmix64(w1 ^ (key + kIndexKey));
    key += key_step;
    const uint64_t group_word = fmix64(group_key);
    group_key += group_step;
    const uint32_t offset = ThreadSketch<K>::bucket_offset(group_word);
    const auto signs = static_cast<uint32_t>(group_word);
    float vals[8];
    decode_load<K>(w0, w1, vals);
    if constexpr (kTrusted) {
      pair_minmax.add(r);
      st.add_sums(vals);
      sk.pair_finite(vals, offset, signs);
    } else {
      chunk_sketch<K>(w0, w1, vals, st.all_finite(vals), offset, signs, a, st, sk);
    }
  };
  uint32_t i = 0;
  for (; i + 2 * kStages <= count; i += kStages) {  // every refill within the tensor
#pragma unroll
    for (int s = 0; s < kStages; ++s) step(s, true);
  }
  for (; i < count; i += kStages) {
#pragma unroll
    for (int s = 0; s < kStages; ++s) {
      if (i + s < count) step(s, i + s + kStages < count);
    }
  }
  await_copies<0>();
  if constexpr (kTrusted) pair_minmax.fold(st);
}

// The main body of a contiguous tensor at a 16-byte boundary: thread `first`'s 16-byte loads
// (two words each), every `stride`-th, four in flight per thread. kTrusted (for the kinds with
// ThreadSketch<K>::kFast) takes every value to be finite: no test per load, and NaNs and
// infinities give wrong stats and sketch sums; the caller sees them in the stats' sum, which
// they leave non-finite, and runs the body again untrusted (see trusting()).
template <int K, bool kTrusted>
__device__ __forceinline__ void contiguous_body(const Args& a, uint64_t first, uint64_t stride,
                                                uint64_t& hash,
                                                ThreadStats<typename Decode<K>::Acc>& st,
                                                ThreadSketch<K>& sk) {
  if constexpr (Decode<K>::kComponentBytes == 2 && kStages > 0) {
    staged_body<K, kTrusted>(a, first, stride, hash, st, sk);
    return;
  }
  using Acc = typename Decode<K>::Acc;
  const uint64_t pairs = a.nbytes / 16;
  const uint4* v = reinterpret_cast<const uint4*>(a.data);
  uint64_t p = first;
  // mix_word(w, i) == fmix64(w ^ key(i)) with key(i) = i * kIndexKey + kIndexSalt: keys are
  // advanced by addition instead of a 64-bit multiply per word.
  const uint64_t key_step = 2 * stride * kIndexKey;
  uint64_t key = 2 * p * kIndexKey + kIndexSalt;
  // Likewise the sketch's: sketch_word(g) == fmix64(g * kIndexKey + kSketchSalt), and load
  // p + stride's group is load p's plus stride / kLoadsPerGroup (stride is a multiple of
  // kThreads), so its position in its group, and so its sign shift, stay the same.
  using Sketch = ThreadSketch<K>;
  constexpr uint64_t kGroupLoads = Sketch::kFast ? Sketch::kLoadsPerGroup : 1;
  // float32: the two lanes of a pair (loads p and p + 1 of each stride) share every group, so
  // each hashes two of their four group words per pass and they exchange the fields (bucket
  // offset, sign bits) in one shuffle; the lane of odd p hashes the groups of its loads 2 and
  // 3. Lanes that exchange must loop together: the loop's test is the warp's last lane's (a
  // thread's loads go in the same order, here or in the loop after).
  constexpr bool kShare = Sketch::kFast && kGroupLoads == 2;
  const uint64_t odd = kShare ? (p & 1) : 0;
  const uint64_t group_step = stride / kGroupLoads * kIndexKey;
  uint64_t group_key = (p / kGroupLoads + odd * stride) * kIndexKey + kSketchSalt;
  const int sign_shift = Sketch::kFast ? Sketch::sign_shift(p) : 0;
  const uint64_t lead = kShare ? 31 - (threadIdx.x & 31) : 0;  // to the warp's last lane's p
  const uint64_t end = pairs > lead ? pairs - lead : 0;
  // the 2-byte kinds' trusted loads take their min and max in pairs (PairMinMax)
  constexpr bool kPaired = kTrusted && Decode<K>::kComponentBytes == 2;
  std::conditional_t<kPaired, PairMinMax<K>, int> pair_minmax{};
  for (; p + 3 * stride < end; p += 4 * stride, key += 4 * key_step) {
    uint4 r[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) r[u] = __ldcs(v + p + u * stride);
    uint32_t fields[2];  // kShare: loads 0 and 1, 2 and 3
    if constexpr (kShare) {
      const uint32_t mine = __byte_perm(Sketch::field(fmix64(group_key)),
                                        Sketch::field(fmix64(group_key + group_step)), 0x5410);
      group_key += 4 * group_step;
      const uint32_t theirs = __shfl_xor_sync(0xFFFFFFFFu, mine, 1);
      fields[0] = odd ? theirs : mine;
      fields[1] = odd ? mine : theirs;
    }
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      uint64_t w0, w1;
      split_words(r[u], w0, w1);
      const uint64_t k = key + u * key_step;
      hash += fmix64(w0 ^ k) + fmix64(w1 ^ (k + kIndexKey));
      if constexpr (Sketch::kFast) {
        uint32_t offset, signs;
        if constexpr (kShare) {
          const uint32_t f = fields[u / 2] >> (16 * (u % 2));
          offset = f & kOffsetMask;
          signs = f >> sign_shift;
        } else {
          const uint64_t group_word = fmix64(group_key);
          group_key += group_step;
          offset = Sketch::bucket_offset(group_word);
          signs = static_cast<uint32_t>(group_word) >> sign_shift;
        }
        Acc vals[16 / Decode<K>::kComponentBytes];
        decode_load<K>(w0, w1, vals);
        if constexpr (kPaired) {
          pair_minmax.add(r[u]);
          st.add_sums(vals);
          sk.pair_finite(vals, offset, signs);
        } else {
          chunk_sketch<K>(w0, w1, vals, kTrusted || st.all_finite(vals), offset, signs, a, st, sk);
        }
      } else {
        chunk_stats<K>(w0, w1, a, st);
        sk.pair(w0, w1, 2 * (p + u * stride), a);
      }
    }
  }
  if constexpr (kPaired) pair_minmax.fold(st);
  for (; p < pairs; p += stride) {
    uint64_t w0, w1;
    split_words(__ldcs(v + p), w0, w1);
    hash += mix_word(w0, 2 * p) + mix_word(w1, 2 * p + 1);
    chunk<K>(w0, w1, p, a, st, sk);
  }
}

// Runs `body` (a thread's reads of a tensor, given std::true_type to trust its values to be
// finite, std::false_type to test them) trusted where the kind's loads can be (kFast): values
// are nearly always all finite, and trusting them saves a test per load. A NaN or an infinity
// leaves the stats' sum non-finite (a sum of finite values in double overflows only from
// float64 values, and then it costs the second pass too), and the warp (whose lanes may
// exchange group words) reads its values again, tested, from a clean state.
template <int K, typename Body>
__device__ __forceinline__ void trusting(uint64_t& hash, ThreadStats<typename Decode<K>::Acc>& st,
                                         ThreadSketch<K>& sk, Body body) {
  if constexpr (ThreadSketch<K>::kFast) {
    body(std::true_type{});
    if (__any_sync(0xFFFFFFFFu, !isfinite(st.sum))) {
      st = ThreadStats<typename Decode<K>::Acc>();
      sk.clear();
      hash = 0;
      body(std::false_type{});
    }
  } else {
    body(std::false_type{});
  }
}

// Block `block` of the `blocks` that fingerprint tensor `a`: which words a thread reads (and so
// the partials) depends only on these, so a tensor fingerprinted alone or with others in one
// launch (multi_kernel) gets bit-identical results.
template <int K, bool kContiguous>
__device__ __forceinline__ void fingerprint_blocks(const Args& a, uint32_t block, uint32_t blocks) {
  using Acc = typename Decode<K>::Acc;
  ThreadStats<Acc> st;
  ThreadSketch<K> sk;
  uint64_t hash = 0;
  const uint64_t stride = static_cast<uint64_t>(blocks) * kThreads;
  uint64_t j = static_cast<uint64_t>(block) * kThreads + threadIdx.x;
  if (kContiguous && (reinterpret_cast<uintptr_t>(a.data) & 15) == 0) {
    trusting(hash, st, sk, [&](auto trusted) {
      contiguous_body<K, decltype(trusted)::value>(a, j, stride, hash, st, sk);
    });
    j = 2 * (a.nbytes / 16) + j;  // the at most one leftover word (and the zero-padded tail)
  }
  for (; j < a.nwords; j += stride) {
    int valid;
    const uint64_t w = kContiguous ? contiguous_word(a, j, &valid) : strided_word(a, j, &valid);
    hash += mix_word(w, j);
    word_stats<K>(w, valid, a, st);
    sk.word(w, j, valid, a);
  }
  write_head(a, block, kContiguous);
  publish(a, block, hash, st, sk);
}

// Four blocks per SM stay resident (64 registers a thread): the sketch's state would otherwise
// take a few more and leave three.
template <int K, bool kContiguous>
__global__ void __launch_bounds__(kThreads, 4) fingerprint_kernel(const Args a) {
  fingerprint_blocks<K, kContiguous>(a, blockIdx.x, gridDim.x);
}

// Contiguous tensors of one kind fingerprinted in one launch (a _foreach_ op's list: AdamW's
// 148 parameters of GPT-2 took 148 launches per list): each tensor gets the blocks its own
// launch would have, and a block finds its tensor by bisecting the first-block table.
template <int K>
__global__ void __launch_bounds__(kThreads, 4) multi_kernel(const MultiArgs m) {
  int lo = 0, hi = m.count - 1;
  while (lo < hi) {
    const int mid = (lo + hi + 1) / 2;
    if (m.first_block[mid] <= blockIdx.x) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  const Piece& p = m.pieces[lo];
  Args a;
  a.data = p.data;
  a.nbytes = p.nbytes;
  a.nwords = (p.nbytes + 7) / 8;
  a.numel = p.nbytes / m.itemsize;
  a.ndim = 1;
  a.sizes[0] = static_cast<int64_t>(a.numel);
  a.strides[0] = 1;
  a.itemsize = m.itemsize;
  a.kind = m.kind;
  a.head_bytes = p.head_bytes;
  a.partials = p.partials;
  a.head = p.head;
  a.seq = p.seq;
  fingerprint_blocks<K, true>(a, blockIdx.x - m.first_block[lo], p.blocks);
}

// Where a row kernel's thread is: a row of the outer dimensions, its element offset, and its
// index along the last outer dimension, so that moving a few rows on costs an addition and
// only crossing that dimension's end costs divisions.
struct RowCursor {
  uint64_t row;
  int64_t offset = 0;
  int64_t last_index = 0;

  __device__ RowCursor(const Args& a, uint64_t r) : row(r) { locate(a); }

  __device__ void locate(const Args& a) {
    offset = 0;
    uint64_t rest = row;
    for (int d = a.ndim - 2; d >= 0; --d) {
      const uint64_t size = static_cast<uint64_t>(a.sizes[d]);
      const uint64_t q = rest / size;
      const int64_t i = static_cast<int64_t>(rest - q * size);
      if (d == a.ndim - 2) last_index = i;
      offset += i * a.strides[d];
      rest = q;
    }
  }

  __device__ __forceinline__ void advance(const Args& a, uint32_t by) {
    row += by;
    last_index += by;
    if (last_index < a.sizes[a.ndim - 2]) {
      offset += by * a.strides[a.ndim - 2];
    } else {
      locate(a);
    }
  }
};

// One load of a row: one word, or (kPairs) two words at a 16-byte boundary.
template <bool kPairs>
struct RowLoad {
  unsigned long long w;
  __device__ __forceinline__ void load(const uint8_t* p) {
    w = __ldcs(reinterpret_cast<const unsigned long long*>(p));
  }
  template <int K, bool kTrusted>
  __device__ __forceinline__ void consume(uint64_t j, const Args& a, uint64_t& hash,
                                          ThreadStats<typename Decode<K>::Acc>& st,
                                          ThreadSketch<K>& sk) const {
    hash += mix_word(w, j);
    word_stats<K>(w, 8, a, st);
    sk.word(w, j, 8, a);
  }
};
template <>
struct RowLoad<true> {
  uint4 r;
  __device__ __forceinline__ void load(const uint8_t* p) {
    r = __ldcs(reinterpret_cast<const uint4*>(p));
  }
  template <int K, bool kTrusted>
  __device__ __forceinline__ void consume(uint64_t j, const Args& a, uint64_t& hash,
                                          ThreadStats<typename Decode<K>::Acc>& st,
                                          ThreadSketch<K>& sk) const {
    uint64_t w0, w1;
    split_words(r, w0, w1);
    hash += mix_word(w0, j) + mix_word(w1, j + 1);
    chunk<K, kTrusted>(w0, w1, j / 2, a, st, sk);
  }
};

// Tensors whose innermost dimension is contiguous and holds whole 8-byte words, with the outer
// dimensions in any order (attention's [batch, heads, seq, dim] outputs laid out as
// [batch, seq, heads, dim], permuted activations): each row is a run of words of the logical
// stream. A group of lanes (a power of two, up to the warp) reads a row with coalesced loads,
// so a warp reads several short rows side by side; each warp walks a contiguous range of rows,
// 32 bytes of rows per lane in flight, the rows' addresses advanced rather than divided out.
// Four blocks per SM stay resident (64 registers a thread), as with the contiguous kernel.
template <int K, bool kPairs, bool kTrusted>
__device__ __forceinline__ void rows_body(const Args& a, uint64_t& hash,
                                          ThreadStats<typename Decode<K>::Acc>& st,
                                          ThreadSketch<K>& sk) {
  constexpr int kWords = kPairs ? 2 : 1;     // words per load
  constexpr int kInFlight = kPairs ? 2 : 4;  // 32 bytes of each lane's rows in flight
  const uint64_t row_words = static_cast<uint64_t>(a.sizes[a.ndim - 1]) * a.itemsize / 8;
  const uint64_t row_loads = row_words / kWords;
  const uint64_t rows = a.nwords / row_words;
  uint32_t group = 1;
  while (group < 32 && group < row_loads) group *= 2;
  const uint32_t lane = threadIdx.x & 31, col = lane % group;
  const uint64_t warp = (static_cast<uint64_t>(blockIdx.x) * kThreads + threadIdx.x) / 32;
  const uint64_t warps = static_cast<uint64_t>(gridDim.x) * (kThreads / 32);
  const uint64_t span = (rows + warps - 1) / warps;
  const uint64_t end = min(rows, (warp + 1) * span);
  RowCursor cursor(a, warp * span + lane / group);
  if (row_loads > group) {  // rows longer than the warp reads at once: one at a time
    for (; cursor.row < end; cursor.advance(a, 1)) {
      const uint8_t* start = a.data + cursor.offset * a.itemsize;
      const uint64_t first_word = cursor.row * row_words;
#pragma unroll 4
      for (uint64_t c = col; c < row_loads; c += group) {
        RowLoad<kPairs> load;
        load.load(start + c * 8 * kWords);
        load.template consume<K, kTrusted>(first_word + c * kWords, a, hash, st, sk);
      }
    }
  } else {  // several rows side by side, kInFlight of them per lane before any is consumed
    const uint32_t step = 32 / group;
    while (cursor.row < end) {
      const uint64_t first_row = cursor.row;
      RowLoad<kPairs> loads[kInFlight];
      int taken = 0;
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) {
        if (cursor.row < end) {
          if (col < row_loads)
            loads[u].load(a.data + cursor.offset * a.itemsize + col * 8 * kWords);
          taken = u + 1;
          cursor.advance(a, step);
        }
      }
#pragma unroll
      for (int u = 0; u < kInFlight; ++u) {
        if (u < taken && col < row_loads) {
          const uint64_t row = first_row + u * step;
          loads[u].template consume<K, kTrusted>(row * row_words + col * kWords, a, hash, st, sk);
        }
      }
    }
  }
}

template <int K, bool kPairs>
__global__ void __launch_bounds__(kThreads, 4) rows_kernel(const Args a) {
  ThreadStats<typename Decode<K>::Acc> st;
  ThreadSketch<K> sk;
  uint64_t hash = 0;
  if constexpr (kPairs) {
    trusting(hash, st, sk,
             [&](auto trusted) { rows_body<K, true, decltype(trusted)::value>(a, hash, st, sk); });
  } else {
    rows_body<K, false, false>(a, hash, st, sk);
  }
  write_head(a, blockIdx.x, false);
  publish(a, blockIdx.x, hash, st, sk);
}

using KernelFn = void (*)(const Args);
using MultiFn = void (*)(const MultiArgs);

enum class Layout { Contiguous, Rows, RowPairs, Strided };

// The kernels of one element kind.
struct Kernels {
  KernelFn contiguous, rows, row_pairs, strided;
  MultiFn multi;

  KernelFn pick(Layout layout) const {
    switch (layout) {
      case Layout::Contiguous:
        return contiguous;
      case Layout::Rows:
        return rows;
      case Layout::RowPairs:
        return row_pairs;
      default:
        return strided;
    }
  }
};

template <int K>
Kernels kernels_of() {
  return Kernels{fingerprint_kernel<K, true>, rows_kernel<K, false>, rows_kernel<K, true>,
                 fingerprint_kernel<K, false>, multi_kernel<K>};
}

// Whether the start and every outer step of a tensor fall on `bytes`-byte boundaries.
bool rows_aligned(const uint8_t* data, int64_t itemsize, const std::vector<int64_t>& strides,
                  int64_t bytes) {
  if (reinterpret_cast<uintptr_t>(data) % bytes != 0) return false;
  for (size_t d = 0; d + 1 < strides.size(); ++d) {
    if ((strides[d] * itemsize) % bytes != 0) return false;
  }
  return true;
}

// Rows when the innermost dimension is contiguous, holds whole words, and every row starts on
// a word boundary (row pairs when rows are whole 16-byte loads at 16-byte boundaries);
// otherwise element-by-element gathering.
Layout layout_of(const uint8_t* data, int64_t itemsize, const std::vector<int64_t>& sizes,
                 const std::vector<int64_t>& strides) {
  const size_t n = sizes.size();
  if (n == 0 || (n == 1 && strides[0] == 1)) return Layout::Contiguous;
  const int64_t row_bytes = sizes[n - 1] * itemsize;
  if (strides[n - 1] != 1 || row_bytes % 8 != 0) return Layout::Strided;
  if (row_bytes % 16 == 0 && rows_aligned(data, itemsize, strides, 16)) return Layout::RowPairs;
  return rows_aligned(data, itemsize, strides, 8) ? Layout::Rows : Layout::Strided;
}

Kernels kernels_for(Kind kind) {
  switch (kind) {
#define OPG_GENERIC(K) \
  case Kind::K:        \
    return kernels_of<static_cast<int>(Kind::K)>();
    OPG_GENERIC(Float32)
    OPG_GENERIC(BFloat16)
    OPG_GENERIC(Float16)
    OPG_GENERIC(Float64)
    OPG_GENERIC(Opaque)
    OPG_GENERIC(Bool)
    OPG_GENERIC(UInt)
    OPG_GENERIC(Int)
    OPG_GENERIC(Complex32)
    OPG_GENERIC(Complex64)
    OPG_GENERIC(Complex128)
    OPG_GENERIC(F8E4M3FN)
    OPG_GENERIC(F8E4M3FNUZ)
    OPG_GENERIC(F8E5M2)
    OPG_GENERIC(F8E5M2FNUZ)
    OPG_GENERIC(F8E8M0FNU)
#undef OPG_GENERIC
  }
  return kernels_of<static_cast<int>(Kind::Opaque)>();
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// The runtime reports a missing driver as an insufficient one: tell them apart by the driver's
// version, which the runtime gives as 0 when no driver is installed.
std::string driver_problem(cudaError_t err) {
  int driver = 0, runtime = 0;
  if (err != cudaErrorInsufficientDriver || cudaDriverGetVersion(&driver) != cudaSuccess ||
      cudaRuntimeGetVersion(&runtime) != cudaSuccess) {
    return cudaGetErrorString(err);
  }
  if (driver == 0) return "no NVIDIA driver";
  auto version = [](int v) {
    return std::to_string(v / 1000) + "." + std::to_string(v % 1000 / 10);
  };
  return "the NVIDIA driver supports CUDA " + version(driver) + ", older than the CUDA " +
         version(runtime) + " runtime OpGuard was built with";
}

}  // namespace

bool available(std::string* why) {
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    if (why) *why = driver_problem(err);
    cudaGetLastError();
    return false;
  }
  if (count == 0) {
    if (why) *why = "no CUDA device";
    return false;
  }
  return true;
}

GpuFingerprinter::GpuFingerprinter(uint64_t partial_capacity, uint64_t head_capacity,
                                   int blocks_per_sm)
    : partial_capacity_(partial_capacity), head_capacity_(head_capacity) {
  check(cudaHostAlloc(reinterpret_cast<void**>(&partials_), partial_capacity * sizeof(Partial),
                      cudaHostAllocMapped | cudaHostAllocPortable),
        "allocating the fingerprint result ring");
  check(cudaHostAlloc(reinterpret_cast<void**>(&heads_), head_capacity * kHeadBytes,
                      cudaHostAllocMapped | cudaHostAllocPortable),
        "allocating the head-bytes ring");
  for (uint64_t i = 0; i < partial_capacity; ++i) partials_[i].seq = ~0ull;
  int device = 0, sms = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  check(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device), "SM count");
  max_blocks_ = static_cast<uint64_t>(std::max(1, sms * blocks_per_sm));
}

GpuFingerprinter::~GpuFingerprinter() {
  cudaFreeHost(partials_);
  cudaFreeHost(heads_);
}

void GpuFingerprinter::reclaim() {
  while (!outstanding_.empty() && outstanding_.front().collected) {
    const Outstanding& o = outstanding_.front();
    partial_tail_ = o.first + o.blocks;
    head_tail_ = o.head_slot + 1;
    outstanding_.pop_front();
  }
  if (outstanding_.empty()) {
    partial_tail_ = partial_head_;
    head_tail_ = head_next_;
  }
}

bool GpuFingerprinter::wait_for_space(uint64_t blocks, uint64_t heads, double timeout_s) {
  const auto t0 = std::chrono::steady_clock::now();
  while (true) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      reclaim();
      // A launch takes a contiguous run of partials; skipping to the ring's start wastes the
      // tail end, which is accounted for by advancing the head past it.
      uint64_t start = partial_head_;
      const uint64_t offset = start % partial_capacity_;
      if (offset + blocks > partial_capacity_) start += partial_capacity_ - offset;
      const bool partials_free = start + blocks - partial_tail_ <= partial_capacity_;
      const bool heads_free = head_next_ + heads - head_tail_ <= head_capacity_;
      if (partials_free && heads_free) {
        partial_head_ = start;
        return true;
      }
    }
    if (timeout_s <= 0 || seconds_since(t0) > timeout_s) return false;
    std::this_thread::sleep_for(std::chrono::microseconds(200));
  }
}

// How one tensor is fingerprinted: its kernel arguments (ring slots still unset), layout and
// number of blocks.
struct Plan {
  Args a{};
  Layout layout = Layout::Contiguous;
  uint64_t blocks = 1;
};

Plan GpuFingerprinter::plan(const TensorView& view, int64_t head_elements) const {
  Plan p;
  Args& a = p.a;
  std::vector<int64_t> sizes, strides;
  coalesce(view, sizes, strides);
  uint64_t numel = 1;
  for (int64_t s : view.sizes) numel *= static_cast<uint64_t>(s);
  if (sizes.size() > static_cast<size_t>(kMaxDims)) {
    throw std::runtime_error("tensor has more than 16 non-mergeable dimensions");
  }
  p.layout = layout_of(view.data, view.itemsize, sizes, strides);
  a.data = view.data;
  a.itemsize = static_cast<int32_t>(view.itemsize);
  a.kind = static_cast<int32_t>(view.kind);
  a.numel = numel;
  a.nbytes = numel * static_cast<uint64_t>(view.itemsize);
  a.nwords = (a.nbytes + 7) / 8;
  a.ndim = static_cast<int32_t>(sizes.size());
  for (size_t d = 0; d < sizes.size(); ++d) {
    a.sizes[d] = sizes[d];
    a.strides[d] = strides[d];
  }
  a.head_bytes = static_cast<int32_t>(
      std::min<uint64_t>(a.nbytes, static_cast<uint64_t>(head_elements) * view.itemsize));
  a.head_bytes = std::min(a.head_bytes, kHeadBytes);
  // Four blocks per SM keep enough loads in flight for DRAM while bounding the partials each
  // launch writes and the host reduces. A block gets at least four passes of its threads' loads
  // (32 words a thread): its fixed cost (zeroing and reducing the sketch, publishing its partial
  // over the bus) is paid once per 64 KiB, which matters in a list's launch (AdamW's 148
  // parameters: 21,000 blocks of one pass took half as long again as 5,500 of four).
  const uint64_t per_block = static_cast<uint64_t>(kThreads) * 32;
  p.blocks = std::max<uint64_t>(
      1, std::min<uint64_t>(max_blocks_, (a.nwords + per_block - 1) / per_block));
  return p;
}

Ticket GpuFingerprinter::issue(Plan& p) {
  Ticket t;
  t.seq = ++seq_;
  t.first = partial_head_;
  t.blocks = static_cast<uint32_t>(p.blocks);
  t.head_slot = head_next_;
  partial_head_ += p.blocks;
  head_next_ += 1;
  outstanding_.push_back({t.seq, t.first, p.blocks, t.head_slot, false});
  t.nbytes = p.a.nbytes;
  t.numel = p.a.numel;
  t.itemsize = p.a.itemsize;
  t.kind = p.a.kind;
  t.head_bytes = p.a.head_bytes;
  p.a.partials = partials_ + (t.first % partial_capacity_);
  p.a.head = heads_ + (t.head_slot % head_capacity_) * kHeadBytes;
  p.a.seq = t.seq;
  return t;
}

namespace {

// Runs `launch` on `device` as OpGuard's own GPU work (never reported as another op's).
template <typename Launch>
void on_device(int device, Launch launch) {
  const cupti::OwnWork own;
  int current = -1;
  check(cudaGetDevice(&current), "cudaGetDevice");
  if (current != device) check(cudaSetDevice(device), "cudaSetDevice");
  launch();
  const cudaError_t err = cudaGetLastError();
  if (current != device) cudaSetDevice(current);
  check(err, "launching the fingerprint kernel");
}

}  // namespace

Ticket GpuFingerprinter::launch(const TensorView& view, int device, uintptr_t stream,
                                int64_t head_elements, double timeout_s) {
  Plan p = plan(view, head_elements);
  return launch_planned(p, device, stream, timeout_s);
}

Ticket GpuFingerprinter::launch_planned(Plan& p, int device, uintptr_t stream, double timeout_s) {
  if (!wait_for_space(p.blocks, 1, timeout_s)) {
    if (timeout_s <= 0) return Ticket{};
    throw std::runtime_error("fingerprint results were not collected in time (ring full)");
  }
  Ticket t;
  {
    std::lock_guard<std::mutex> lock(mutex_);
    t = issue(p);
  }
  const Args& a = p.a;
  if (a.numel == 0) {  // nothing to read: complete on the host
    for (uint64_t b = 0; b < p.blocks; ++b) {
      Partial& partial = a.partials[b];
      partial.hash = 0;
      partial.min = INFINITY;
      partial.max = -INFINITY;
      partial.absmax = 0;
      partial.sum = 0;
      partial.nan = partial.inf = 0;
      partial.seq = a.seq;
    }
    return t;
  }
  const KernelFn kernel = kernels_for(static_cast<Kind>(a.kind)).pick(p.layout);
  ++kernel_launches_;
  on_device(device, [&] {
    kernel<<<static_cast<unsigned>(p.blocks), kThreads, 0,
             reinterpret_cast<cudaStream_t>(stream)>>>(a);
  });
  return t;
}

size_t GpuFingerprinter::launch_many(const std::vector<TensorView>& views, int device,
                                     uintptr_t stream, int64_t head_elements, double timeout_s,
                                     std::vector<Ticket>* tickets) {
  const size_t start = tickets->size();
  std::vector<Plan> plans;
  plans.reserve(views.size());
  for (const TensorView& view : views) plans.push_back(plan(view, head_elements));
  const auto shares_launch = [](const Plan& p) {
    return p.layout == Layout::Contiguous && p.a.numel > 0;
  };
  size_t i = 0;
  while (i < plans.size()) {
    // a run of contiguous, non-empty tensors of one kind shares a launch
    size_t end = i + 1;
    if (shares_launch(plans[i])) {
      while (end < plans.size() && end - i < kMaxPieces && shares_launch(plans[end]) &&
             plans[end].a.kind == plans[i].a.kind) {
        ++end;
      }
    }
    if (end - i == 1) {
      const Ticket t = launch_planned(plans[i], device, stream, timeout_s);
      if (t.seq == 0) break;
      tickets->push_back(t);
      ++i;
      continue;
    }
    Plan* run = plans.data() + i;
    const size_t count = end - i;
    uint64_t blocks = 0;
    for (size_t k = 0; k < count; ++k) blocks += run[k].blocks;
    if (!wait_for_space(blocks, count, timeout_s)) {
      if (timeout_s <= 0) break;
      throw std::runtime_error("fingerprint results were not collected in time (ring full)");
    }
    MultiArgs m{};
    m.count = static_cast<int32_t>(count);
    m.itemsize = run[0].a.itemsize;
    m.kind = run[0].a.kind;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      uint32_t first = 0;
      for (size_t k = 0; k < count; ++k) {
        tickets->push_back(issue(run[k]));
        const Args& a = run[k].a;
        m.pieces[k] = Piece{a.data,
                            a.nbytes,
                            a.partials,
                            a.head,
                            a.seq,
                            a.head_bytes,
                            static_cast<uint32_t>(run[k].blocks)};
        m.first_block[k] = first;
        first += static_cast<uint32_t>(run[k].blocks);
      }
    }
    const MultiFn kernel = kernels_for(static_cast<Kind>(m.kind)).multi;
    ++kernel_launches_;
    on_device(device, [&] {
      kernel<<<static_cast<unsigned>(blocks), kThreads, 0,
               reinterpret_cast<cudaStream_t>(stream)>>>(m);
    });
    i = end;
  }
  return tickets->size() - start;
}

double GpuFingerprinter::load() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return std::max(static_cast<double>(partial_head_ - partial_tail_) / partial_capacity_,
                  static_cast<double>(head_next_ - head_tail_) / head_capacity_);
}

bool GpuFingerprinter::ready(const Ticket& t) const {
  const Partial* p = partials_ + (t.first % partial_capacity_);
  for (uint32_t b = 0; b < t.blocks; ++b) {
    if (p[b].seq != t.seq) return false;
  }
  return true;
}

Fingerprint GpuFingerprinter::collect(const Ticket& t, double timeout_s) {
  const auto t0 = std::chrono::steady_clock::now();
  int spins = 0;
  while (!ready(t)) {
    if (seconds_since(t0) > timeout_s) {
      throw std::runtime_error("GPU fingerprint did not complete in time");
    }
    if (++spins > 64) std::this_thread::sleep_for(std::chrono::microseconds(100));
  }
  std::atomic_thread_fence(std::memory_order_acquire);
  Fingerprint fp;
  fp.nbytes = t.nbytes;
  const Partial* p = partials_ + (t.first % partial_capacity_);
  for (uint32_t b = 0; b < t.blocks; ++b) {
    fp.hash += p[b].hash;
    fp.stats.min = std::min(fp.stats.min, p[b].min);
    fp.stats.max = std::max(fp.stats.max, p[b].max);
    fp.stats.absmax = std::max(fp.stats.absmax, p[b].absmax);
    fp.stats.sum += p[b].sum;
    fp.stats.nan += p[b].nan;
    fp.stats.inf += p[b].inf;
  }
  const Kind kind = static_cast<Kind>(t.kind);
  const uint64_t values = t.numel * static_cast<uint64_t>(components_of(kind));
  fp.stats.finite = values - fp.stats.nan - fp.stats.inf;
  if (has_sketch(kind) && t.numel > 0) {
    SketchSums sums = SketchSums::empty();
    for (uint32_t b = 0; b < t.blocks; ++b) sums.merge(p[b].sketch);
    StoredSketch stored;
    if (store_sketch(kind, fp.stats, sums, stored)) fp.sketch = stored;
  }
  const uint8_t* head = heads_ + (t.head_slot % head_capacity_) * kHeadBytes;
  fp.head.assign(head, head + t.head_bytes);
  std::lock_guard<std::mutex> lock(mutex_);
  // Tickets are queued in launch order with consecutive sequence numbers.
  if (!outstanding_.empty() && t.seq >= outstanding_.front().seq) {
    const uint64_t at = t.seq - outstanding_.front().seq;
    if (at < outstanding_.size()) outstanding_[at].collected = true;
  }
  reclaim();
  return fp;
}

}  // namespace cuda
}  // namespace opguard
