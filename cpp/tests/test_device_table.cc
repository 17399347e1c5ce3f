// The device table (hvdc/device.h) under the 1-bit allreduce (cpp/src/compressed_allreduce.cc), on
// thread ranks at n = 2, 3, 4: every rank on the staged test device (hvdc/staged_device.h: the CPU
// kernels on a delayed worker thread, memory reached only through copies) gives the bytes of the
// CPU run, for result, worker error and server error, over three calls in a row (errors carried),
// float32/float16/bfloat16, with and without padding; the host bytes counted are exactly the
// payload (phase 1's blocks out, the gathered blocks in, the server block out, the result blocks
// in), in host buffers allocated by the first call and reused by the others. And the staged device catches the mistakes it is there for: one dropped copy to the host,
// copy to the device or wait on rank 0 changes some byte of the outcome (or makes a rank throw).
// A non-finite input on the staged device is rejected with the CPU's message, state unchanged.
// The hierarchical 1-bit allreduce (Birder's +/-1 payload with and without moments, the scaled
// payload; flat, and at n = 4 in nodes of 2), allgather_rows and the sparse allreduce (top-k with
// and without DGC momentum over segments, random-k, a top-k that sends dense, the fp16 wire) at
// n = 2, 3, 4: staged gives the CPU's bytes over two calls (state carried), the direct calls' host
// bytes are exactly their payload, and a dropped copy or wait on rank 0 changes the outcome.
// Flat Adasum (cpp/src/adasum.cc) at n = 2..5 (folds at 3 and 5), two tensors in the fused buffer:
// staged gives the CPU's bytes, and a dropped copy on rank 0 changes them.
// SLAMB's masked allreduce (cyclic and Bernoulli masks drawn by the table, float32/float16/float64)
// and the block-quantized allreduce (int4 and int8, error carried over three calls) at n = 2, 3, 4:
// staged gives the CPU's bytes copying exactly the payload (the selected values; the quantized
// blocks), and each copy or wait they need, dropped on rank 0, changes the outcome.
//
// Usage: test_device_table [FIXTURES] (the fixtures are not read).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <deque>
#include <functional>
#include <initializer_list>
#include <limits>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "check.h"
#include "hvdc/adasum.h"
#include "hvdc/allgather.h"
#include "hvdc/block_quant_allreduce.h"
#include "hvdc/compressed_allreduce.h"
#include "hvdc/device.h"
#include "hvdc/elementwise/block_quant.h"
#include "hvdc/errors.h"
#include "hvdc/hierarchical_allreduce.h"
#include "hvdc/masked_allreduce.h"
#include "hvdc/masks.h"
#include "hvdc/sparse_allreduce.h"
#include "hvdc/staged_device.h"
#include "thread_communicator.h"

namespace hvdc {
namespace {

constexpr double kHangS = 60;
constexpr int kCalls = 3;

TensorView view_of(void* data, int64_t numel, DType dtype) {
  TensorView v;
  v.data = data;
  v.numel = numel;
  v.dtype = dtype;
  return v;
}

// Deterministic inputs of rank r, call c (float32 values stored in `dtype`).
std::vector<uint8_t> input(int r, int c, int64_t numel, DType dtype) {
  std::vector<uint8_t> out(static_cast<size_t>(numel) * dtype_size(dtype));
  for (int64_t i = 0; i < numel; ++i) {
    const float v = std::sin(0.37f * static_cast<float>(i + 1) + 1.3f * r + 0.7f * c) *
                    (1.0f + 0.01f * static_cast<float>(i % 7));
    if (dtype == DType::kFloat32) {
      std::memcpy(out.data() + 4 * i, &v, 4);
    } else {
      uint32_t u;
      std::memcpy(&u, &v, 4);
      // bfloat16: the top half; float16: a fixed small set of exact halves (sign and 10 bits).
      const uint16_t h = dtype == DType::kBFloat16
                             ? static_cast<uint16_t>(u >> 16)
                             : static_cast<uint16_t>((v < 0 ? 0x8000u : 0u) | 0x3800u | (i % 1024));
      std::memcpy(out.data() + 2 * i, &h, 2);
    }
  }
  return out;
}

// Everything one rank ends with: every call's result, both errors, the host bytes copied.
struct Outcome1 {
  std::vector<uint8_t> buf;  // the calls' results, one after the other
  std::vector<float> werr, serr;
  uint64_t host_bytes = 0;
  uint64_t host_allocations[2] = {0, 0};  // staged: host buffers allocated by the first call, by all
  std::string threw;
  bool operator==(const Outcome1& o) const {
    return threw == o.threw && buf == o.buf &&
           std::memcmp(werr.data(), o.werr.data(), werr.size() * 4) == 0 &&
           std::memcmp(serr.data(), o.serr.data(), serr.size() * 4) == 0;
  }
};

// The rank outcomes of kCalls calls; `staged`: every rank on a staged device of its own, rank 0's
// dropping its `index`-th operation of `fault`.
std::vector<Outcome1> run(int n, int64_t numel, DType dtype, bool staged, StagedFault fault,
                          int index, bool* struck) {
  std::vector<Outcome1> out(static_cast<size_t>(n));
  const int64_t server = onebit_padded_numel(numel, n) / n;
  int struck_count = 0;
  ThreadWorld world(n, kHangS);
  const std::vector<std::string> failed = world.run([&](Communicator& comm) {
    const int r = comm.rank();
    Outcome1& o = out[r];
    std::unique_ptr<StagedDevice> dev;
    if (staged) dev.reset(new StagedDevice(KernelChoice::kAuto));
    if (dev && r == 0) dev->set_fault(fault, index);
    o.werr.assign(static_cast<size_t>(numel), 0.0f);
    o.serr.assign(static_cast<size_t>(server), 0.0f);
    // Every call's buffer lives until the end: a dropped wait leaves kernels queued on it.
    std::vector<std::vector<uint8_t>> bufs(kCalls);
    try {
      for (int c = 0; c < kCalls; ++c) {
        std::vector<uint8_t>& buf = bufs[c];
        buf = input(r, c, numel, dtype);
        const uint64_t before = dev ? dev->host_bytes() : 0;
        compressed_allreduce(comm, view_of(buf.data(), numel, dtype),
                             view_of(o.werr.data(), numel, DType::kFloat32),
                             view_of(o.serr.data(), server, DType::kFloat32), KernelChoice::kAuto,
                             OneBitPipeline{}, dev.get());
        o.host_bytes += dev ? dev->host_bytes() - before : 0;
        // What the caller sees as the call returns (a later kernel must not change it).
        o.buf.insert(o.buf.end(), buf.begin(), buf.end());
        if (dev) o.host_allocations[c == 0 ? 0 : 1] = dev->host_allocations();
      }
    } catch (const std::exception& e) {
      o.threw = e.what();
    }
    if (dev) {
      if (r == 0) struck_count = dev->faults_struck();
      dev->set_fault(StagedFault::kNone);
      dev->wait();  // nothing of a dropped wait may outlive the buffers
    }
  });
  for (int r = 0; r < n; ++r)
    if (!failed[r].empty()) out[r].threw = failed[r];
  *struck = struck_count > 0;
  return out;
}

void staged_equals_cpu(Failures& f, int n, int64_t numel, DType dtype) {
  const std::string what = str("n=", n, " numel=", numel, " ", dtype_name(dtype));
  bool struck = false;
  const std::vector<Outcome1> cpu = run(n, numel, dtype, false, StagedFault::kNone, 0, &struck);
  const std::vector<Outcome1> staged = run(n, numel, dtype, true, StagedFault::kNone, 0, &struck);
  f.ran();
  const int64_t server = onebit_padded_numel(numel, n) / n;
  const uint64_t block = sizeof(float) + static_cast<uint64_t>(server / 8);
  // Per call: n blocks out (phase 1), n in (gathered), 1 out (served), n in (result).
  const uint64_t want_host = kCalls * (3 * static_cast<uint64_t>(n) + 1) * block;
  for (int r = 0; r < n; ++r) {
    f.check(cpu[r].threw.empty() && staged[r].threw.empty(),
            str(what, ": rank ", r, " threw: ", cpu[r].threw, staged[r].threw));
    f.check(staged[r] == cpu[r], str(what, ": rank ", r, ": staged run differs from the CPU run"));
    f.check(staged[r].host_bytes == want_host,
            str(what, ": rank ", r, " copied ", staged[r].host_bytes, " host bytes, want ", want_host));
    // The host staging buffers of the first call serve the later ones (same sizes: one bucket).
    f.check(staged[r].host_allocations[0] > 0 &&
                staged[r].host_allocations[1] == staged[r].host_allocations[0],
            str(what, ": rank ", r, " allocated ", staged[r].host_allocations[0],
                " host buffers in call 0 and ", staged[r].host_allocations[1], " by call ", kCalls - 1));
  }
}

// Each dropped operation of rank 0 (the first few of each kind over the calls) changes the outcome.
void a_dropped_copy_or_wait_shows(Failures& f, int n) {
  const int64_t numel = 1000;
  bool struck = false;
  const std::vector<Outcome1> cpu = run(n, numel, DType::kFloat32, false, StagedFault::kNone, 0, &struck);
  struct Drop {
    StagedFault kind;
    const char* name;
    int count;  // how many of the kind one call has on rank 0
  };
  // One call: to_host: phase 1's blocks, the served block; to_device: gathered, result; wait:
  // after phase 1, after the server step, at the end.
  for (const Drop& d : {Drop{StagedFault::kSkipToHost, "to_host", 2},
                        Drop{StagedFault::kSkipToDevice, "to_device", 2},
                        Drop{StagedFault::kSkipWait, "wait", 3}})
    for (int index = 0; index < d.count; ++index) {
      f.ran();
      const std::vector<Outcome1> got = run(n, numel, DType::kFloat32, true, d.kind, index, &struck);
      bool differs = false;
      for (int r = 0; r < n; ++r) differs = differs || !(got[r] == cpu[r]);
      f.check(struck, str("n=", n, ": dropping ", d.name, " #", index, " never happened"));
      f.check(differs, str("n=", n, ": dropping ", d.name, " #", index,
                           " on rank 0 left every rank's outcome equal to the CPU run's"));
    }
}

void nonfinite_rejected(Failures& f) {
  f.ran();
  const int64_t numel = 37;
  std::vector<float> x(numel, 1.0f), werr(numel, 0.5f), serr(onebit_padded_numel(numel, 1), 0.0f);
  x[9] = std::numeric_limits<float>::infinity();
  const std::vector<float> werr0 = werr;
  std::string why[2];
  for (int staged = 0; staged < 2; ++staged) {
    std::unique_ptr<StagedDevice> dev(staged ? new StagedDevice() : nullptr);
    OneBitCall call;
    call.device = dev.get();
    why[staged] = onebit_prepare(view_of(x.data(), numel, DType::kFloat32),
                                 view_of(werr.data(), numel, DType::kFloat32),
                                 view_of(serr.data(), static_cast<int64_t>(serr.size()), DType::kFloat32),
                                 1, call);
  }
  f.check(!why[0].empty() && why[0] == why[1],
          str("non-finite input: CPU says '", why[0], "', staged says '", why[1], "'"));
  f.check(std::memcmp(werr.data(), werr0.data(), 4 * numel) == 0, "non-finite input: worker error changed");
}

// ---- the hierarchical 1-bit allreduce, allgather and the sparse allreduce ----------------------

// Buffers that outlive a call (a dropped wait leaves kernels queued on them); a deque keeps them put.
using Keep = std::deque<std::vector<uint8_t>>;
// One rank's part of a case: what its calls leave (the bytes as each call returns), on `dev`
// (null: the CPU's table).
using Body = std::function<std::vector<uint8_t>(Communicator&, DeviceTable*, Keep&)>;

struct CaseRun {
  std::vector<std::vector<uint8_t>> out;  // per rank; a throw as its message's bytes
  uint64_t host_bytes = 0;                // rank 0's
  bool struck = false;
};

CaseRun run_case(int n, const Body& body, bool staged, StagedFault fault = StagedFault::kNone,
                 int index = 0) {
  CaseRun got;
  got.out.resize(static_cast<size_t>(n));
  ThreadWorld world(n, kHangS);
  const std::vector<std::string> failed = world.run([&](Communicator& comm) {
    const int r = comm.rank();
    std::unique_ptr<StagedDevice> dev(staged ? new StagedDevice() : nullptr);
    if (dev && r == 0) dev->set_fault(fault, index);
    Keep keep;
    try {
      got.out[r] = body(comm, dev.get(), keep);
    } catch (const std::exception& e) {
      const std::string why = str("threw: ", e.what());
      got.out[r].assign(why.begin(), why.end());
      world.abort(why);  // the peers stop waiting for this rank
    }
    if (dev) {
      if (r == 0) {
        got.host_bytes = dev->host_bytes();
        got.struck = dev->faults_struck() > 0;
      }
      dev->set_fault(StagedFault::kNone);
      dev->wait();  // nothing of a dropped wait may outlive `keep`
    }
  });
  for (int r = 0; r < n; ++r)
    if (!failed[r].empty()) got.out[r].assign(failed[r].begin(), failed[r].end());
  return got;
}

void append(std::vector<uint8_t>& out, const void* p, size_t bytes) {
  const auto* b = static_cast<const uint8_t*>(p);
  out.insert(out.end(), b, b + bytes);
}

std::vector<uint8_t>& zeros(Keep& keep, int64_t floats) {
  keep.emplace_back(static_cast<size_t>(floats) * 4, 0);
  return keep.back();
}

// Two calls of the hierarchical collective; m_loc ranks per node (1: flat).
Body hierarchical_body(HierarchicalPayload payload, bool moments, int m_loc, int64_t numel) {
  return [=](Communicator& comm, DeviceTable* dev, Keep& keep) {
    const int r = comm.rank();
    std::unique_ptr<Communicator> node;
    std::unique_ptr<HierarchicalOneBitPlan> plan;
    HierarchicalGroups groups{nullptr, &comm};
    if (m_loc > 1) {
      node = comm.split(r / m_loc, r);
      plan.reset(new HierarchicalOneBitPlan(comm, *node));
      groups = plan->groups();
    }
    const int64_t dpad = hierarchical_padded_numel(numel, comm.size());
    const int64_t c1 = dpad / m_loc, c2 = dpad / comm.size();
    std::vector<uint8_t>&werr = zeros(keep, c1), &serr = zeros(keep, c2), &m = zeros(keep, c1),
                         &b = zeros(keep, c1);
    std::vector<uint8_t> out;
    for (int c = 0; c < 2; ++c) {
      keep.push_back(input(r, c, numel, DType::kFloat32));
      std::vector<uint8_t>& x = keep.back();
      HierarchicalCall hc;
      hc.buffer = view_of(x.data(), numel, DType::kFloat32);
      hc.worker_error = view_of(werr.data(), c1, DType::kFloat32);
      hc.server_error = view_of(serr.data(), c2, DType::kFloat32);
      hc.payload = payload;
      hc.key.seed = 11;
      hc.key.step = static_cast<uint32_t>(c);
      hc.device = dev;
      if (moments) {
        hc.has_moments = true;
        hc.m = view_of(m.data(), c1, DType::kFloat32);
        hc.b = view_of(b.data(), c1, DType::kFloat32);
      }
      const std::string why = hierarchical_check(groups, hc);
      if (!why.empty()) throw UsageError(why);
      hierarchical_compressed_allreduce(groups, hc);
      for (const std::vector<uint8_t>* v : {&x, &werr, &serr, &m, &b}) append(out, v->data(), v->size());
    }
    return out;
  };
}

// Rank r's r + 1 rows of 12 bytes.
Body allgather_body() {
  return [](Communicator& comm, DeviceTable* dev, Keep& keep) {
    const int r = comm.rank();
    keep.push_back(input(r, 0, 3 * (r + 1), DType::kFloat32));
    std::vector<unsigned char> out;
    std::vector<int64_t> rows;
    allgather_rows(comm, keep.back().data(), r + 1, 12, out, rows, dev);
    std::vector<uint8_t> got(out.begin(), out.end());
    append(got, rows.data(), rows.size() * sizeof(int64_t));
    return got;
  };
}

// Two calls of the sparse allreduce of `spec` (its step: the call) on `dtype` buffers.
Body sparse_body(SparseSpec spec, DType dtype, int64_t numel) {
  return [=](Communicator& comm, DeviceTable* dev, Keep& keep) mutable {
    const int r = comm.rank();
    std::vector<uint8_t>& u = zeros(keep, numel);
    keep.push_back(input(r, 9, numel, DType::kFloat32));  // an error carried from an earlier call
    std::vector<uint8_t>& e = keep.back();
    const bool dgc = spec.momentum != 0.0;
    std::vector<uint8_t> out;
    for (int c = 0; c < 2; ++c) {
      keep.push_back(input(r, c, numel, dtype));
      std::vector<uint8_t>& x = keep.back();
      spec.step = static_cast<uint32_t>(c);
      const TensorView xv = view_of(x.data(), numel, dtype), ev = view_of(e.data(), numel, DType::kFloat32),
                       uv = dgc ? view_of(u.data(), numel, DType::kFloat32) : TensorView{};
      const std::string why = sparse_check_input(xv, ev, uv, spec, dev);
      if (!why.empty()) throw UsageError(why);
      sparse_allreduce_prepared(comm, xv, ev, uv, spec, dev);
      for (const std::vector<uint8_t>* v : {&x, &e, &u}) append(out, v->data(), v->size());
    }
    return out;
  };
}

SparseSpec sparse_spec(SparseKind kind, double ratio, double momentum = 0.0,
                       std::vector<int64_t> segments = {}) {
  SparseSpec spec;
  spec.kind = kind;
  spec.ratio = ratio;
  spec.seed = 3;
  spec.momentum = momentum;
  spec.segments = std::move(segments);
  return spec;
}

struct TableCase {
  std::string name;
  Body body;
  uint64_t want_host;  // rank 0's host bytes over the case's calls (0: only more than none)
  std::vector<std::pair<StagedFault, int>> drops;
};

std::vector<TableCase> table_cases(int n) {
  constexpr int64_t kNumel = 203;
  const int64_t dpad = hierarchical_padded_numel(kNumel, n);
  const uint64_t piece = static_cast<uint64_t>(dpad / (8 * n));
  const int64_t k = sparse_k(kNumel, 0.1);
  const std::vector<std::pair<StagedFault, int>> all = {
      {StagedFault::kSkipToHost, 0}, {StagedFault::kSkipToDevice, 0}, {StagedFault::kSkipWait, 0}};
  std::vector<TableCase> cases = {
      // Per call: the worker bits out, n pieces in, the server piece out, the chunk's bits in.
      {"Birder", hierarchical_body(HierarchicalPayload::kSign, true, 1, kNumel), 2 * (3 * n + 1) * piece, all},
      {"SignSGD", hierarchical_body(HierarchicalPayload::kSign, false, 1, kNumel), 2 * (3 * n + 1) * piece, all},
      {"scaled 1-bit", hierarchical_body(HierarchicalPayload::kScaled, false, 1, kNumel), 0, all},
      {"allgather", allgather_body(), 12, {{StagedFault::kSkipToHost, 0}, {StagedFault::kSkipWait, 0}}},
      // Per call: k pairs out, n k pairs in.
      {"top-k", sparse_body(sparse_spec(SparseKind::kTopK, 0.1), DType::kFloat32, kNumel),
       static_cast<uint64_t>(2 * (8 * k + 8 * k * n)), all},
      {"top-k DGC segments fp16",
       sparse_body(sparse_spec(SparseKind::kTopK, 0.1, 0.9, {100, 3, 100}), DType::kFloat16, kNumel), 0, all},
      // Per call: k values out, their sum in.
      {"random-k", sparse_body(sparse_spec(SparseKind::kRandomK, 0.1), DType::kBFloat16, kNumel),
       static_cast<uint64_t>(2 * 8 * k), all},
      // The buffer, then the error copied out, each waited for: the second wait is the one the host's reads need.
      {"top-k dense", sparse_body(sparse_spec(SparseKind::kTopK, 0.6), DType::kFloat32, kNumel), 0,
       {{StagedFault::kSkipToHost, 0}, {StagedFault::kSkipToDevice, 0}, {StagedFault::kSkipWait, 1}}},
      {"fp16 wire", sparse_body(sparse_spec(SparseKind::kFloat16, 1.0), DType::kFloat32, kNumel), 0, all},
  };
  if (n == 4)
    for (HierarchicalPayload p : {HierarchicalPayload::kSign, HierarchicalPayload::kScaled})
      cases.push_back({p == HierarchicalPayload::kSign ? "Birder nodes of 2" : "scaled 1-bit nodes of 2",
                       hierarchical_body(p, p == HierarchicalPayload::kSign, 2, kNumel), 0, all});
  return cases;
}

void table_cases_staged_equal_cpu(Failures& f, int n) {
  for (const TableCase& c : table_cases(n)) {
    const std::string what = str(c.name, " n=", n);
    f.ran();
    const CaseRun cpu = run_case(n, c.body, false);
    const CaseRun staged = run_case(n, c.body, true);
    for (int r = 0; r < n; ++r) {
      const std::string text(cpu.out[r].begin(), cpu.out[r].end());
      f.check(text.rfind("threw: ", 0) != 0, str(what, ": rank ", r, " ", text.substr(0, 200)));
      f.check(staged.out[r] == cpu.out[r], str(what, ": rank ", r, ": staged differs from the CPU run"));
    }
    if (c.want_host)
      f.check(staged.host_bytes == c.want_host,
              str(what, ": rank 0 copied ", staged.host_bytes, " host bytes, want ", c.want_host));
    else
      f.check(staged.host_bytes > 0, str(what, ": rank 0 copied no host bytes: not through the table"));
    for (const auto& d : c.drops) {
      f.ran();
      const CaseRun dropped = run_case(n, c.body, true, d.first, d.second);
      bool differs = false;
      for (int r = 0; r < n; ++r) differs = differs || dropped.out[r] != cpu.out[r];
      const char* kind = d.first == StagedFault::kSkipToHost     ? "to_host"
                         : d.first == StagedFault::kSkipToDevice ? "to_device"
                                                                  : "wait";
      f.check(dropped.struck, str(what, ": dropping ", kind, " #", d.second, " never happened"));
      f.check(differs, str(what, ": dropping ", kind, " #", d.second,
                           " on rank 0 left every rank's outcome equal to the CPU run's"));
    }
  }
}

// Every rank's fused buffer after flat Adasum; `staged`: on a staged device of its own per rank,
// rank 0's dropping its `index`-th operation of `fault`.
std::vector<std::vector<uint8_t>> adasum_run(int n, DType dtype, bool staged, StagedFault fault,
                                             int index) {
  const std::vector<int64_t> sizes = {7, 13};
  std::vector<std::vector<uint8_t>> out(static_cast<size_t>(n));
  ThreadWorld world(n, kHangS);
  const std::vector<std::string> failed = world.run([&](Communicator& comm) {
    const int r = comm.rank();
    AdasumPlan plan(comm);
    std::unique_ptr<StagedDevice> dev(staged ? new StagedDevice() : nullptr);
    if (dev && r == 0) dev->set_fault(fault, index);
    std::vector<uint8_t> buf = input(r, 0, 20, dtype);
    adasum_rvh(plan, view_of(buf.data(), 20, dtype), sizes, dev.get());
    out[r] = buf;
    if (dev) {
      dev->set_fault(StagedFault::kNone);
      dev->wait();
    }
  });
  for (int r = 0; r < n; ++r)
    if (!failed[r].empty()) out[r].clear();
  return out;
}

void adasum_staged_equals_cpu(Failures& f, int n) {
  for (DType dtype : {DType::kFloat32, DType::kFloat16}) {
    f.ran();
    const auto cpu = adasum_run(n, dtype, false, StagedFault::kNone, 0);
    const auto staged = adasum_run(n, dtype, true, StagedFault::kNone, 0);
    const auto dropped = adasum_run(n, dtype, true, StagedFault::kSkipToHost, 0);
    bool differs = false;
    for (int r = 0; r < n; ++r) {
      f.check(!cpu[r].empty() && staged[r] == cpu[r],
              str("Adasum n=", n, " ", dtype_name(dtype), ": rank ", r, ": staged differs from CPU"));
      differs = differs || dropped[r] != cpu[r];
    }
    f.check(differs, str("Adasum n=", n, " ", dtype_name(dtype), ": a dropped copy went unnoticed"));
  }
}

// ---- SLAMB's masked allreduce and the block-quantized allreduce over the table ------------------

// What one rank ends with: the bytes the calls left (each as it returned), the host bytes copied and
// the payload bytes the calls should have copied.
struct RankOut {
  std::vector<uint8_t> bytes;
  uint64_t host_bytes = 0, payload = 0;
  std::string threw;
};

// `body(comm, dev, out)` on n thread ranks, dev the CPU's table or (staged) a staged device per rank,
// rank 0's dropping its `index`-th operation of `fault`; *struck: whether the drop happened.
template <typename Body>
std::vector<RankOut> on_ranks(int n, bool staged, StagedFault fault, int index, bool* struck, Body body) {
  std::vector<RankOut> out(static_cast<size_t>(n));
  int struck_count = 0;
  ThreadWorld world(n, kHangS);
  const std::vector<std::string> failed = world.run([&](Communicator& comm) {
    const int r = comm.rank();
    std::unique_ptr<StagedDevice> dev(staged ? new StagedDevice() : nullptr);
    if (dev && r == 0) dev->set_fault(fault, index);
    DeviceTable& table = dev ? *dev : cpu_device(KernelChoice::kAuto);
    const uint64_t before = table.host_bytes();
    try {
      body(comm, table, out[r]);
    } catch (const std::exception& e) {
      out[r].threw = e.what();
    }
    out[r].host_bytes = table.host_bytes() - before;
    if (dev) {
      if (r == 0) struck_count = dev->faults_struck();
      dev->set_fault(StagedFault::kNone);
      dev->wait();  // nothing of a dropped wait may outlive the buffers
    }
  });
  for (int r = 0; r < n; ++r)
    if (!failed[r].empty()) out[r].threw = failed[r];
  if (struck) *struck = struck_count > 0;
  return out;
}

// SLAMB's masked allreduce (masked_draw + masked_average) over kCalls steps of one mask spec, each
// call on a fresh buffer: the buffer and the mask as each call returns. The payload: the selected
// elements out and back.
struct MaskedCase {
  MaskKind kind;
  DType dtype;
  int64_t numel;
};

void masked_body(const MaskedCase& c, Communicator& comm, DeviceTable& dev, RankOut& o,
                 std::vector<std::vector<uint8_t>>& keep) {
  const size_t esize = dtype_size(c.dtype);
  std::vector<unsigned char> scratch;
  for (int call = 0; call < kCalls; ++call) {
    MaskSpec spec;
    spec.numel = c.numel;
    spec.ratio = 0.3;
    spec.seed = 5;
    spec.step = call;
    spec.kind = c.kind;
    spec.always = {0, 3};
    keep.push_back(input(comm.rank(), call, c.numel, c.dtype));
    keep.push_back(std::vector<uint8_t>(static_cast<size_t>(c.numel), 0x5a));
    std::vector<uint8_t>& buf = keep[keep.size() - 2];
    std::vector<uint8_t>& mask = keep.back();
    masked_draw(dev, spec, mask.data());
    masked_average(comm, dev, view_of(buf.data(), c.numel, c.dtype), mask.data(), scratch);
    o.bytes.insert(o.bytes.end(), buf.begin(), buf.end());
    o.bytes.insert(o.bytes.end(), mask.begin(), mask.end());
    // The payload, from this rank's own host count of what the call returned (a wrong mask shows above).
    o.payload += 2 * static_cast<uint64_t>(mask_count(mask.data(), c.numel)) * esize;
  }
}

std::vector<RankOut> masked_run(int n, const MaskedCase& c, bool staged, StagedFault fault, int index,
                                bool* struck) {
  std::vector<std::vector<std::vector<uint8_t>>> keep(static_cast<size_t>(n));
  return on_ranks(n, staged, fault, index, struck, [&](Communicator& comm, DeviceTable& dev, RankOut& o) {
    masked_body(c, comm, dev, o, keep[comm.rank()]);
  });
}

// The block-quantized allreduce over kCalls calls with the error carried: the buffer as each call
// returns, then the error. The payload: (3n + 1) chunks of blocks per call.
struct BlockQuantCase {
  int bits;
  ReduceOp op;
  int64_t numel;
  bool with_error;
};

std::vector<RankOut> block_quant_run(int n, const BlockQuantCase& c, bool staged, StagedFault fault, int index,
                                     bool* struck) {
  std::vector<std::vector<std::vector<float>>> keep(static_cast<size_t>(n));
  return on_ranks(n, staged, fault, index, struck, [&](Communicator& comm, DeviceTable& dev, RankOut& o) {
    std::vector<std::vector<float>>& k = keep[comm.rank()];
    k.emplace_back(static_cast<size_t>(c.numel), 0.0f);  // the error, carried
    int64_t chunk = (c.numel + n - 1) / n;
    chunk = (chunk + kBlockQuantBlock - 1) / kBlockQuantBlock * kBlockQuantBlock;
    const uint64_t chunk_bytes = static_cast<uint64_t>(chunk / kBlockQuantBlock * block_quant_block_bytes(c.bits));
    for (int call = 0; call < kCalls; ++call) {
      std::vector<uint8_t> in = input(comm.rank(), call, c.numel, DType::kFloat32);
      k.emplace_back(static_cast<size_t>(c.numel));
      std::vector<float>& buf = k.back();
      std::memcpy(buf.data(), in.data(), in.size());
      TensorView err = c.with_error ? view_of(k[0].data(), c.numel, DType::kFloat32) : TensorView{};
      block_quant_allreduce_prepared(comm, dev, view_of(buf.data(), c.numel, DType::kFloat32), err, c.bits, c.op);
      const auto* b = reinterpret_cast<const uint8_t*>(buf.data());
      o.bytes.insert(o.bytes.end(), b, b + 4 * c.numel);
      o.payload += (3 * static_cast<uint64_t>(n) + 1) * chunk_bytes;
    }
    const auto* e = reinterpret_cast<const uint8_t*>(k[0].data());
    o.bytes.insert(o.bytes.end(), e, e + 4 * c.numel);
  });
}

// Staged equals CPU bit for bit on every rank, copying exactly the payload; each listed drop on rank
// 0 changes some rank's outcome.
template <typename Run>
void staged_matches_and_drops_show(Failures& f, const std::string& what, int n, Run run,
                                   std::initializer_list<std::pair<StagedFault, int>> drops) {
  f.ran();
  const std::vector<RankOut> cpu = run(false, StagedFault::kNone, 0, nullptr);
  const std::vector<RankOut> staged = run(true, StagedFault::kNone, 0, nullptr);
  for (int r = 0; r < n; ++r) {
    f.check(cpu[r].threw.empty() && staged[r].threw.empty(),
            str(what, ": rank ", r, " threw: ", cpu[r].threw, staged[r].threw));
    f.check(staged[r].bytes == cpu[r].bytes, str(what, ": rank ", r, ": staged run differs from the CPU run"));
    f.check(cpu[r].host_bytes == 0, str(what, ": rank ", r, ": the CPU run copied host bytes"));
    f.check(staged[r].host_bytes == staged[r].payload && staged[r].payload > 0,
            str(what, ": rank ", r, " copied ", staged[r].host_bytes, " host bytes, want ", staged[r].payload));
  }
  for (const auto& d : drops) {
    f.ran();
    bool struck = false;
    const std::vector<RankOut> got = run(true, d.first, d.second, &struck);
    bool differs = false;
    for (int r = 0; r < n; ++r) differs = differs || got[r].bytes != cpu[r].bytes || !got[r].threw.empty();
    const char* kind = d.first == StagedFault::kSkipToHost     ? "to_host"
                       : d.first == StagedFault::kSkipToDevice ? "to_device"
                                                               : "wait";
    f.check(struck, str(what, ": dropping ", kind, " #", d.second, " never happened"));
    f.check(differs, str(what, ": dropping ", kind, " #", d.second,
                         " on rank 0 left every rank's outcome equal to the CPU run's"));
  }
}

void masked_staged_equals_cpu(Failures& f, int n) {
  for (MaskKind kind : {MaskKind::kCyclic, MaskKind::kBernoulli})
    for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kFloat64})
      for (int64_t numel : {int64_t{1}, int64_t{200}}) {
        const MaskedCase c{kind, dtype, numel};
        const std::string what = str("masked n=", n, kind == MaskKind::kCyclic ? " cyclic " : " bernoulli ",
                                     dtype_name(dtype), " numel=", numel);
        // One call's drops: its dense average's copy out and back, the wait before the host reads the
        // copy out, and the last wait (before the caller reads). The wait after the copy back is
        // followed by the scatter in stream order, so dropping it changes nothing.
        const bool full = numel > 1 && dtype == DType::kFloat32;
        staged_matches_and_drops_show(
            f, what, n,
            [&](bool staged, StagedFault fault, int index, bool* struck) {
              return masked_run(n, c, staged, fault, index, struck);
            },
            full ? std::initializer_list<std::pair<StagedFault, int>>{{StagedFault::kSkipToHost, 0},
                                                                     {StagedFault::kSkipToDevice, 0},
                                                                     {StagedFault::kSkipWait, 0},
                                                                     {StagedFault::kSkipWait, 2}}
                 : std::initializer_list<std::pair<StagedFault, int>>{});
      }
}

void block_quant_staged_equals_cpu(Failures& f, int n) {
  for (int bits : {4, 8})
    for (int64_t numel : {int64_t{1}, int64_t{64} * n, int64_t{1000}}) {
      const BlockQuantCase c{bits, bits == 4 ? ReduceOp::kAverage : ReduceOp::kSum, numel, numel != 1};
      const std::string what = str("block-quantized n=", n, " int", bits, " numel=", numel);
      // One call's drops: the compressed chunks out and the server's chunk out, the received chunks in
      // and the result in, the waits after each copy out and the last one.
      const bool full = numel == 1000;
      staged_matches_and_drops_show(
          f, what, n,
          [&](bool staged, StagedFault fault, int index, bool* struck) {
            return block_quant_run(n, c, staged, fault, index, struck);
          },
          full ? std::initializer_list<std::pair<StagedFault, int>>{{StagedFault::kSkipToHost, 0},
                                                                   {StagedFault::kSkipToHost, 1},
                                                                   {StagedFault::kSkipToDevice, 0},
                                                                   {StagedFault::kSkipToDevice, 1},
                                                                   {StagedFault::kSkipWait, 0},
                                                                   {StagedFault::kSkipWait, 1},
                                                                   {StagedFault::kSkipWait, 2}}
               : std::initializer_list<std::pair<StagedFault, int>>{});
    }
}

// The input checks run on the table's kernel: the staged device finds the CPU's first non-finite
// element (the block-quantized allreduce's x + error; the masked calls' x in every float dtype).
void table_nonfinite_equals_cpu(Failures& f) {
  f.ran();
  const int64_t numel = 300;
  std::vector<float> x(numel, 1.0f), err(numel, 0.5f);
  err[211] = std::numeric_limits<float>::infinity();
  x[250] = std::numeric_limits<float>::quiet_NaN();
  StagedDevice staged;
  const TensorView xv = view_of(x.data(), numel, DType::kFloat32), ev = view_of(err.data(), numel, DType::kFloat32);
  const std::string cpu_why = block_quant_check_input(xv, ev, 4, ReduceOp::kAverage);
  const std::string staged_why = block_quant_check_input(xv, ev, 4, ReduceOp::kAverage, &staged);
  f.check(cpu_why.find("element 211") != std::string::npos && staged_why == cpu_why,
          str("block-quantized non-finite: CPU says '", cpu_why, "', staged says '", staged_why, "'"));
  for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kFloat64}) {
    f.ran();
    std::vector<uint8_t> buf = input(0, 0, numel, dtype);
    const size_t esize = dtype_size(dtype);
    std::memset(buf.data() + 123 * esize, 0xff, esize);  // all ones: a NaN in every float format
    const int64_t cpu = cpu_device(KernelChoice::kAuto).first_nonfinite(buf.data(), dtype, nullptr, numel);
    const int64_t got = staged.first_nonfinite(buf.data(), dtype, nullptr, numel);
    f.check(cpu == 123 && got == cpu, str("first_nonfinite ", dtype_name(dtype), ": CPU ", cpu, ", staged ", got));
  }
}

}  // namespace
}  // namespace hvdc

int main() {
  hvdc::Failures f;
  for (int n = 2; n <= 4; ++n) {
    for (hvdc::DType dtype : {hvdc::DType::kFloat32, hvdc::DType::kFloat16, hvdc::DType::kBFloat16})
      for (int64_t numel : {int64_t{1}, int64_t{8 * n}, int64_t{1000}})
        hvdc::staged_equals_cpu(f, n, numel, dtype);
    hvdc::a_dropped_copy_or_wait_shows(f, n);
    hvdc::table_cases_staged_equal_cpu(f, n);
  }
  for (int n = 2; n <= 5; ++n) hvdc::adasum_staged_equals_cpu(f, n);
  hvdc::nonfinite_rejected(f);
  hvdc::table_nonfinite_equals_cpu(f);
  for (int n = 2; n <= 4; ++n) {
    hvdc::masked_staged_equals_cpu(f, n);
    hvdc::block_quant_staged_equals_cpu(f, n);
  }
  return f.finish("test_device_table");
}
