// Runtime (cpp/src/runtime.cc), the protocol every collective runs, built over thread ranks at
// n = 1..5 exactly as the extension builds it over MPI:
//   - start-up: the node topology of HVDC_LOCAL_SIZE, no start-up traffic in stats(), and an
//     invalid setting on one rank raising UsageError on every rank;
//   - counting: each call returns the bytes this rank moved (the signature exchange included,
//     calls == 1), stats() adds them up, reset_stats() clears them;
//   - agreement: ranks that call with different arguments (op, size, Adasum's hierarchical mode)
//     all raise MismatchError naming the field, before any data moves;
//   - rejection: a rank that rejects its input (bad broadcast root, Adasum sizes that do not cut
//     the buffer, Runtime::reject) makes every rank raise UsageError naming it, buffers unchanged,
//     and the runtime goes on working;
//   - timeout: a rank that never joins makes the others raise CommTimeoutError, and every later
//     call raise at once (the runtime is broken);
//   - join(): returns where every rank calls it; a rank in join() while the others reduce (uneven
//     data) makes every rank raise MismatchError naming it, and a later call works.
#include <algorithm>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "check.h"
#include "hvdc/dlpack_view.h"
#include "hvdc/errors.h"
#include "hvdc/runtime.h"
#include "hvdc/signature.h"
#include "thread_communicator.h"

namespace hvdc {
namespace {

constexpr double kHangS = 60;     // a rank that waits this long is deadlocked: fail, do not hang
constexpr double kTimeoutS = 30;  // the runtime's timeout where nobody is missing
constexpr uint64_t kSig = sizeof(CallSignature);

TensorView f32_view(std::vector<float>& v) {
  TensorView t;
  t.data = v.data();
  t.numel = static_cast<int64_t>(v.size());
  t.dtype = DType::kFloat32;
  t.shape = {t.numel};
  return t;
}

// Runs `body` on n thread ranks, each holding a Runtime over its own handle on the world (split
// off it, as the runtime owns its communicator); with config.local_size 0 the world is one node.
// An exception that escapes `body` on some rank fails the case.
void on_runtimes(Failures& f, const std::string& label, int n, const RuntimeConfig& config,
                 const std::function<void(Runtime&)>& body) {
  f.ran();
  ThreadWorld world(n, kHangS);
  const std::vector<std::string> failed = world.run([&](Communicator& comm) {
    Runtime rt(comm.split(0, comm.rank()), config, nullptr);
    body(rt);
  });
  for (int r = 0; r < n; ++r) f.check(failed[r].empty(), str(label, ": rank ", r, " of ", n, " threw ", failed[r]));
}

RuntimeConfig config_of(int local_size) {
  RuntimeConfig c;
  c.timeout_s = kTimeoutS;
  c.local_size = local_size;
  return c;
}

// Checks that `got` has `type` and contains `needle`.
void expect_outcome(Failures& f, const std::string& what, const Outcome& got, const std::string& type,
                    const std::string& needle) {
  f.check(got.type == type && got.message.find(needle) != std::string::npos,
          what + ": expected " + (type.empty() ? "no error" : type) + " saying '" + needle + "', got " +
              got.type + " '" + got.message + "'");
}

void start_up(Failures& f, int n) {
  for (int local : {0, 1, 2}) {
    const std::string label = str("start-up, ", n, " ranks, local size ", local);
    on_runtimes(f, label, n, config_of(local), [&](Runtime& rt) {
      const int r = rt.rank();
      const int node = local == 0 ? n : std::min(local, n - r / local * local);
      const std::string what = str(label, ": rank ", r);
      f.check(rt.size() == n, str(what, ": size ", rt.size()));
      f.check(rt.node_size() == node, str(what, ": node of ", rt.node_size(), ", want ", node));
      const CommStats s = rt.stats();
      f.check(s.bytes_sent == 0 && s.bytes_received == 0 && s.calls == 0,
              str(what, ": start-up counted ", s.bytes_sent, "/", s.bytes_received, " bytes, ", s.calls, " calls"));
    });
  }
  // One rank's invalid settings: the constructor raises on every rank.
  const int bad = n - 1;
  const std::string label = str("invalid settings on rank ", bad, " of ", n);
  std::vector<Outcome> got(n);
  f.ran();
  ThreadWorld world(n, kHangS);
  const std::vector<std::string> failed = world.run([&](Communicator& comm) {
    RuntimeConfig c = config_of(0);
    if (comm.rank() == bad) c.invalid = "HVDC_LOCAL_SIZE=x is not a number";
    got[comm.rank()] = attempt([&] { Runtime rt(comm.split(0, comm.rank()), c, nullptr); });
  });
  for (int r = 0; r < n; ++r) {
    f.check(failed[r].empty(), str(label, ": rank ", r, " threw ", failed[r]));
    expect_outcome(f, str(label, ": rank ", r), got[r], "UsageError",
                   str("rank ", bad, " rejected its input: HVDC_LOCAL_SIZE=x is not a number"));
  }
}

void counting(Failures& f, int n) {
  const std::string label = str("counting, ", n, " ranks");
  on_runtimes(f, label, n, config_of(0), [&](Runtime& rt) {
    const int r = rt.rank();
    const std::string what = str(label, ": rank ", r);
    const uint64_t sig = kSig * (n - 1);
    std::vector<float> x(1000, static_cast<float>(r + 1));
    const CommStats sum = rt.allreduce(f32_view(x), ReduceOp::kSum, "x");
    const float want = static_cast<float>(n * (n + 1) / 2);
    f.check(x[0] == want && x[999] == want, str(what, ": sum ", x[0], ", want ", want));
    const uint64_t ring = ring_allreduce_bytes(4000, n);
    f.check(sum.calls == 1 && sum.bytes_sent == sig + ring && sum.bytes_received == sig + ring,
            str(what, ": allreduce counted ", sum.bytes_sent, "/", sum.bytes_received, " bytes, ", sum.calls,
                " calls; want ", sig + ring, " each way, 1 call"));

    const int root = n - 1;
    std::vector<float> y(10, static_cast<float>(r));
    const CommStats bc = rt.broadcast(f32_view(y), root, "y");
    f.check(y[0] == root && y[9] == root, str(what, ": broadcast gave ", y[0], ", want ", root));
    const uint64_t out = sig + (r == root ? 40 * (n - 1) : 0), in = sig + (r == root ? 0 : 40);
    f.check(bc.calls == 1 && bc.bytes_sent == out && bc.bytes_received == in,
            str(what, ": broadcast counted ", bc.bytes_sent, "/", bc.bytes_received, " bytes, want ", out, "/", in));

    const CommStats total = rt.stats();
    f.check(total.calls == 2 && total.bytes_sent == sum.bytes_sent + bc.bytes_sent &&
                total.bytes_received == sum.bytes_received + bc.bytes_received,
            str(what, ": stats() ", total.bytes_sent, "/", total.bytes_received, " bytes, ", total.calls,
                " calls; not the sum of the calls"));
    rt.reset_stats();
    f.check(rt.stats().calls == 0 && rt.stats().bytes_sent == 0, what + ": reset_stats() left counts");
  });
}

// Rank `odd` calls with different arguments: every rank raises MismatchError naming `field`, no
// buffer changes, and the exchange (but no call) is counted.
void mismatch(Failures& f, int n, int odd, const std::string& field,
              const std::function<void(Runtime&, std::vector<float>&, bool odd)>& call) {
  const std::string label = str("mismatched ", field, " on rank ", odd, " of ", n);
  on_runtimes(f, label, n, config_of(1), [&](Runtime& rt) {
    const int r = rt.rank();
    const std::string what = str(label, ": rank ", r);
    std::vector<float> x(64, 0.5f + r);
    const std::vector<float> x0 = x;
    expect_outcome(f, what, attempt([&] { call(rt, x, r == odd); }), "MismatchError", field + ":");
    f.check(x == x0, what + ": buffer changed");
    const CommStats s = rt.stats();
    f.check(s.calls == 0 && s.bytes_sent == kSig * (n - 1) && s.bytes_received == kSig * (n - 1),
            str(what, ": counted ", s.bytes_sent, "/", s.bytes_received, " bytes, ", s.calls, " calls"));
  });
}

void mismatches(Failures& f, int n) {
  mismatch(f, n, 0, "op", [](Runtime& rt, std::vector<float>& x, bool odd) {
    rt.allreduce(f32_view(x), odd ? ReduceOp::kMax : ReduceOp::kSum, "x");
  });
  mismatch(f, n, n - 1, "numel", [](Runtime& rt, std::vector<float>& x, bool odd) {
    TensorView t = f32_view(x);
    if (odd) t.numel = t.shape[0] = 63;
    rt.allreduce(t, ReduceOp::kSum, "x");
  });
  // The hierarchical mode rides in the op field: ranks never join different communicators.
  mismatch(f, n, n / 2, "op", [](Runtime& rt, std::vector<float>& x, bool odd) {
    rt.adasum(f32_view(x), {static_cast<int64_t>(x.size())}, odd, "x");
  });
}

// Rank `bad` rejects its input to a call the others make correctly: every rank raises UsageError
// naming it and `why`, no buffer changes, and a later call works.
void rejection(Failures& f, int n, int bad, const std::string& why,
               const std::function<void(Runtime&, std::vector<float>&, bool bad)>& call) {
  const std::string label = str("rank ", bad, " of ", n, " rejects (", why, ")");
  on_runtimes(f, label, n, config_of(0), [&](Runtime& rt) {
    const int r = rt.rank();
    const std::string what = str(label, ": rank ", r);
    std::vector<float> x(64, 0.5f + r);
    const std::vector<float> x0 = x;
    expect_outcome(f, what, attempt([&] { call(rt, x, r == bad); }), "UsageError",
                   str("rank ", bad, " rejected its input: ", why));
    f.check(x == x0, what + ": buffer changed");
    f.check(rt.stats().calls == 0, what + ": a rejected call was counted");
    std::vector<float> y(8, 1.0f);
    expect_outcome(f, what + ", the call after", attempt([&] { rt.allreduce(f32_view(y), ReduceOp::kSum, "y"); }),
                   "", "");
    f.check(y[0] == n, str(what, ": the call after gave ", y[0], ", want ", n));
  });
}

void rejections(Failures& f, int n) {
  rejection(f, n, n - 1, "broadcast root", [n](Runtime& rt, std::vector<float>& x, bool bad) {
    rt.broadcast(f32_view(x), bad ? n : 0, "x");
  });
  rejection(f, n, 0, "Adasum: tensor sizes", [](Runtime& rt, std::vector<float>& x, bool bad) {
    rt.adasum(f32_view(x), {32, bad ? 31 : 32}, false, "x");
  });
  // A rank whose tensor is in CUDA memory (a hand-made DLPack tensor): the translation refuses it,
  // the binding's pattern (views_or_reject) joins the call as a rejecting rank, every rank raises.
  rejection(f, n, n - 1, "x: tensor is on cuda:1", [](Runtime& rt, std::vector<float>& x, bool bad) {
    const int64_t shape[1] = {static_cast<int64_t>(x.size())};
    DLPackFields t;
    t.data = x.data();
    t.device_type = bad ? kDLCUDA : kDLCPU;
    t.device_id = 1;
    t.ndim = 1;
    t.shape = shape;
    TensorView v;
    try {
      v = dlpack_view(t, "x");
    } catch (const UsageError& e) {
      rt.reject(kAllreduce, e.what(), "x");
    }
    rt.allreduce(v, ReduceOp::kSum, "x");
  });
  rejection(f, n, n / 2, "tensor is not contiguous", [](Runtime& rt, std::vector<float>& x, bool bad) {
    if (bad) rt.reject(kAllreduce, "tensor is not contiguous", "x");
    rt.allreduce(f32_view(x), ReduceOp::kSum, "x");
  });
}

// Rank `absent` never calls: the others raise CommTimeoutError, then at once on the next call.
void timeout(Failures& f, int n, int absent) {
  const std::string label = str("rank ", absent, " of ", n, " absent");
  on_runtimes(f, label, n, config_of(0), [&](Runtime& rt) {
    const int r = rt.rank();
    if (r == absent) return;
    const std::string what = str(label, ": rank ", r);
    rt.set_timeout(0.2);
    std::vector<float> x(8, 1.0f);
    expect_outcome(f, what, attempt([&] { rt.allreduce(f32_view(x), ReduceOp::kSum, "x"); }),
                   "CommTimeoutError", str("rank ", r, " waited"));
    const Outcome after = attempt([&] { rt.allreduce(f32_view(x), ReduceOp::kSum, "x"); });
    expect_outcome(f, what + ", the call after", after, "CommTimeoutError", "must be restarted");
    // ... naming the first failure, not a generic timeout
    expect_outcome(f, what + ", the call after", after, "CommTimeoutError",
                   str("an earlier collective failed (x: rank ", r, " waited"));
  });
}

// join() on every rank returns; rank `early` in join() while the others allreduce (it ran out of data
// first) makes every rank raise MismatchError naming it, buffers unchanged, and a later call works.
void joins(Failures& f, int n, int early) {
  const std::string label = str("join() on rank ", early, " of ", n, " alone");
  on_runtimes(f, label, n, config_of(0), [&](Runtime& rt) {
    const int r = rt.rank();
    const std::string what = str(label, ": rank ", r);
    expect_outcome(f, str("join() on every rank of ", n, ": rank ", r), attempt([&] { rt.join(); }), "", "");
    std::vector<float> x(64, 0.5f + r);
    const std::vector<float> x0 = x;
    expect_outcome(f, what, attempt([&] {
                     if (r == early) rt.join();
                     else rt.allreduce(f32_view(x), ReduceOp::kSum, "grad");
                   }),
                   "MismatchError", str("rank(s) ", early, " called join() while the others"));
    f.check(x == x0, what + ": buffer changed");
    std::vector<float> y(8, 1.0f);
    expect_outcome(f, what + ", the call after", attempt([&] { rt.allreduce(f32_view(y), ReduceOp::kSum, "y"); }),
                   "", "");
    f.check(y[0] == n, str(what, ": the call after gave ", y[0], ", want ", n));
  });
}

}  // namespace
}  // namespace hvdc

int main() {
  hvdc::Failures f;
  for (int n = 1; n <= 5; ++n) {
    hvdc::start_up(f, n);
    hvdc::counting(f, n);
    if (n > 1) hvdc::mismatches(f, n);
    hvdc::rejections(f, n);
    if (n > 1) hvdc::joins(f, n, n - 1);
    if (n > 1) {
      hvdc::timeout(f, n, n - 1);
      hvdc::timeout(f, n, 0);
    }
  }
  return f.finish("test_runtime");
}
