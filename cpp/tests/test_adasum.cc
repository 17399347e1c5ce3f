// adasum_rvh and adasum_hierarchical (cpp/src/adasum.cc) on n = 1..5 thread ranks against
// hvd_compress/reference/adasum.py, element by element, within core_tolerance of that module
// (computed by make_fixtures.py; tests/test_adasum.py uses the same): the core and the reference
// run the same float64 operations except for the order of the dot-product sums, so a stored value
// may round the other way once per combine step. Covers the power-of-two levels, the fold of
// non-power-of-two rank counts, per-tensor coefficients of a grouped buffer (including an empty
// tensor), a zero vector, every storage dtype, hierarchical mode over split node groups, the reuse
// of one plan by a second call, identical bits on every rank, and byte conservation in the stats.
//
// Usage: test_adasum FIXTURES (written by cpp/tests/make_fixtures.py).
#include <cstdint>
#include <string>
#include <vector>

#include "check.h"
#include "fixtures.h"
#include "hvdc/adasum.h"
#include "thread_communicator.h"

namespace hvdc {
namespace {

// A rank that waits this long for a peer is deadlocked: fail instead of hanging `make test`.
constexpr double kHangS = 60;

struct Case {
  int n = 0;
  DType dtype = DType::kFloat32;
  int local = 0;  // node size of hierarchical mode; 0: flat adasum_rvh
  std::vector<int64_t> sizes;
};

Case parse(const std::vector<double>& meta) {
  Case c;
  c.n = static_cast<int>(meta.at(0));
  c.dtype = static_cast<DType>(static_cast<int>(meta.at(1)));
  c.local = static_cast<int>(meta.at(2));
  for (size_t i = 3; i < meta.size(); ++i) c.sizes.push_back(static_cast<int64_t>(meta[i]));
  return c;
}

void run_case(Failures& f, const Fixtures& fx, const std::string& name) {
  const std::string base = "adasum/" + name;
  const Case c = parse(fx.at(base + "/meta"));
  const std::vector<double>& want = fx.at(base + "/out");
  const std::vector<double>& tol = fx.at(base + "/tol");
  int64_t numel = 0;
  for (int64_t s : c.sizes) numel += s;
  const int calls = c.local ? 1 : 2;  // flat: a second call on the same plan (its scratch reused)
  // results[call][rank], and the bytes each rank's communicators counted.
  std::vector<std::vector<std::vector<double>>> results(calls, std::vector<std::vector<double>>(c.n));
  std::vector<CommStats> stats(static_cast<size_t>(c.n));

  ThreadWorld world(c.n, kHangS);
  const std::vector<std::string> failed = world.run([&](Communicator& comm) {
    const int r = comm.rank();
    std::vector<unsigned char> buf;
    auto view = [&] {
      buf = to_dtype(fx.at(base + "/in/" + std::to_string(r)), c.dtype);
      TensorView v;
      v.data = buf.data();
      v.numel = numel;
      v.dtype = c.dtype;
      return v;
    };
    if (c.local == 0) {
      AdasumPlan plan(comm);
      for (int call = 0; call < calls; ++call) {
        adasum_rvh(plan, view(), c.sizes);
        results[call][r] = to_double(buf.data(), c.dtype, numel);
      }
      const CommStats levels = plan.take_stats();
      stats[r] = comm.stats();
      stats[r].add(levels.bytes_sent, levels.bytes_received);
    } else {
      // Nodes of `local` consecutive ranks, as Runtime splits them for HVDC_LOCAL_SIZE.
      HierarchicalAdasumPlan plan(comm, comm.split(r / c.local, r));
      adasum_hierarchical(plan, view(), c.sizes);
      results[0][r] = to_double(buf.data(), c.dtype, numel);
      stats[r] = comm.stats();
      const CommStats groups = plan.take_stats();
      stats[r].add(groups.bytes_sent, groups.bytes_received);
    }
  });
  f.ran();
  for (int r = 0; r < c.n; ++r)
    if (!f.check(failed[r].empty(), str(name, ": rank ", r, " of ", c.n, " threw: ", failed[r])))
      return;
  for (int call = 0; call < calls; ++call)
    for (int r = 0; r < c.n; ++r) {
      const std::string what = str(name, " call ", call, ": rank ", r, " of ", c.n);
      check_close(f, what, results[call][r], want, [&](size_t i) { return tol[i]; });
      // The allgather and the fold-out hand the same stored values to every rank.
      f.check(same_bits(results[call][r], results[call][0]), what + ": differs from rank 0");
    }
  uint64_t sent = 0, received = 0;
  for (const CommStats& s : stats) {
    sent += s.bytes_sent;
    received += s.bytes_received;
  }
  f.check(sent == received, str(name, ": ranks sent ", sent, " bytes and received ", received));
  f.check(c.n == 1 || numel == 0 || sent > 0, str(name, ": no bytes counted"));
}

}  // namespace
}  // namespace hvdc

int main(int argc, char** argv) {
  return hvdc::run_fixture_cases(argc, argv, "test_adasum", "adasum", 100, hvdc::run_case);
}
