#include "cupti_activity.h"

#include <cupti.h>
#include <cupti_callbacks.h>
#include <dlfcn.h>

#include <cstdlib>
#include <mutex>
#include <unordered_map>

namespace opguard {
namespace cupti {
namespace {

constexpr size_t kBufferBytes = 8 << 20;
constexpr size_t kAlign = 8;

// The CUPTI entry points, looked up with dlsym.
struct Api {
  decltype(&cuptiActivityEnable) enable = nullptr;
  decltype(&cuptiActivityDisable) disable = nullptr;
  decltype(&cuptiActivityRegisterCallbacks) register_callbacks = nullptr;
  decltype(&cuptiActivityFlushAll) flush_all = nullptr;
  decltype(&cuptiActivityGetNextRecord) next_record = nullptr;
  decltype(&cuptiGetResultString) result_string = nullptr;
  decltype(&cuptiGetVersion) version = nullptr;
  decltype(&cuptiSubscribe) subscribe = nullptr;
  decltype(&cuptiEnableDomain) enable_domain = nullptr;
};

struct State {
  std::mutex mutex;
  Api api;
  void* handle = nullptr;
  bool active = false;
  std::unordered_map<uint32_t, uint64_t> op_of;  // correlation id -> op index
  CUpti_SubscriberHandle subscriber = nullptr;
  std::vector<std::pair<uint32_t, Activity>> waiting;  // activity without a known op yet
  Counters counters;
};

State& state() {
  static State* s = new State();  // never destroyed: CUPTI may call back during exit
  return *s;
}

// The op whose execution the current thread is inside (-1: none), set by push/pop.
thread_local int64_t current_op = -1;

// Runtime and driver API callback: at the entry of every CUDA call made while an op runs, ties
// the call's correlation id (which its kernels, copies and sets carry) to the op.
void CUPTIAPI on_api(void*, CUpti_CallbackDomain, CUpti_CallbackId, const void* data) {
  const auto* info = static_cast<const CUpti_CallbackData*>(data);
  if (current_op < 0 || info->callbackSite != CUPTI_API_ENTER) return;
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.op_of[info->correlationId] = static_cast<uint64_t>(current_op);
  ++s.counters.correlations;
}

template <typename F>
bool load(void* handle, const char* name, F& out) {
  out = reinterpret_cast<F>(dlsym(handle, name));
  return out != nullptr;
}

const char* memcpy_kind(uint8_t kind) {
  switch (kind) {
    case CUPTI_ACTIVITY_MEMCPY_KIND_HTOD:
      return "memcpy HtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOH:
      return "memcpy DtoH";
    case CUPTI_ACTIVITY_MEMCPY_KIND_DTOD:
      return "memcpy DtoD";
    case CUPTI_ACTIVITY_MEMCPY_KIND_PTOP:
      return "memcpy PtoP";
    default:
      return "memcpy";
  }
}

void CUPTIAPI buffer_requested(uint8_t** buffer, size_t* size, size_t* max_records) {
  *buffer = static_cast<uint8_t*>(aligned_alloc(kAlign, kBufferBytes));
  *size = *buffer ? kBufferBytes : 0;
  *max_records = 0;
}

void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  ++s.counters.buffers;
  CUpti_Activity* record = nullptr;
  while (s.api.next_record(buffer, valid, &record) == CUPTI_SUCCESS) {
    ++s.counters.records;
    Activity a{};
    uint32_t correlation = 0;
    switch (record->kind) {
      case CUPTI_ACTIVITY_KIND_KERNEL:
      case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
        const auto* k = reinterpret_cast<const CUpti_ActivityKernel10*>(record);
        a.kind = 0;
        a.name = k->name ? k->name : "?";
        a.grid[0] = k->gridX, a.grid[1] = k->gridY, a.grid[2] = k->gridZ;
        a.block[0] = k->blockX, a.block[1] = k->blockY, a.block[2] = k->blockZ;
        a.stream = k->streamId, a.device = k->deviceId;
        a.start = k->start, a.end = k->end;
        correlation = k->correlationId;
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMCPY: {
        const auto* m = reinterpret_cast<const CUpti_ActivityMemcpy6*>(record);
        a.kind = 1;
        a.name = memcpy_kind(m->copyKind);
        a.stream = m->streamId, a.device = m->deviceId;
        a.start = m->start, a.end = m->end, a.bytes = m->bytes;
        correlation = m->correlationId;
        break;
      }
      case CUPTI_ACTIVITY_KIND_MEMSET: {
        const auto* m = reinterpret_cast<const CUpti_ActivityMemset4*>(record);
        a.kind = 2;
        a.name = "memset";
        a.stream = m->streamId, a.device = m->deviceId;
        a.start = m->start, a.end = m->end, a.bytes = m->bytes;
        correlation = m->correlationId;
        break;
      }
      default:
        continue;
    }
    ++s.counters.activities;
    s.waiting.emplace_back(correlation, std::move(a));
  }
  free(buffer);
}

const CUpti_ActivityKind kKinds[] = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL,
                                     CUPTI_ACTIVITY_KIND_MEMCPY, CUPTI_ACTIVITY_KIND_MEMSET};

}  // namespace

std::string start(const std::string& library) {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  if (s.active) return "";
  if (!s.handle) {
    s.handle = dlopen(library.c_str(), RTLD_NOW | RTLD_LOCAL);
    if (!s.handle) {
      const char* why = dlerror();
      return std::string("cannot load ") + library + ": " + (why ? why : "unknown error");
    }
    Api& a = s.api;
    const bool ok = load(s.handle, "cuptiActivityEnable", a.enable) &&
                    load(s.handle, "cuptiActivityDisable", a.disable) &&
                    load(s.handle, "cuptiActivityRegisterCallbacks", a.register_callbacks) &&
                    load(s.handle, "cuptiActivityFlushAll", a.flush_all) &&
                    load(s.handle, "cuptiActivityGetNextRecord", a.next_record) &&
                    load(s.handle, "cuptiGetResultString", a.result_string) &&
                    load(s.handle, "cuptiGetVersion", a.version) &&
                    load(s.handle, "cuptiSubscribe", a.subscribe) &&
                    load(s.handle, "cuptiEnableDomain", a.enable_domain);
    if (!ok) {
      dlclose(s.handle);
      s.handle = nullptr;
      return library + " lacks the CUPTI activity API";
    }
    uint32_t version = 0;
    if (a.version(&version) != CUPTI_SUCCESS || version < CUPTI_API_VERSION / 10000 * 10000) {
      dlclose(s.handle);
      s.handle = nullptr;
      return "CUPTI API version " + std::to_string(version) + " is older than the " +
             std::to_string(CUPTI_API_VERSION) + " OpGuard was built with";
    }
  }
  CUptiResult r = s.api.register_callbacks(buffer_requested, buffer_completed);
  if (r == CUPTI_SUCCESS && s.subscriber == nullptr) {
    r = s.api.subscribe(&s.subscriber, on_api, nullptr);
    if (r == CUPTI_SUCCESS) r = s.api.enable_domain(1, s.subscriber, CUPTI_CB_DOMAIN_RUNTIME_API);
    if (r == CUPTI_SUCCESS) r = s.api.enable_domain(1, s.subscriber, CUPTI_CB_DOMAIN_DRIVER_API);
  }
  for (CUpti_ActivityKind kind : kKinds) {
    if (r == CUPTI_SUCCESS) r = s.api.enable(kind);
  }
  if (r != CUPTI_SUCCESS) {
    const char* text = nullptr;
    s.api.result_string(r, &text);
    return std::string("CUPTI activity unavailable: ") + (text ? text : "error");
  }
  s.active = true;
  return "";
}

bool active() { return state().active; }

void push(uint64_t op) {
  State& s = state();
  if (!s.active) return;
  current_op = static_cast<int64_t>(op);
}

void pop() {
  State& s = state();
  if (!s.active) return;
  current_op = -1;
}

std::vector<Activity> drain(bool all) {
  State& s = state();
  if (!s.active) return {};
  s.api.flush_all(all ? CUPTI_ACTIVITY_FLAG_FLUSH_FORCED : 0);  // calls buffer_completed
  std::lock_guard<std::mutex> lock(s.mutex);
  std::vector<Activity> ready;
  std::vector<std::pair<uint32_t, Activity>> still;
  for (auto& [correlation, activity] : s.waiting) {
    auto it = s.op_of.find(correlation);
    if (it != s.op_of.end()) {
      activity.op = it->second;
      s.op_of.erase(it);  // one correlation id per launch
      ready.push_back(std::move(activity));
    } else if (!all) {
      still.emplace_back(correlation, std::move(activity));
    }  // after a forced flush, activity with no op was not launched by a recorded op
  }
  s.waiting.swap(still);
  if (all) s.op_of.clear();
  return ready;
}

Counters counters() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  return s.counters;
}

void stop() {
  State& s = state();
  if (!s.active) return;
  for (CUpti_ActivityKind kind : kKinds) s.api.disable(kind);
  s.active = false;
}

}  // namespace cupti
}  // namespace opguard
