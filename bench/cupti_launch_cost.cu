// Host time of one kernel launch under each way OpGuard could tie GPU work to ops through CUPTI,
// measured in one process per way: what collecting kernels costs the training thread per launch,
// and whether CUPTI's external correlation ids would cost less than the API callbacks OpGuard
// uses (csrc/cupti_activity.cpp). A tiny kernel is launched 30,000 times per round on one
// stream, synchronising every 256 launches so that the launch queue never fills; the best of
// four rounds after one warm-up round is reported. Then the GPU's side: kernels that each spin
// for ~20 µs, queued 256 at a time far ahead of the GPU, timed by CUDA events; the GPU time per
// kernel beyond way 0's is what the way adds on the device (timestamps, gaps between kernels).
//
//   nvcc -O2 -arch=sm_90 bench/cupti_launch_cost.cu -o /tmp/cupti_launch_cost -lcupti \
//     -L/usr/local/cuda/extras/CUPTI/lib64
//   for way in 0 1 2 3 4 5 6 7; do /tmp/cupti_launch_cost $way; done
//
// Ways: 0 no CUPTI; 1 kernel activity only; 2 activity and callbacks on the launch APIs that do
// nothing; 3 activity and callbacks that tag each launch in a locked map (what OpGuard does);
// 4 activity and external correlation ids (the launch APIs' own activity records), one push
// and pop per launch; 5 the same, one push and pop per three launches (an op's launches);
// 6 way 3 with launches through the driver API directly; 7 no CUPTI, driver API directly;
// 8 no CUPTI, a kernel taking 3.3 KiB of parameters (the fingerprints' multi-tensor launch);
// 9 no CUPTI, 328 bytes of parameters (their one-tensor launch).
#include <cuda.h>
#include <cuda_runtime.h>
#include <cupti.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <unordered_map>

namespace {

__global__ void tiny(float* p) {
  if (threadIdx.x == 0 && blockIdx.x == 0) p[0] += 1.0f;
}

// A kernel parameter block of `Bytes` bytes, its first word the pointer written.
template <int Bytes>
struct Params {
  float* p;
  char rest[Bytes - sizeof(float*)];
};

template <int Bytes>
__global__ void tiny_with(Params<Bytes> params) {
  if (threadIdx.x == 0 && blockIdx.x == 0) params.p[0] += params.rest[0];
}

// Spins for `cycles` of the SM's clock: a kernel long enough that the GPU, not the launching
// host, bounds a queue of them.
__global__ void spin(long long cycles) {
  const long long start = clock64();
  while (clock64() - start < cycles) {
  }
}

int way = 0;
std::mutex tags_mutex;
std::unordered_map<uint32_t, int64_t> tags;  // correlation id -> launch number (ways 3, 6)
thread_local int64_t current_launch = 0;
uint64_t records = 0;

bool tags_launches() { return way == 3 || way == 6; }
bool uses_cupti() { return way >= 1 && way <= 6; }
bool correlates_externally() { return way == 4 || way == 5; }

void CUPTIAPI on_launch(void*, CUpti_CallbackDomain, CUpti_CallbackId, const void* data) {
  if (!tags_launches()) return;
  const auto* info = static_cast<const CUpti_CallbackData*>(data);
  if (info->callbackSite != CUPTI_API_ENTER) return;
  std::lock_guard<std::mutex> lock(tags_mutex);
  tags[info->correlationId] = current_launch;
}

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(aligned_alloc(8, 1 << 20));
  *size = 1 << 20;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  CUpti_Activity* record = nullptr;
  while (cuptiActivityGetNextRecord(buffer, valid, &record) == CUPTI_SUCCESS) ++records;
  free(buffer);
}

void start_cupti() {
  cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed);
  cuptiActivityEnable(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL);
  if (way == 2 || way == 3 || way == 6) {
    CUpti_SubscriberHandle subscriber;
    cuptiSubscribe(&subscriber, on_launch, nullptr);
    cuptiEnableCallback(1, subscriber, CUPTI_CB_DOMAIN_RUNTIME_API,
                        CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000);
    cuptiEnableCallback(1, subscriber, CUPTI_CB_DOMAIN_DRIVER_API,
                        CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel);
  }
  if (correlates_externally()) {
    cuptiActivityEnable(CUPTI_ACTIVITY_KIND_EXTERNAL_CORRELATION);
    cuptiActivityEnableRuntimeApi(CUPTI_RUNTIME_TRACE_CBID_cudaLaunchKernel_v7000, 1);
    cuptiActivityEnableDriverApi(CUPTI_DRIVER_TRACE_CBID_cuLaunchKernel, 1);
  }
}

}  // namespace

int main(int argc, char** argv) {
  way = argc > 1 ? atoi(argv[1]) : 0;
  constexpr int kLaunches = 30000;
  float* p = nullptr;
  cudaMalloc(&p, sizeof(float));
  cudaStream_t stream;
  cudaStreamCreate(&stream);
  CUfunction function;
  cudaGetFuncBySymbol(&function, reinterpret_cast<const void*>(tiny));
  decltype(&cuLaunchKernel) driver_launch = nullptr;
  cudaDriverEntryPointQueryResult found;
  cudaGetDriverEntryPointByVersion("cuLaunchKernel", reinterpret_cast<void**>(&driver_launch),
                                   12000, cudaEnableDefault, &found);
  if (uses_cupti()) start_cupti();
  void* args[] = {&p};
  const bool through_driver = way == 6 || way == 7;
  Params<3400> large{p, {}};
  Params<328> small{p, {}};
  double best = 1e9;
  for (int round = 0; round < 5; ++round) {
    double seconds = 0;
    for (int i = 0; i < kLaunches; ++i) {
      const bool push = way == 4 || (way == 5 && i % 3 == 0);
      const bool pop = way == 4 || (way == 5 && i % 3 == 2);
      if (push) cuptiActivityPushExternalCorrelationId(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0, i);
      current_launch = i;
      const auto before = std::chrono::steady_clock::now();
      if (through_driver) {
        driver_launch(function, 1, 1, 1, 32, 1, 1, 0, stream, args, nullptr);
      } else if (way == 8) {
        tiny_with<<<1, 32, 0, stream>>>(large);
      } else if (way == 9) {
        tiny_with<<<1, 32, 0, stream>>>(small);
      } else {
        tiny<<<1, 32, 0, stream>>>(p);
      }
      seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - before).count();
      if (pop)
        cuptiActivityPopExternalCorrelationId(CUPTI_EXTERNAL_CORRELATION_KIND_CUSTOM0, nullptr);
      if (i % 256 == 255) {
        cudaStreamSynchronize(stream);
        if (uses_cupti() && i % 4096 == 4095) cuptiActivityFlushAll(0);
      }
    }
    if (round > 0 && seconds < best) best = seconds;
  }
  cudaDeviceSynchronize();
  if (uses_cupti()) cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  // the device's side: GPU time per spinning kernel, the host ahead of it
  cudaEvent_t first, last;
  cudaEventCreate(&first);
  cudaEventCreate(&last);
  constexpr int kQueued = 256, kBatches = 40;
  float gpu_ms = 0;
  for (int batch = 0; batch <= kBatches; ++batch) {
    cudaEventRecord(first, stream);
    for (int i = 0; i < kQueued; ++i) {
      current_launch = i;
      spin<<<1, 32, 0, stream>>>(40000);
    }
    cudaEventRecord(last, stream);
    cudaEventSynchronize(last);
    float ms = 0;
    cudaEventElapsedTime(&ms, first, last);
    if (batch > 0) gpu_ms += ms;  // the first batch warms up
  }
  cudaDeviceSynchronize();
  if (uses_cupti()) cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
  printf("way %d: %.3f us per launch on the host, %.3f us per spinning kernel on the GPU "
         "(%llu activity records, %zu tags)\n",
         way, best / kLaunches * 1e6, gpu_ms * 1e3 / (kQueued * kBatches),
         static_cast<unsigned long long>(records), tags.size());
  return 0;
}
