// The timing loop of the kernel micro-benchmarks (cpp/bench, built into hvd_compress._kernel_bench):
// each kernel against a memcpy of the bytes it streams, on one thread, in buffers allocated once.
// Times are the thread's CPU time (CLOCK_THREAD_CPUTIME_ID), not wall time: on a shared machine
// (CI, 2 cores, other jobs) a preempted repetition would otherwise count the other jobs' turns, and
// the benchmark asks what one core does. Memory stalls still count: a stalled thread is running.
#pragma once
#include <algorithm>
#include <ctime>
#include <cstdint>
#include <cstring>
#include <functional>
#include <map>
#include <string>
#include <vector>

namespace hvdc {

// One kernel of a micro-benchmark.
struct KernelTiming {
  const char* name;
  std::function<void()> run;
  size_t copy_bytes;                          // what memcpy_<name> copies
  std::function<void()> prepare = nullptr;    // untimed, before each run (e.g. refill an output)
};

namespace kernel_timing_detail {

inline double median(std::vector<double> t) {
  std::sort(t.begin(), t.end());
  const size_t m = t.size() / 2;
  return t.size() % 2 ? t[m] : 0.5 * (t[m - 1] + t[m]);
}

// CPU seconds of this thread spent in f().
template <typename F>
double seconds(F&& f) {
  timespec a, b;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &a);
  f();
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &b);
  return (b.tv_sec - a.tv_sec) + 1e-9 * (b.tv_nsec - a.tv_nsec);
}

// Keeps the compiler from dropping a memcpy whose destination is never read.
inline void touch(const void* p) { asm volatile("" : : "r"(p) : "memory"); }

}  // namespace kernel_timing_detail

// Median seconds over `reps` repetitions (after one warm-up: page faults, caches) of every case,
// "<name>", and of a memcpy between two distinct buffers of its `copy_bytes` right after it in
// the same repetition, "memcpy_<name>", so that drift on a busy machine hits both alike.
// memcpy_<name> / <name> is the kernel's throughput relative to memcpy over those bytes.
inline std::map<std::string, double> time_against_memcpy(const std::vector<KernelTiming>& cases,
                                                          int reps) {
  using namespace kernel_timing_detail;
  size_t most = 1;
  for (const KernelTiming& c : cases) most = std::max(most, c.copy_bytes);
  std::vector<uint8_t> copy_src(most, 1), copy_dst(most, 2);
  std::map<std::string, std::vector<double>> times;
  for (int rep = -1; rep < reps; ++rep) {
    for (const KernelTiming& c : cases) {
      if (c.prepare) c.prepare();
      const double tk = seconds(c.run);
      const double tc = seconds([&] {
        std::memcpy(copy_dst.data(), copy_src.data(), c.copy_bytes);
        touch(copy_dst.data());
      });
      if (rep < 0) continue;
      times[c.name].push_back(tk);
      times[std::string("memcpy_") + c.name].push_back(tc);
    }
  }
  std::map<std::string, double> res;
  for (auto& [name, t] : times) res[name] = median(t);
  return res;
}

}  // namespace hvdc

