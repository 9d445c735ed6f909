// Two builds of the GPU fingerprint kernels side by side in one process (bench/kernel_ab/run.sh):
// "base" (a revision's csrc/fingerprint_cuda.cu) and "work" (the working tree's). First every
// kind of tensor (contiguous at any alignment, strided, permuted rows, transposed, a list in
// one launch; normal values, values with NaNs and infinities, random bits, a lone NaN and
// infinity) is fingerprinted by both and by the CPU: work's results against base's, bit for
// bit, and each against the CPU's (hash, counts, min, max, abs-max exactly, the sketch within a
// quantization step). Then both are timed: 512 MiB of each floating kind, GPT-2 124M's tensor
// sizes one launch each, its attention heads permuted, and its 148 parameters in one launch.
#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "api.h"

#define DECL(ns)                                                      \
  extern "C" void* ns##_create();                                     \
  extern "C" int ns##_gpu(void*, const HView*, int, void*, HResult*); \
  extern "C" int ns##_launch(void*, const HView*, int, void*);        \
  extern "C" int ns##_collect_all(void*);                             \
  extern "C" void ns##_cpu(const HView*, HResult*);
DECL(base)
DECL(work)

struct Variant {
  const char* name;
  void* (*create)();
  int (*gpu)(void*, const HView*, int, void*, HResult*);
  int (*launch)(void*, const HView*, int, void*);
  int (*collect_all)(void*);
  void* h;
};

#define CK(x)                                                                        \
  do {                                                                               \
    cudaError_t e = (x);                                                             \
    if (e != cudaSuccess) {                                                          \
      printf("CUDA error %s at %s:%d\n", cudaGetErrorString(e), __FILE__, __LINE__); \
      exit(2);                                                                       \
    }                                                                                \
  } while (0)

static uint64_t rng_state = 0x1234567887654321ull;
static uint64_t rnd() {
  uint64_t x = rng_state;
  x ^= x << 13;
  x ^= x >> 7;
  x ^= x << 17;
  return rng_state = x;
}

struct KindInfo {
  int kind;
  int itemsize;
  const char* name;
};
static const KindInfo kKinds[] = {
    {6, 4, "f32"}, {5, 2, "bf16"},   {4, 2, "f16"},   {7, 8, "f64"},   {1, 1, "bool"},
    {2, 1, "u8"},  {3, 1, "i8"},     {3, 2, "i16"},   {3, 4, "i32"},   {3, 8, "i64"},
    {9, 8, "c64"}, {10, 16, "c128"}, {11, 1, "e4m3"}, {13, 1, "e5m2"}, {0, 4, "opaque"},
};

// Element `i` of a buffer of `kind` in data mode `mode` (0: normal values, 1: with specials,
// 2: random bits), written at p.
static void make_element(const KindInfo& k, int mode, uint8_t* p) {
  uint64_t r = rnd();
  if (mode == 2 ||
      (k.kind != 4 && k.kind != 5 && k.kind != 6 && k.kind != 7 && k.kind != 9 && k.kind != 10)) {
    for (int b = 0; b < k.itemsize; ++b) p[b] = static_cast<uint8_t>(rnd() >> 24);
    if (k.kind == 1) p[0] &= 1;
    return;
  }
  int special = -1;
  if (mode == 1 && r % 64 == 0) special = static_cast<int>((r >> 8) % 8);
  auto one = [&](uint8_t* q, int size) {
    uint64_t s = rnd();
    uint64_t sign = s & 1;
    if (size == 4) {
      uint32_t e = 120 + (s >> 1) % 15, m = static_cast<uint32_t>(s >> 8) & 0x7FFFFF;
      uint32_t bits = static_cast<uint32_t>(sign << 31) | e << 23 | m;
      if (special == 0) bits = 0x7FC00000u;                                // NaN
      if (special == 1) bits = 0x7F800000u | (uint32_t)sign << 31;         // inf
      if (special == 2) bits = (uint32_t)sign << 31;                       // +-0
      if (special == 3) bits = (uint32_t)(sign << 31) | (m >> 3);          // denormal
      if (special == 4) bits = (uint32_t)(sign << 31) | 0x7F7FFFFFu;       // max finite
      if (special == 5) bits = (uint32_t)(sign << 31) | (250u << 23) | m;  // huge
      memcpy(q, &bits, 4);
    } else if (size == 2 && k.kind == 5) {  // bf16
      uint32_t e = 120 + (s >> 1) % 15, m = static_cast<uint32_t>(s >> 8) & 0x7F;
      uint16_t bits = static_cast<uint16_t>(sign << 15 | e << 7 | m);
      if (special == 0) bits = 0x7FC0;
      if (special == 1) bits = static_cast<uint16_t>(0x7F80 | sign << 15);
      if (special == 2) bits = static_cast<uint16_t>(sign << 15);
      if (special == 3) bits = static_cast<uint16_t>(sign << 15 | (m & 0x3F) | 1);
      if (special == 4) bits = static_cast<uint16_t>(sign << 15 | 0x7F7F);
      if (special == 5) bits = static_cast<uint16_t>(sign << 15 | 250 << 7 | m);
      memcpy(q, &bits, 2);
    } else if (size == 2) {  // f16
      uint32_t e = 10 + (s >> 1) % 10, m = static_cast<uint32_t>(s >> 8) & 0x3FF;
      uint16_t bits = static_cast<uint16_t>(sign << 15 | e << 10 | m);
      if (special == 0) bits = 0x7E00;
      if (special == 1) bits = static_cast<uint16_t>(0x7C00 | sign << 15);
      if (special == 2) bits = static_cast<uint16_t>(sign << 15);
      if (special == 3) bits = static_cast<uint16_t>(sign << 15 | (m | 1));
      if (special == 4) bits = static_cast<uint16_t>(sign << 15 | 0x7BFF);
      if (special == 5) bits = static_cast<uint16_t>(sign << 15 | 30 << 10 | m);
      memcpy(q, &bits, 2);
    } else {  // 8: f64
      uint64_t e = 1016 + (s >> 1) % 15, m = rnd() & ((1ull << 52) - 1);
      uint64_t bits = sign << 63 | e << 52 | m;
      if (special == 0) bits = 0x7FF8000000000000ull;
      if (special == 1) bits = 0x7FF0000000000000ull | sign << 63;
      if (special == 2) bits = sign << 63;
      if (special == 3) bits = sign << 63 | (m >> 3);
      if (special == 4) bits = sign << 63 | 0x7FEFFFFFFFFFFFFFull;
      if (special == 5) bits = sign << 63 | 2040ull << 52 | m;
      memcpy(q, &bits, 8);
    }
  };
  if (k.kind == 9) {
    one(p, 4);
    one(p + 4, 4);
  } else if (k.kind == 10) {
    one(p, 8);
    one(p + 8, 8);
  } else {
    one(p, k.itemsize);
  }
}

static bool same(const HResult& a, const HResult& b) { return memcmp(&a, &b, sizeof a) == 0; }

static void describe(const char* what, const HResult& a, const HResult& b) {
  printf(
      "    %s: hash %016llx/%016llx nbytes %llu/%llu min %.17g/%.17g max %.17g/%.17g sum "
      "%.17g/%.17g "
      "absmax %.17g/%.17g finite %llu/%llu nan %llu/%llu inf %llu/%llu sketch %d/%d %s head "
      "%d/%d\n",
      what, (unsigned long long)a.hash, (unsigned long long)b.hash, (unsigned long long)a.nbytes,
      (unsigned long long)b.nbytes, a.min, b.min, a.max, b.max, a.sum, b.sum, a.absmax, b.absmax,
      (unsigned long long)a.finite, (unsigned long long)b.finite, (unsigned long long)a.nan,
      (unsigned long long)b.nan, (unsigned long long)a.inf, (unsigned long long)b.inf, a.has_sketch,
      b.has_sketch, memcmp(a.sketch, b.sketch, 60) ? "sketch-bytes-differ" : "sketch-bytes-same",
      a.head_len, b.head_len);
}

// The sketch test of tests/test_cuda.py: norms within 1e-6, buckets within one step.
static bool sketch_close(const HResult& g, const HResult& c) {
  if (g.has_sketch != c.has_sketch) return false;
  if (!g.has_sketch) return true;
  float gn, cn;
  memcpy(&gn, g.sketch, 4);
  memcpy(&cn, c.sketch, 4);
  if (!(std::fabs(gn - cn) <= 1e-6 * std::fabs(cn) + 1e-12)) return false;
  int e;
  std::frexp(static_cast<double>(cn), &e);
  const double step = std::ldexp(1.0, e - 28);
  int32_t gq[14], cq[14];
  memcpy(gq, g.sketch + 4, 56);
  memcpy(cq, c.sketch + 4, 56);
  int ge;
  std::frexp(static_cast<double>(gn), &ge);
  const double gstep = std::ldexp(1.0, ge - 28);
  for (int b = 0; b < 14; ++b) {
    if (std::fabs(gq[b] * gstep - cq[b] * step) > step) return false;
  }
  return true;
}

struct Case {
  std::string label;
  std::vector<HView> views;  // device views (launched together)
  std::vector<HView> host;   // the same views over the host copy
};

int main() {
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  printf("device %s, %d SMs\n", prop.name, prop.multiProcessorCount);
  cudaStream_t stream;
  CK(cudaStreamCreate(&stream));
  Variant vars[] = {{"base", base_create, base_gpu, base_launch, base_collect_all, nullptr},
                    {"work", work_create, work_gpu, work_launch, work_collect_all, nullptr}};
  const int nv = 2;
  for (auto& v : vars) v.h = v.create();

  // ---- correctness: a buffer per (kind, mode); views of it
  const size_t kBuf = 64ull << 20;  // bytes per test buffer
  uint8_t* host = nullptr;
  CK(cudaMallocHost(&host, kBuf));
  uint8_t* dev = nullptr;
  CK(cudaMalloc(&dev, kBuf + 4096));
  int mismatches[2] = {}, cpu_bad[2] = {}, cases = 0;
  const int64_t lens[] = {
      1,       2,      3,   5,   7,   8,   9,    15,   16,   17,    31,
      33,      64,     100, 255, 256, 257, 1000, 1023, 4099, 65539, (1 << 20) + 1,
      3 << 20, 5000011};
  for (const KindInfo& k : kKinds) {
    for (int mode = 0; mode < 4; ++mode) {
      if (mode > 0 && !(k.kind >= 4 && k.kind <= 7) && k.kind != 9 && k.kind != 10 && mode == 1)
        continue;
      if (mode == 3 && !(k.kind >= 4 && k.kind <= 7)) continue;
      const size_t n = kBuf / k.itemsize - 64;
      const size_t fill = std::min<size_t>(n, 5000011 + 4096);
      for (size_t i = 0; i < fill; ++i)
        make_element(k, mode == 3 ? 0 : mode, host + i * k.itemsize);
      if (mode == 3) {  // normal values but a lone NaN and a lone infinity: few warps see them
        for (size_t at : {size_t{123457}, size_t{4000001}, size_t{70}}) {
          uint8_t* q = host + at * k.itemsize;
          const bool nan = at != 4000001;
          if (k.itemsize == 4) {
            uint32_t b = nan ? 0x7FC00000u : 0xFF800000u;
            memcpy(q, &b, 4);
          } else if (k.itemsize == 8) {
            uint64_t b = nan ? 0x7FF8000000000000ull : 0x7FF0000000000000ull;
            memcpy(q, &b, 8);
          } else if (k.kind == 5) {
            uint16_t b = nan ? 0x7FC0 : 0x7F80;
            memcpy(q, &b, 2);
          } else {
            uint16_t b = nan ? 0x7E00 : 0x7C00;
            memcpy(q, &b, 2);
          }
        }
      }
      CK(cudaMemcpy(dev, host, fill * k.itemsize, cudaMemcpyHostToDevice));
      std::vector<Case> cs;
      auto view1 = [&](int64_t off, int64_t len, int64_t step) {
        HView v{};
        v.data = dev + off * k.itemsize;
        v.itemsize = k.itemsize;
        v.ndim = 1;
        v.sizes[0] = len;
        v.strides[0] = step;
        v.kind = k.kind;
        return v;
      };
      auto add_case = [&](const std::string& label, std::vector<HView> vs) {
        Case c{label, vs, vs};
        for (auto& h : c.host) h.data = host + (h.data - dev);
        cs.push_back(c);
      };
      for (int64_t len : lens) {
        if (static_cast<size_t>(len) + 64 > fill) continue;
        for (int64_t off : {0, 1, 16 / k.itemsize > 1 ? 16 / k.itemsize : 2, 3}) {
          add_case(std::to_string(len) + "@" + std::to_string(off), {view1(off, len, 1)});
        }
        if (len > 3) add_case(std::to_string(len) + " step 3", {view1(3, len / 3, 3)});
      }
      // permuted outer dims, contiguous rows of C elements: [A, B, C] read as [B, A, C]
      for (int64_t C : {1, 2, 3, 4, 8, 12, 16, 64, 100, 768}) {
        for (int64_t A : {3, 8}) {
          for (int64_t B : {5, 33, 1024}) {
            if (static_cast<size_t>(A * B * C) + 64 > fill) continue;
            HView v{};
            v.data = dev;
            v.itemsize = k.itemsize;
            v.ndim = 3;
            v.sizes[0] = B;
            v.sizes[1] = A;
            v.sizes[2] = C;
            v.strides[0] = C;
            v.strides[1] = B * C;
            v.strides[2] = 1;
            v.kind = k.kind;
            add_case(
                "perm " + std::to_string(A) + "x" + std::to_string(B) + "x" + std::to_string(C),
                {v});
            HView t = v;  // transposed 2-D [A*B... ] as [C, A*B]
            t.ndim = 2;
            t.sizes[0] = C;
            t.sizes[1] = A * B;
            t.strides[0] = 1;
            t.strides[1] = C;
            if (A * B * C < 400000) add_case("transposed", {t});
          }
        }
      }
      // a list of contiguous tensors (launch_many: one multi-kernel launch)
      {
        std::vector<HView> list;
        int64_t at = 0;
        for (int64_t len : {5, 33 * 7, 4099, 70, 1 << 18, 768, 768 * 3, 1, 100003}) {
          list.push_back(view1(at, len, 1));
          at += (len + 64) / 64 * 64 + (list.size() % 3 == 0 ? 1 : 0);
        }
        add_case("list", list);
      }
      for (Case& c : cs) {
        const int m = static_cast<int>(c.views.size());
        std::vector<HResult> res[2];
        for (int vi = 0; vi < nv; ++vi) {
          res[vi].resize(m);
          if (vars[vi].gpu(vars[vi].h, c.views.data(), m, stream, res[vi].data()) != 0) {
            printf("launch failed\n");
            return 2;
          }
        }
        CK(cudaStreamSynchronize(stream));
        for (int i = 0; i < m; ++i) {
          ++cases;
          HResult cpu;
          int64_t numel = 1;
          for (int d = 0; d < c.host[i].ndim; ++d) numel *= c.host[i].sizes[d];
          const bool with_cpu = numel <= (1 << 20) + 1;
          if (with_cpu) work_cpu(&c.host[i], &cpu);
          for (int vi = 0; vi < nv; ++vi) {
            if (vi > 0 && !same(res[0][i], res[vi][i])) {
              if (++mismatches[vi] <= 5) {
                printf("MISMATCH %s %s mode %d %s #%d\n", vars[vi].name, k.name, mode,
                       c.label.c_str(), i);
                describe("base/work", res[0][i], res[vi][i]);
              }
            }
            const HResult& g = res[vi][i];
            if (!with_cpu) continue;
            const bool ok = g.hash == cpu.hash && g.nan == cpu.nan && g.inf == cpu.inf &&
                            (k.kind == 0 || g.finite == cpu.finite) &&  // opaque: no stats
                            g.min == cpu.min && g.max == cpu.max && g.absmax == cpu.absmax &&
                            sketch_close(g, cpu);
            if (!ok && ++cpu_bad[vi] <= 3) {
              printf("CPU-DIFF %s %s mode %d %s #%d\n", vars[vi].name, k.name, mode,
                     c.label.c_str(), i);
              describe("gpu/cpu", g, cpu);
            }
          }
        }
      }
    }
  }
  printf("checked %d tensors\n", cases);
  for (int vi = 0; vi < nv; ++vi)
    printf("  %s: differences from base %d, from the CPU %d\n", vars[vi].name, mismatches[vi],
           cpu_bad[vi]);

  // ---- timing
  const size_t kBig = 512ull << 20;
  uint8_t* big = nullptr;
  CK(cudaMalloc(&big, kBig + 4096));
  cudaEvent_t e0, e1;
  CK(cudaEventCreate(&e0));
  CK(cudaEventCreate(&e1));
  auto fill_big = [&](const KindInfo& k) {
    const size_t per = kBuf / k.itemsize - 64;
    for (size_t i = 0; i < per; ++i) make_element(k, 0, host + i * k.itemsize);
    for (size_t off = 0; off < kBig; off += per * k.itemsize) {
      const size_t bytes = std::min(per * k.itemsize, kBig - off);
      CK(cudaMemcpy(big + off, host, bytes, cudaMemcpyHostToDevice));
    }
  };
  auto time_views = [&](Variant& v, const std::vector<HView>& vs, int reps, int inner) {
    std::vector<float> ms;
    for (int r = 0; r < reps + 1; ++r) {
      CK(cudaEventRecord(e0, stream));
      for (int i = 0; i < inner; ++i) {
        if (v.launch(v.h, vs.data(), static_cast<int>(vs.size()), stream) != 0) {
          printf("launch failed\n");
          exit(2);
        }
      }
      CK(cudaEventRecord(e1, stream));
      CK(cudaEventSynchronize(e1));
      v.collect_all(v.h);
      float t;
      CK(cudaEventElapsedTime(&t, e0, e1));
      if (r > 0) ms.push_back(t / inner);
    }
    std::sort(ms.begin(), ms.end());
    return ms[ms.size() / 2];
  };
  double gbs[2][4] = {};
  const KindInfo timed_kinds[] = {{6, 4, "f32"}, {5, 2, "bf16"}, {4, 2, "f16"}, {7, 8, "f64"}};
  printf("\n%-34s", "512 MiB contiguous, GB/s read");
  for (int vi = 0; vi < nv; ++vi) printf(" %10s", vars[vi].name);
  printf("\n");
  for (int ki = 0; ki < 4; ++ki) {
    const KindInfo& k = timed_kinds[ki];
    fill_big(k);
    HView v{};
    v.data = big;
    v.itemsize = k.itemsize;
    v.ndim = 1;
    v.sizes[0] = kBig / k.itemsize;
    v.strides[0] = 1;
    v.kind = k.kind;
    std::vector<float> t[2];
    for (int round = 0; round < 3; ++round) {
      for (int vi = 0; vi < nv; ++vi) t[vi].push_back(time_views(vars[vi], {v}, 3, 5));
    }
    printf("%-34s", k.name);
    for (int vi = 0; vi < nv; ++vi) {
      std::sort(t[vi].begin(), t[vi].end());
      gbs[vi][ki] = kBig / (t[vi][1] * 1e-3) / 1e9;
      printf(" %10.0f", gbs[vi][ki]);
    }
    printf("\n");
  }
  // GPT-2 124M shapes (float32): per-tensor launches and the parameter list in one launch_many
  {
    fill_big(kKinds[0]);
    const int64_t shapes[] = {768,        2304,       3072,           768 * 768,
                              768 * 2304, 768 * 3072, 8 * 1024 * 768, 8 * 1024 * 3072,
                              50257 * 768};
    printf("\n%-34s", "float32 tensor, us per launch");
    for (int vi = 0; vi < nv; ++vi) printf(" %10s", vars[vi].name);
    printf("\n");
    for (int64_t n : shapes) {
      HView v{};
      v.data = big;
      v.itemsize = 4;
      v.ndim = 1;
      v.sizes[0] = n;
      v.strides[0] = 1;
      v.kind = 6;
      const int inner = n < 1000000 ? 200 : 20;
      std::vector<float> t[2];
      for (int round = 0; round < 3; ++round) {
        for (int vi = 0; vi < nv; ++vi) t[vi].push_back(time_views(vars[vi], {v}, 3, inner));
      }
      printf("%-34lld", (long long)n);
      for (int vi = 0; vi < nv; ++vi) {
        std::sort(t[vi].begin(), t[vi].end());
        printf(" %10.2f", t[vi][1] * 1e3);
      }
      printf("\n");
    }
    {  // attention heads: [8, 1024, 12, 64] read as [8, 12, 1024, 64] (the row kernel)
      HView v{};
      v.data = big;
      v.itemsize = 4;
      v.ndim = 4;
      const int64_t sz[4] = {8, 12, 1024, 64}, st[4] = {1024 * 12 * 64, 64, 12 * 64, 1};
      for (int d = 0; d < 4; ++d) v.sizes[d] = sz[d], v.strides[d] = st[d];
      v.kind = 6;
      std::vector<float> t[2];
      for (int round = 0; round < 3; ++round) {
        for (int vi = 0; vi < nv; ++vi) t[vi].push_back(time_views(vars[vi], {v}, 3, 20));
      }
      printf("%-34s", "heads permuted, 6291456");
      for (int vi = 0; vi < nv; ++vi) {
        std::sort(t[vi].begin(), t[vi].end());
        printf(" %10.2f", t[vi][1] * 1e3);
      }
      printf("\n");
    }
    std::vector<HView> params;
    int64_t at = 0;
    auto param = [&](int64_t n) {
      HView v{};
      v.data = big + at * 4;
      v.itemsize = 4;
      v.ndim = 1;
      v.sizes[0] = n;
      v.strides[0] = 1;
      v.kind = 6;
      params.push_back(v);
      at += (n + 63) / 64 * 64;
    };
    param(50257 * 768);
    param(1024 * 768);
    for (int l = 0; l < 12; ++l) {
      for (int64_t n : {768, 768, 768 * 2304, 2304, 768 * 768, 768, 768, 768, 768 * 3072, 3072,
                        3072 * 768, 768})
        param(n);
    }
    param(768);
    param(768);
    std::vector<float> t[2];
    for (int round = 0; round < 3; ++round) {
      for (int vi = 0; vi < nv; ++vi) t[vi].push_back(time_views(vars[vi], params, 3, 3));
    }
    printf("%-34s", "GPT-2's 148 parameters (list)");
    for (int vi = 0; vi < nv; ++vi) {
      std::sort(t[vi].begin(), t[vi].end());
      printf(" %10.2f", t[vi][1] * 1e3);
    }
    printf("\n");
  }
  printf("\nDONE\n");
  return 0;
}
