// Kernel, memcpy and memset activity through CUPTI, tied to recorded ops through CUPTI's API
// callbacks (the correlation id of each CUDA call made while an op runs). libcupti is opened at
// run time (dlopen), so the extension imports and the CPU path works on machines without it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace opguard {
namespace cupti {

struct Activity {
  uint64_t op;       // the recorded op's index
  int kind;          // 0 kernel, 1 memcpy, 2 memset
  std::string name;  // kernel name, or the memcpy direction
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
  uint64_t correlations = 0;  // CUDA API calls tied to an op
};
Counters counters();

// Loads libcupti from `library` (a path or soname) and enables activity collection. Returns
// an empty string on success, else why it is unavailable.
std::string start(const std::string& library);
bool active();
void push(uint64_t op);
void pop();
// Flushes CUPTI's buffers (`all`: also incomplete ones) and returns every activity whose op
// is known, leaving the others for a later call.
std::vector<Activity> drain(bool all);
void stop();

}  // namespace cupti
}  // namespace opguard
