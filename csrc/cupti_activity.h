// Kernel, memcpy and memset activity through CUPTI, tied to recorded ops through CUPTI's API
// callbacks (the correlation id of each CUDA call that launches GPU work). libcupti is opened at
// run time (dlopen), so the extension imports and the CPU path works on machines without it.
//
// Each thread that records is, at any moment, in one of three states: running recorded op N
// (push/pop): its launches are op N's; doing OpGuard's own work (recorder_enter/leave around
// the recorder, OwnWork around fingerprint launches): never reported; or running user code
// outside any op: its launches are "unclaimed", reported after the last recorded op (a custom
// extension, a raw Triton launch, a ctypes call into libcuda).
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace opguard {
namespace cupti {

struct Activity {
  uint64_t op;             // the recorded op's index
  bool unclaimed = false;  // launched after op `op` by code outside any recorded op
  int kind;                // 0 kernel, 1 memcpy, 2 memset
  std::string name;        // kernel name, or the memcpy direction
  uint32_t grid[3];
  uint32_t block[3];
  uint32_t stream;
  uint32_t device;
  uint64_t start;  // ns, GPU clock
  uint64_t end;
  uint64_t bytes;
};

// What CUPTI has delivered so far, for diagnostics (`opguard show` of a GPU trace).
struct Counters {
  uint64_t buffers = 0;       // buffers CUPTI completed
  uint64_t records = 0;       // records in them
  uint64_t activities = 0;    // kernels, memcpys and memsets
  uint64_t correlations = 0;  // launching CUDA API calls tagged (op, unclaimed or own work)
  uint64_t unclaimed = 0;     // activities launched outside any recorded op
};
Counters counters();

// Loads libcupti from `library` (a path or soname) and enables activity collection. Returns
// an empty string on success, else why it is unavailable.
std::string start(const std::string& library);
bool active();
void push(uint64_t op);
void pop();
// The calling thread records ops and now does OpGuard's own work, until recorder_leave, which
// also says that op `last_recorded` is the last one recorded (-1: none yet): user code that
// launches GPU work from this thread afterwards, outside any op, is reported after that op.
void recorder_enter();
void recorder_leave(int64_t last_recorded);
// Whether launches outside any op are reported (on from start(); off once recording stops).
void watch_unclaimed(bool on);
// Turns collection off until resume(): CUPTI's launch callbacks and its activity records, so
// that outside an op-level window (opguard record --window) a launch costs what it costs
// unrecorded. What was collected before stays for drain().
void pause();
// Turns collection back on after pause(); an empty string, else why it could not.
std::string resume();

// OpGuard's own GPU work on this thread while it exists (fingerprint launches): never reported.
class OwnWork {
 public:
  OwnWork();
  ~OwnWork();
  OwnWork(const OwnWork&) = delete;
  OwnWork& operator=(const OwnWork&) = delete;
};

// Flushes CUPTI's buffers (`all`: also incomplete ones) and returns every activity whose op
// is known, leaving the others for a later call.
std::vector<Activity> drain(bool all);
// The trace's kernel entries of `activities` (opguard/store/schema.py), one msgpack array per
// op, ops in order: packed here, without the GIL, because the trace writer drains thousands
// per step and its Python time is taken from the training thread.
std::vector<std::pair<uint64_t, std::string>> pack_by_op(std::vector<Activity> activities);
void stop();

}  // namespace cupti
}  // namespace opguard
