#include "cupti_activity.h"

#include <cupti.h>
#include <cupti_callbacks.h>
#include <dlfcn.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <iterator>
#include <mutex>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "msgpack_out.h"

namespace opguard {
namespace cupti {
namespace {

// Activity buffers are small and reused. CUPTI takes a new buffer whenever the writer's poll
// (cuptiActivityFlushAll) hands back the current one, several times a step, and a profile of a
// recorded GPT-2 step showed libcupti clearing memory on the training thread at its next launch
// (11% of the forward pass's host time with fresh 8 MiB buffers, whose pages also fault in
// there). A step's activity is ~0.6 MiB.
constexpr size_t kBufferBytes = 1 << 20;
constexpr size_t kAlign = 8;
constexpr size_t kPooledBuffers = 8;

class BufferPool {
 public:
  uint8_t* take() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (!free_.empty()) {
        uint8_t* buffer = free_.back();
        free_.pop_back();
        return buffer;
      }
    }
    return static_cast<uint8_t*>(aligned_alloc(kAlign, kBufferBytes));
  }

  void give(uint8_t* buffer) {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (free_.size() < kPooledBuffers) {
        free_.push_back(buffer);
        return;
      }
    }
    free(buffer);
  }

 private:
  std::mutex mutex_;
  std::vector<uint8_t*> free_;
};

BufferPool& buffer_pool() {
  static BufferPool* pool = new BufferPool();  // never destroyed, like State
  return *pool;
}

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
  decltype(&cuptiEnableCallback) enable_callback = nullptr;  // optional: see subscribe_launches
  decltype(&cuptiGetCallbackName) callback_name = nullptr;
};

// What a launching API call's GPU work is, by its correlation id.
struct Tag {
  int64_t op = -1;         // the recorded op it belongs to or follows; -1: not reported
  bool unclaimed = false;  // launched outside any recorded op, after op `op`
  bool many = false;       // a graph launch: every kernel of the graph carries this id
  uint32_t partner = 0;    // the runtime call around a driver call (or the reverse), if any
};

struct State {
  std::mutex mutex;
  Api api;
  void* handle = nullptr;
  std::atomic<bool> active{false};
  std::atomic<bool> watching{false};       // report launches outside any op
  std::atomic<bool> paused{false};         // callbacks and activity off (pause)
  std::atomic<int64_t> last_recorded{-1};  // the last op recorded, on any thread
  std::unordered_map<uint32_t, Tag> tags;  // correlation id -> tag, until its activity
  CUpti_SubscriberHandle subscriber = nullptr;
  std::vector<std::pair<uint32_t, Activity>> waiting;  // activity whose tag is not known yet
  Counters counters;
};

State& state() {
  static State* s = new State();  // never destroyed: CUPTI may call back during exit
  return *s;
}

// The op whose execution the current thread is inside (-1: none), set by push/pop.
thread_local int64_t current_op = -1;
// Nesting depth of OpGuard's own work on this thread (recorder_enter, OwnWork).
thread_local int own_depth = 0;
// Whether this thread records ops: only its launches outside any op are reported (the trace
// writer's and CUPTI's threads, a data loader's, never are).
thread_local bool recording_thread = false;
// The correlation id of the launching call this thread is inside (0: none): a runtime call
// makes a driver call of its own, and the activity carries one of the two ids.
thread_local uint32_t open_launch = 0;

// Whether an API function launches GPU work that CUPTI reports as activity: decided once per
// callback id from its name, so the tag map only holds calls that will meet their activity.
enum Launch : uint8_t { kUnknown = 0, kNone, kOne, kMany };

Launch classify(const char* name) {
  if (name == nullptr) return kNone;
  const std::string_view n(name);
  const auto has = [&n](const char* part) { return n.find(part) != std::string_view::npos; };
  if (has("Graph")) return has("GraphLaunch") ? kMany : kNone;  // building a graph runs nothing
  if (has("HostFunc")) return kNone;                            // a host function
  return has("Launch") || has("Memcpy") || has("Memset") ? kOne : kNone;
}

std::atomic<uint8_t> runtime_launches[CUPTI_RUNTIME_TRACE_CBID_SIZE];
std::atomic<uint8_t> driver_launches[CUPTI_DRIVER_TRACE_CBID_SIZE];

Launch launch_of(CUpti_CallbackDomain domain, CUpti_CallbackId cbid, const char* name) {
  std::atomic<uint8_t>* known = nullptr;
  if (domain == CUPTI_CB_DOMAIN_RUNTIME_API && cbid < CUPTI_RUNTIME_TRACE_CBID_SIZE) {
    known = &runtime_launches[cbid];
  } else if (domain == CUPTI_CB_DOMAIN_DRIVER_API && cbid < CUPTI_DRIVER_TRACE_CBID_SIZE) {
    known = &driver_launches[cbid];
  }
  if (known == nullptr) return classify(name);  // an id newer than this build's headers
  auto launch = static_cast<Launch>(known->load(std::memory_order_relaxed));
  if (launch == kUnknown) {
    launch = classify(name);
    known->store(launch, std::memory_order_relaxed);
  }
  return launch;
}

// The tag of a launch the current thread makes now.
Tag tag_now(const State& s) {
  Tag tag;
  if (current_op >= 0) {
    tag.op = current_op;
  } else if (own_depth == 0 && recording_thread && s.watching.load(std::memory_order_relaxed)) {
    tag.op = s.last_recorded.load(std::memory_order_relaxed);  // -1 before the first op
    tag.unclaimed = true;
  }
  return tag;
}

// Runtime and driver API callback: at the entry of every CUDA call that launches GPU work,
// tags the call's correlation id (which its kernels, copies and sets carry) with the op it
// belongs to, or the op it followed, or as not reported (OpGuard's own work).
void CUPTIAPI on_api(void*, CUpti_CallbackDomain domain, CUpti_CallbackId cbid, const void* data) {
  const auto* info = static_cast<const CUpti_CallbackData*>(data);
  const Launch launch = launch_of(domain, cbid, info->functionName);
  if (launch == kNone) return;
  const uint32_t id = info->correlationId;
  if (info->callbackSite == CUPTI_API_EXIT) {
    if (open_launch == id) open_launch = 0;
    return;
  }
  State& s = state();
  if (!s.active.load(std::memory_order_relaxed)) return;
  Tag tag = tag_now(s);
  tag.many = launch == kMany;
  std::lock_guard<std::mutex> lock(s.mutex);
  if (open_launch == 0) {
    open_launch = id;
  } else if (open_launch != id) {  // a driver call made by a runtime call: the activity
    tag.partner = open_launch;     // meets one of the two ids, the other goes with it
    auto outer = s.tags.find(open_launch);
    if (outer != s.tags.end()) outer->second.partner = id;
  }
  s.tags[id] = tag;
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
  *buffer = buffer_pool().take();
  *size = *buffer ? kBufferBytes : 0;
  *max_records = 0;
}

// Parses a completed buffer without the lock, which launches on the training threads take.
void CUPTIAPI buffer_completed(CUcontext, uint32_t, uint8_t* buffer, size_t, size_t valid) {
  State& s = state();
  std::vector<std::pair<uint32_t, Activity>> parsed;
  uint64_t records = 0;
  CUpti_Activity* record = nullptr;
  while (s.api.next_record(buffer, valid, &record) == CUPTI_SUCCESS) {
    ++records;
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
    parsed.emplace_back(correlation, std::move(a));
  }
  buffer_pool().give(buffer);
  std::lock_guard<std::mutex> lock(s.mutex);
  ++s.counters.buffers;
  s.counters.records += records;
  s.counters.activities += parsed.size();
  s.waiting.insert(s.waiting.end(), std::make_move_iterator(parsed.begin()),
                   std::make_move_iterator(parsed.end()));
}

// Subscribes to the calls of `domain` that launch GPU work only. CUPTI calls back on every API
// call of an enabled domain, and torch makes several that launch nothing for each op
// (cudaGetDevice, stream and capture queries): each costs a callback on the recording
// thread. Falls back to the whole domain when this libcupti cannot name its callbacks.
CUptiResult subscribe_launches(State& s, CUpti_CallbackDomain domain) {
  const uint32_t size = domain == CUPTI_CB_DOMAIN_RUNTIME_API ? CUPTI_RUNTIME_TRACE_CBID_SIZE
                                                              : CUPTI_DRIVER_TRACE_CBID_SIZE;
  if (s.api.enable_callback == nullptr || s.api.callback_name == nullptr) {
    return s.api.enable_domain(1, s.subscriber, domain);
  }
  for (uint32_t cbid = 1; cbid < size; ++cbid) {
    const char* name = nullptr;
    if (s.api.callback_name(domain, cbid, &name) != CUPTI_SUCCESS || name == nullptr) continue;
    if (launch_of(domain, cbid, name) == kNone) continue;
    const CUptiResult r = s.api.enable_callback(1, s.subscriber, domain, cbid);
    if (r != CUPTI_SUCCESS) return s.api.enable_domain(1, s.subscriber, domain);
  }
  return CUPTI_SUCCESS;
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
    load(s.handle, "cuptiEnableCallback", a.enable_callback);
    load(s.handle, "cuptiGetCallbackName", a.callback_name);
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
  // Subscribed once per process; a recording that ended paused (outside its window) left the
  // callbacks off.
  const bool subscribe = s.subscriber == nullptr;
  if (r == CUPTI_SUCCESS && subscribe) r = s.api.subscribe(&s.subscriber, on_api, nullptr);
  if (r == CUPTI_SUCCESS && (subscribe || s.paused)) {
    r = subscribe_launches(s, CUPTI_CB_DOMAIN_RUNTIME_API);
    if (r == CUPTI_SUCCESS) r = subscribe_launches(s, CUPTI_CB_DOMAIN_DRIVER_API);
  }
  for (CUpti_ActivityKind kind : kKinds) {
    if (r == CUPTI_SUCCESS) r = s.api.enable(kind);
  }
  if (r != CUPTI_SUCCESS) {
    const char* text = nullptr;
    s.api.result_string(r, &text);
    return std::string("CUPTI activity unavailable: ") + (text ? text : "error");
  }
  s.last_recorded = -1;
  s.paused = false;
  s.watching = true;
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

void recorder_enter() {
  recording_thread = true;
  ++own_depth;
}

void recorder_leave(int64_t last_recorded) {
  --own_depth;
  if (last_recorded >= 0) state().last_recorded.store(last_recorded, std::memory_order_relaxed);
}

void watch_unclaimed(bool on) { state().watching = on; }

OwnWork::OwnWork() { ++own_depth; }
OwnWork::~OwnWork() { --own_depth; }

std::vector<Activity> drain(bool all) {
  State& s = state();
  if (!s.active) return {};
  s.api.flush_all(all ? CUPTI_ACTIVITY_FLAG_FLUSH_FORCED : 0);  // calls buffer_completed
  std::lock_guard<std::mutex> lock(s.mutex);
  std::vector<Activity> ready;
  std::vector<std::pair<uint32_t, Activity>> still;
  for (auto& [correlation, activity] : s.waiting) {
    auto it = s.tags.find(correlation);
    if (it == s.tags.end()) {
      // After a forced flush, activity with no tag was launched before collection started.
      if (!all) still.emplace_back(correlation, std::move(activity));
      continue;
    }
    const Tag tag = it->second;
    if (!tag.many) {  // one activity per launch: its tag, and its partner's, are done
      s.tags.erase(it);
      if (tag.partner != 0) s.tags.erase(tag.partner);
    }
    if (tag.op < 0) continue;  // OpGuard's own work, another thread's, or before the first op
    activity.op = static_cast<uint64_t>(tag.op);
    activity.unclaimed = tag.unclaimed;
    if (tag.unclaimed) ++s.counters.unclaimed;
    ready.push_back(std::move(activity));
  }
  s.waiting.swap(still);
  if (all) s.tags.clear();
  return ready;
}

std::vector<std::pair<uint64_t, std::string>> pack_by_op(std::vector<Activity> activities) {
  // drained in completion order: by op, each op's in that order
  std::stable_sort(activities.begin(), activities.end(),
                   [](const Activity& a, const Activity& b) { return a.op < b.op; });
  static const char* const kKindNames[] = {"kernel", "memcpy", "memset"};
  std::vector<std::pair<uint64_t, std::string>> by_op;
  for (size_t i = 0; i < activities.size();) {
    size_t end = i;
    while (end < activities.size() && activities[end].op == activities[i].op) ++end;
    std::string packed;
    MsgpackOut out(packed);
    out.array(end - i);
    for (size_t k = i; k < end; ++k) {
      const Activity& a = activities[k];
      out.map(8 + (a.unclaimed ? 1 : 0) - (a.kind == 0 ? 0 : 1));
      out.str("k"), out.str(kKindNames[a.kind]);
      out.str("n"), out.str(a.name);
      out.str("s"), out.uint(a.stream);
      out.str("d"), out.uint(a.device);
      out.str("t0"), out.uint(a.start);
      out.str("t1"), out.uint(a.end);
      if (a.kind == 0) {
        out.str("g"), out.array(3);
        for (uint32_t v : a.grid) out.uint(v);
        out.str("b"), out.array(3);
        for (uint32_t v : a.block) out.uint(v);
      } else {
        out.str("z"), out.uint(a.bytes);
      }
      if (a.unclaimed) out.str("u"), out.uint(1);
    }
    by_op.emplace_back(activities[i].op, std::move(packed));
    i = end;
  }
  return by_op;
}

Counters counters() {
  State& s = state();
  std::lock_guard<std::mutex> lock(s.mutex);
  return s.counters;
}

void pause() {
  State& s = state();
  if (!s.active || s.paused) return;
  s.watching = false;
  for (CUpti_ActivityKind kind : kKinds) s.api.disable(kind);
  // Disabling a domain turns off every callback of it, those enabled one by one included.
  s.api.enable_domain(0, s.subscriber, CUPTI_CB_DOMAIN_RUNTIME_API);
  s.api.enable_domain(0, s.subscriber, CUPTI_CB_DOMAIN_DRIVER_API);
  s.paused = true;
}

std::string resume() {
  State& s = state();
  if (!s.active || !s.paused) return "";
  CUptiResult r = subscribe_launches(s, CUPTI_CB_DOMAIN_RUNTIME_API);
  if (r == CUPTI_SUCCESS) r = subscribe_launches(s, CUPTI_CB_DOMAIN_DRIVER_API);
  for (CUpti_ActivityKind kind : kKinds) {
    if (r == CUPTI_SUCCESS) r = s.api.enable(kind);
  }
  if (r != CUPTI_SUCCESS) {
    const char* text = nullptr;
    s.api.result_string(r, &text);
    return std::string("CUPTI activity could not be turned back on: ") + (text ? text : "error");
  }
  s.paused = false;
  s.watching = true;
  return "";
}

void stop() {
  State& s = state();
  if (!s.active) return;
  for (CUpti_ActivityKind kind : kKinds) s.api.disable(kind);
  s.watching = false;
  s.active = false;
}

}  // namespace cupti
}  // namespace opguard
