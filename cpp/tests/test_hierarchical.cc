// hierarchical_compressed_allreduce (cpp/src/hierarchical_allreduce.cc: the Hierarchical-1-bit-All-Reduce
// of paper 004, Section 4, specs/birder.md section 4) on thread ranks against
// hvd_compress/reference/birder.py: 2 nodes x 2 ranks, 1 node x 3 and 3 nodes x 1 (node groups of
// one rank, and flat mode without a node group), three calls in a row with the errors and moments
// carried over, with both kernel choices (the AVX2 path where the CPU has it, and the scalar one).
//   - Birder's +/-1 payload, with injected uniforms (with and without the moments) and with the
//     core's Philox draws: result, worker and server error, m and b exactly equal to the reference;
//   - the scaled 1-bit payload of 1-bit Adam/LAMB: within 2^-22 of the largest expected magnitude,
//     as tests/test_compressed_allreduce.py (the reference orders a float64 sum of squares
//     differently, which may move a float32 scale by one ulp in a rare tie);
//   - padding never leaks: the padding entries of the errors and moments start as a sentinel and
//     must keep it, the bytes after the buffer's d elements are never written, and the results
//     (which the sentinel would change if it were read) still equal the reference;
//   - identical result bits on every rank, and the bytes each group moved: inter-node 2 (n - 1)
//     c2 / 8 per rank for the +/-1 payload (spec 4: 2 (n - 1) d_pad bits over all ranks);
//   - nodes of unequal size, and a non-finite input on one rank: the same UsageError on every rank
//     from Runtime::hierarchical_compressed_allreduce (built over the thread ranks with nodes of
//     HVDC_LOCAL_SIZE), with every buffer unchanged.
//
// Usage: test_hierarchical FIXTURES (written by cpp/tests/make_fixtures.py).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "check.h"
#include "fixtures.h"
#include "hvdc/compressed_allreduce.h"
#include "hvdc/errors.h"
#include "hvdc/hierarchical_allreduce.h"
#include "hvdc/runtime.h"
#include "thread_communicator.h"

namespace hvdc {
namespace {

constexpr double kHangS = 60;  // a rank that waits this long is deadlocked: fail, do not hang
// What the padding entries of the state hold before each case: finite, and far from anything an
// error or moment can be, so that a kernel that read it would change a result and one that wrote
// it would be seen.
constexpr float kSentinel = 1.0e6f;
constexpr int64_t kGuard = 16;  // float32s after the buffer's d elements that must stay untouched

TensorView f32_view(float* data, int64_t numel) {
  TensorView v;
  v.data = data;
  v.numel = numel;
  v.dtype = DType::kFloat32;
  v.shape = {numel};
  return v;
}

TensorView f32_view(std::vector<float>& v) { return f32_view(v.data(), static_cast<int64_t>(v.size())); }

std::vector<float> to_f32(const std::vector<double>& v) { return {v.begin(), v.end()}; }

double scaled_tolerance(const std::vector<double>& want) {
  double top = 1e-30;
  for (double v : want) top = std::max(top, std::fabs(v));
  return std::ldexp(1.0, -22) * top;
}

struct Meta {
  int world = 0, m_loc = 0, n = 0;
  bool flat = false;
  int64_t numel = 0, dpad = 0, c1 = 0, c2 = 0;
  int calls = 0;
  HierarchicalPayload payload = HierarchicalPayload::kSign;
  bool moments = false, injected = false;
  uint64_t seed = 0;

  explicit Meta(const std::vector<double>& v)
      : world(static_cast<int>(v.at(0))),
        m_loc(static_cast<int>(v.at(1))),
        n(world / m_loc),
        flat(v.at(2) != 0),
        numel(static_cast<int64_t>(v.at(3))),
        dpad(hierarchical_padded_numel(numel, world)),
        c1(dpad / m_loc),
        c2(dpad / world),
        calls(static_cast<int>(v.at(4))),
        payload(static_cast<HierarchicalPayload>(static_cast<int>(v.at(5)))),
        moments(v.at(6) != 0),
        injected(v.at(7) != 0),
        seed(static_cast<uint64_t>(v.at(8))) {}

  // Entries of rank r's worker error (and moments) that hold data: the real elements of C_l.
  int64_t worker_real(int r) const { return std::clamp<int64_t>(numel - (r % m_loc) * c1, 0, c1); }
  // Entries of rank r's server error that hold data.
  int64_t server_real(int r) const {
    const int l = r % m_loc, j = r / m_loc;
    if (payload == HierarchicalPayload::kSign)
      return std::clamp<int64_t>(numel - (l * c1 + j * c2), 0, c2);
    // The 1-bit allreduce among the nodes on the real1 elements of C_l: node j serves its chunk.
    const int64_t real1 = worker_real(r), chunk = onebit_padded_numel(real1, n) / n;
    return std::clamp<int64_t>(real1 - j * chunk, 0, chunk);
  }
  // Bytes rank r sends (and receives) per call on the inter-node (cross) and node groups.
  uint64_t cross_bytes(int r) const {
    if (payload == HierarchicalPayload::kSign) return 2ull * (n - 1) * (c2 / 8);
    const int64_t real1 = worker_real(r);
    if (real1 == 0) return 0;
    return 2ull * (n - 1) * (sizeof(float) + onebit_padded_numel(real1, n) / n / 8);
  }
  // Bytes rank r sends (`out`) or receives on the node group per call. Nodes of 2, or a buffer without
  // padding, move only real elements in float32, sendrecv rounds: stage 1 sends the real part of every
  // peer's chunk and receives its own from each peer; stage 5 gathers the float32 chunks the other way
  // (1-bit Adam/LAMB) or c1 / 8 bytes of bits each way (Birder). Otherwise whole padded chunks.
  uint64_t node_bytes(int r, bool out) const {
    if (flat || m_loc == 1) return 0;
    const uint64_t f = sizeof(float);
    if (numel != dpad && m_loc > 2) {
      const uint64_t back = payload == HierarchicalPayload::kSign ? c1 / 8 : c1 * f;
      return (m_loc - 1) * (c1 * f + back);
    }
    const int l = r % m_loc;
    uint64_t others = 0;
    for (int k = 0; k < m_loc; ++k)
      if (k != l) others += worker_real(k) * f;
    const uint64_t own = (m_loc - 1) * worker_real(l) * f;
    if (payload == HierarchicalPayload::kSign) return (out ? others : own) + (m_loc - 1) * (c1 / 8);
    return others + own;
  }
};

// A state vector of `size` float32s: the first `real` start at 0 (as the reference's), the rest is
// padding and starts as the sentinel.
std::vector<float> state(int64_t size, int64_t real) {
  std::vector<float> v(static_cast<size_t>(size), kSentinel);
  std::fill(v.begin(), v.begin() + real, 0.0f);
  return v;
}

// The reference's values on the real entries, the sentinel on the padding.
std::vector<double> expected_state(const std::vector<double>& ref, int64_t real) {
  std::vector<double> want = ref;
  for (size_t i = static_cast<size_t>(real); i < want.size(); ++i) want[i] = kSentinel;
  return want;
}

std::vector<double> widen(const std::vector<float>& v) { return {v.begin(), v.end()}; }

const char* kernel_name(KernelChoice k) { return k == KernelChoice::kScalar ? "scalar" : "auto"; }

void run_case_with(Failures& f, const Fixtures& fx, const std::string& name, KernelChoice kernels,
                   OneBitPipeline pipeline) {
  const std::string base = "hierarchical/" + name;
  const Meta mt(fx.at(base + "/meta"));
  const std::string label =
      str(name, " (", kernel_name(kernels), " kernels", pipeline.piece == 0 ? "" : ", pipelined", ")");
  // got[call][rank] = {result, worker error, server error, m, b}
  std::vector<std::vector<std::vector<std::vector<double>>>> got(
      mt.calls, std::vector<std::vector<std::vector<double>>>(mt.world));
  std::vector<uint64_t> cross_sent(mt.world), cross_received(mt.world), node_sent(mt.world),
      node_received(mt.world);
  std::vector<std::string> invalid(mt.world);
  std::vector<bool> guard_ok(mt.world, true);

  ThreadWorld world(mt.world, kHangS);
  const std::vector<std::string> failed = world.run([&](Communicator& comm) {
    const int r = comm.rank();
    std::unique_ptr<Communicator> node;
    std::unique_ptr<HierarchicalOneBitPlan> plan;
    HierarchicalGroups groups{nullptr, &comm};
    if (!mt.flat) {  // as the Runtime with HVDC_LOCAL_SIZE = m_loc: consecutive ranks form a node
      node = comm.split(r / mt.m_loc, r);
      plan = std::make_unique<HierarchicalOneBitPlan>(comm, *node);
      invalid[r] = plan->invalid();
      groups = plan->groups();
    }
    const CommStats cross0 = groups.cross->stats();
    const CommStats node0 = node ? node->stats() : CommStats{};
    const int64_t real1 = mt.worker_real(r);
    std::vector<float> werr = state(mt.c1, real1), serr = state(mt.c2, mt.server_real(r));
    std::vector<float> m = state(mt.c1, real1), b = state(mt.c1, real1);
    for (int call = 0; call < mt.calls; ++call) {
      std::vector<float> x = to_f32(fx.at(str(base, "/", call, "/in/", r)));
      x.resize(static_cast<size_t>(mt.numel + kGuard), -kSentinel);
      std::vector<float> uw, us;
      HierarchicalCall hc;
      hc.buffer = f32_view(x.data(), mt.numel);
      hc.worker_error = f32_view(werr);
      hc.server_error = f32_view(serr);
      hc.payload = mt.payload;
      hc.key.seed = mt.seed;
      hc.key.step = static_cast<uint32_t>(call);
      hc.kernels = kernels;
      hc.pipeline = pipeline;
      if (mt.injected) {
        uw = to_f32(fx.at(str(base, "/", call, "/uw")));
        us = to_f32(fx.at(str(base, "/", call, "/us")));
        hc.worker_uniforms = f32_view(uw);
        hc.server_uniforms = f32_view(us);
      }
      if (mt.moments) {
        hc.has_moments = true;
        hc.m = f32_view(m);
        hc.b = f32_view(b);
      }
      const std::string why = hierarchical_check(groups, hc);
      if (!why.empty()) throw UsageError(why);
      hierarchical_compressed_allreduce(groups, hc);
      for (int64_t i = mt.numel; i < mt.numel + kGuard; ++i) guard_ok[r] = guard_ok[r] && x[i] == -kSentinel;
      x.resize(static_cast<size_t>(mt.numel));
      got[call][r] = {widen(x), widen(werr), widen(serr), widen(m), widen(b)};
    }
    cross_sent[r] = groups.cross->stats().bytes_sent - cross0.bytes_sent;
    cross_received[r] = groups.cross->stats().bytes_received - cross0.bytes_received;
    node_sent[r] = node ? node->stats().bytes_sent - node0.bytes_sent : 0;
    node_received[r] = node ? node->stats().bytes_received - node0.bytes_received : 0;
  });
  f.ran();
  for (int r = 0; r < mt.world; ++r) {
    if (!f.check(failed[r].empty(), str(label, ": rank ", r, " of ", mt.world, " threw: ", failed[r])))
      return;
    f.check(invalid[r].empty(), str(label, ": rank ", r, ": equal nodes called invalid: ", invalid[r]));
  }
  const bool exact = mt.payload == HierarchicalPayload::kSign;
  for (int call = 0; call < mt.calls; ++call) {
    const std::vector<double>& out = fx.at(str(base, "/", call, "/out"));
    const double out_tol = exact ? 0.0 : scaled_tolerance(out);
    for (int r = 0; r < mt.world; ++r) {
      const std::string what = str(label, " call ", call, ": rank ", r, " of ", mt.world);
      const std::vector<double> werr =
          expected_state(fx.at(str(base, "/", call, "/werr/", r)), mt.worker_real(r));
      const std::vector<double> serr =
          expected_state(fx.at(str(base, "/", call, "/serr/", r)), mt.server_real(r));
      const double werr_tol = exact ? 0.0 : scaled_tolerance(werr);
      const double serr_tol = exact ? 0.0 : scaled_tolerance(serr);
      check_close(f, what + " result", got[call][r][0], out, [&](size_t) { return out_tol; });
      check_close(f, what + " worker error", got[call][r][1], werr, [&](size_t) { return werr_tol; });
      check_close(f, what + " server error", got[call][r][2], serr, [&](size_t) { return serr_tol; });
      if (mt.moments) {
        check_close(f, what + " m", got[call][r][3],
                    expected_state(fx.at(str(base, "/", call, "/m/", r)), mt.worker_real(r)),
                    [](size_t) { return 0.0; });
        check_close(f, what + " b", got[call][r][4],
                    expected_state(fx.at(str(base, "/", call, "/b/", r)), mt.worker_real(r)),
                    [](size_t) { return 0.0; });
      }
      f.check(same_bits(got[call][r][0], got[call][0][0]), what + ": result differs from rank 0's");
    }
  }
  for (int r = 0; r < mt.world; ++r) {
    const std::string what = str(label, ": rank ", r, " of ", mt.world);
    f.check(guard_ok[r], what + ": wrote past the buffer's " + std::to_string(mt.numel) + " elements");
    const uint64_t cross = mt.calls * mt.cross_bytes(r);
    const uint64_t local_out = mt.calls * mt.node_bytes(r, true), local_in = mt.calls * mt.node_bytes(r, false);
    f.check(cross_sent[r] == cross && cross_received[r] == cross,
            str(what, ": inter-node group moved ", cross_sent[r], " bytes out and ", cross_received[r],
                " in, want ", cross, " each"));
    f.check(node_sent[r] == local_out && node_received[r] == local_in,
            str(what, ": node group moved ", node_sent[r], " bytes out and ", node_received[r], " in, want ",
                local_out, " and ", local_in));
  }
}

void run_case(Failures& f, const Fixtures& fx, const std::string& name) {
  const OneBitPipeline off{0, 0};
  for (KernelChoice k : {KernelChoice::kAuto, KernelChoice::kScalar}) run_case_with(f, fx, name, k, off);
  // The scaled payload's inter-node stage takes the runtime's pipeline setting (HVDC_ONEBIT_PIPELINE):
  // pieces of 32 from the first element, so that even these small buffers take the pipelined path.
  if (Meta(fx.at("hierarchical/" + name + "/meta")).payload == HierarchicalPayload::kScaled)
    run_case_with(f, fx, name, KernelChoice::kAuto, OneBitPipeline{32, 0});
}

// `world` ranks in nodes of `local` consecutive ranks (the last node smaller) and, when `nan_rank`
// >= 0, a NaN in that rank's input: every rank raises UsageError containing `expect`, and no buffer
// changes.
void rejected_everywhere(Failures& f, int world_size, int local, int nan_rank, const std::string& expect) {
  f.ran();
  const std::string label = str("world ", world_size, ", nodes of ", local,
                                nan_rank >= 0 ? str(", NaN on rank ", nan_rank) : std::string());
  std::vector<std::string> messages(world_size);
  ThreadWorld world(world_size, kHangS);
  const std::vector<std::string> failed = world.run([&](Communicator& comm) {
    const int r = comm.rank();
    RuntimeConfig config;
    config.timeout_s = kHangS;
    config.local_size = local;
    Runtime runtime(comm.split(0, r), config, nullptr);
    const int64_t d = 100, dpad = hierarchical_padded_numel(d, world_size);
    // Sizes that fit this rank's node, so that only the verdict being tested rejects the call.
    const int64_t c1 = dpad / runtime.node_size(), c2 = dpad / world_size;
    std::vector<float> x(d, 0.5f), werr(c1, 0.25f), serr(c2, -0.25f), m(c1, 0.125f), b(c1, 0.5f);
    if (r == nan_rank) x[7] = std::numeric_limits<float>::quiet_NaN();
    const std::vector<float> x0 = x, werr0 = werr, serr0 = serr, m0 = m, b0 = b;
    HierarchicalCall call;
    call.buffer = f32_view(x);
    call.worker_error = f32_view(werr);
    call.server_error = f32_view(serr);
    call.has_moments = true;
    call.m = f32_view(m);
    call.b = f32_view(b);
    try {
      runtime.hierarchical_compressed_allreduce(call, true, "h");
    } catch (const UsageError& e) {
      messages[r] = e.what();
    }
    const std::string what = str(label, ": rank ", r);
    f.check(std::memcmp(x.data(), x0.data(), sizeof(float) * d) == 0, what + ": buffer changed");
    f.check(werr == werr0 && serr == serr0 && m == m0 && b == b0, what + ": errors or moments changed");
  });
  for (int r = 0; r < world_size; ++r) {
    const std::string what = str(label, ": rank ", r);
    f.check(failed[r].empty(), what + " threw " + failed[r]);
    f.check(messages[r].find(expect) != std::string::npos,
            what + ": expected a UsageError containing '" + expect + "', got '" + messages[r] + "'");
    f.check(messages[r] == messages[0], what + ": raised '" + messages[r] + "', rank 0 '" + messages[0] + "'");
  }
}

void bad_input(Failures& f) {
  // Nodes {0, 1}, {2}; {0, 1}, {2, 3}, {4}; {0, 1, 2}, {3}.
  rejected_everywhere(f, 3, 2, -1, "needs nodes of equal size: a world of 3 ranks has nodes of 1 and of 2");
  rejected_everywhere(f, 5, 2, -1, "needs nodes of equal size: a world of 5 ranks has nodes of 1 and of 2");
  rejected_everywhere(f, 4, 3, -1, "needs nodes of equal size: a world of 4 ranks has nodes of 1 and of 3");
  // Equal nodes, a NaN on one rank: that rank's reason reaches every rank.
  rejected_everywhere(f, 4, 2, 3, "rank 3 rejected its input: hierarchical_compressed_allreduce: non-finite input: "
                                  "element 7 is nan");
  rejected_everywhere(f, 3, 1, 0, "rank 0 rejected its input");
}

}  // namespace
}  // namespace hvdc

int main(int argc, char** argv) {
  // 4 topologies x 4 modes x 4 sizes (cpp/tests/make_fixtures.py)
  return hvdc::run_fixture_cases(argc, argv, "test_hierarchical", "hierarchical", 64, hvdc::run_case,
                                 hvdc::bad_input);
}
