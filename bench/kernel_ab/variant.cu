// One variant of the GPU fingerprinter behind a C interface. Compile with
// -Dopguard=<ns> -DAPI_PREFIX=<ns> -DVARIANT_SRC='"path/to/fingerprint_cuda.cu"'.
#include VARIANT_SRC
#include <cstring>
#include <vector>

#include "api.h"

namespace opguard {
namespace cupti {
OwnWork::OwnWork() {}
OwnWork::~OwnWork() {}
}  // namespace cupti
}  // namespace opguard

#define CAT2(a, b) a##_##b
#define CAT(a, b) CAT2(a, b)
#define API(x) CAT(API_PREFIX, x)

namespace {
struct Handle {
  opguard::cuda::GpuFingerprinter* g;
  std::vector<opguard::cuda::Ticket> pending;
};

opguard::TensorView to_view(const HView& h) {
  opguard::TensorView v;
  v.data = h.data;
  v.itemsize = h.itemsize;
  v.sizes.assign(h.sizes, h.sizes + h.ndim);
  v.strides.assign(h.strides, h.strides + h.ndim);
  v.kind = static_cast<opguard::Kind>(h.kind);
  return v;
}

void to_result(const opguard::Fingerprint& fp, HResult* r) {
  memset(r, 0, sizeof *r);
  r->hash = fp.hash;
  r->nbytes = fp.nbytes;
  r->min = fp.stats.min;
  r->max = fp.stats.max;
  r->sum = fp.stats.sum;
  r->absmax = fp.stats.absmax;
  r->finite = fp.stats.finite;
  r->nan = fp.stats.nan;
  r->inf = fp.stats.inf;
  r->has_sketch = fp.sketch.has_value();
  if (fp.sketch) memcpy(r->sketch, fp.sketch->data(), 60);
  r->head_len = static_cast<int32_t>(fp.head.size());
  memcpy(r->head, fp.head.data(), fp.head.size() < 128 ? fp.head.size() : 128);
}
}  // namespace

extern "C" void* API(create)() {
  return new Handle{new opguard::cuda::GpuFingerprinter(1 << 18, 1 << 14, 4), {}};
}

// Fingerprints `n` views with launch_many (runs of contiguous views of one kind share a
// launch) and collects them.
extern "C" int API(gpu)(void* h, const HView* views, int n, void* stream, HResult* out) {
  auto* handle = static_cast<Handle*>(h);
  std::vector<opguard::TensorView> vs;
  for (int i = 0; i < n; ++i) vs.push_back(to_view(views[i]));
  std::vector<opguard::cuda::Ticket> tickets;
  const size_t launched =
      handle->g->launch_many(vs, 0, reinterpret_cast<uintptr_t>(stream), 8, 10.0, &tickets);
  if (launched != static_cast<size_t>(n)) return -1;
  for (int i = 0; i < n; ++i) to_result(handle->g->collect(tickets[i], 30.0), &out[i]);
  return 0;
}

// Launches only (for timing); collect_all() collects what is pending.
extern "C" int API(launch)(void* h, const HView* views, int n, void* stream) {
  auto* handle = static_cast<Handle*>(h);
  std::vector<opguard::TensorView> vs;
  for (int i = 0; i < n; ++i) vs.push_back(to_view(views[i]));
  const size_t launched =
      handle->g->launch_many(vs, 0, reinterpret_cast<uintptr_t>(stream), 8, 10.0, &handle->pending);
  return launched == static_cast<size_t>(n) ? 0 : -1;
}

extern "C" int API(collect_all)(void* h) {
  auto* handle = static_cast<Handle*>(h);
  for (const auto& t : handle->pending) handle->g->collect(t, 30.0);
  const int n = static_cast<int>(handle->pending.size());
  handle->pending.clear();
  return n;
}

extern "C" void API(cpu)(const HView* view, HResult* out) {
  to_result(opguard::fingerprint_cpu(to_view(*view), 8, true), out);
}
