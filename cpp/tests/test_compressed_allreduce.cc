// compressed_allreduce (cpp/src/compressed_allreduce.cc: the error-compensated 1-bit average of
// paper 003, Algorithm 1, lines 7-13) on n = 1..5 thread ranks against
// hvd_compress/reference/onebit.py: result, worker error and server error after each of three
// calls in a row (errors carried over), for float32, float16 and bfloat16 buffers with and without
// padding. Tolerance as tests/test_compressed_allreduce.py::_assert_close: 2^-22 of the largest
// expected magnitude (the reference orders its float64 sum of squares differently, which may move
// a float32 scale by one ulp in a rare tie; everything else is the same float32 arithmetic).
// Also: identical result bits on every rank, the bytes the communicator counts, and a non-finite
// input on one rank rejected on every rank through the signature exchange with every state
// unchanged (the protocol of onebit_bindings.cc). And the pipelined run (Communicator::isend/irecv,
// pieces of 32 to 1024 elements) against the unpipelined one at 2, 3 and 4 ranks: the same bytes
// of result, worker error and server error, and the same bytes counted, for the three dtypes with
// the AVX2 and the portable kernels.
//
// Usage: test_compressed_allreduce FIXTURES (written by cpp/tests/make_fixtures.py).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "check.h"
#include "fixtures.h"
#include "hvdc/compressed_allreduce.h"
#include "hvdc/errors.h"
#include "hvdc/signature.h"
#include "thread_communicator.h"

namespace hvdc {
namespace {

constexpr double kHangS = 60;  // a rank that waits this long is deadlocked: fail, do not hang

TensorView view_of(void* data, int64_t numel, DType dtype) {
  TensorView v;
  v.data = data;
  v.numel = numel;
  v.dtype = dtype;
  return v;
}

double tolerance(const std::vector<double>& want) {
  double top = 1e-30;
  for (double v : want) top = std::max(top, std::fabs(v));
  return std::ldexp(1.0, -22) * top;
}

void run_case(Failures& f, const Fixtures& fx, const std::string& name) {
  const std::string base = "onebit/" + name;
  const std::vector<double>& meta = fx.at(base + "/meta");
  const int n = static_cast<int>(meta.at(0));
  const auto dtype = static_cast<DType>(static_cast<int>(meta.at(1)));
  const auto numel = static_cast<int64_t>(meta.at(2));
  const int calls = static_cast<int>(meta.at(3));
  const int64_t server_numel = onebit_padded_numel(numel, n) / n;
  // got[call][rank] = {result, worker error, server error}
  std::vector<std::vector<std::vector<std::vector<double>>>> got(
      calls, std::vector<std::vector<std::vector<double>>>(n));
  std::vector<CommStats> stats(static_cast<size_t>(n));

  ThreadWorld world(n, kHangS);
  const std::vector<std::string> failed = world.run([&](Communicator& comm) {
    const int r = comm.rank();
    std::vector<float> werr(static_cast<size_t>(numel), 0.0f);
    std::vector<float> serr(static_cast<size_t>(server_numel), 0.0f);
    for (int call = 0; call < calls; ++call) {
      std::vector<unsigned char> buf =
          to_dtype(fx.at(str(base, "/", call, "/in/", r)), dtype);
      compressed_allreduce(comm, view_of(buf.data(), numel, dtype),
                           view_of(werr.data(), numel, DType::kFloat32),
                           view_of(serr.data(), server_numel, DType::kFloat32));
      got[call][r] = {to_double(buf.data(), dtype, numel),
                      to_double(werr.data(), DType::kFloat32, numel),
                      to_double(serr.data(), DType::kFloat32, server_numel)};
    }
    stats[r] = comm.stats();
  });
  f.ran();
  for (int r = 0; r < n; ++r)
    if (!f.check(failed[r].empty(), str(name, ": rank ", r, " of ", n, " threw: ", failed[r])))
      return;
  for (int call = 0; call < calls; ++call) {
    const std::vector<double>& out = fx.at(str(base, "/", call, "/out"));
    const double out_tol = tolerance(out);
    for (int r = 0; r < n; ++r) {
      const std::string what = str(name, " call ", call, ": rank ", r, " of ", n);
      const std::vector<double>& werr = fx.at(str(base, "/", call, "/werr/", r));
      const std::vector<double>& serr = fx.at(str(base, "/", call, "/serr/", r));
      const double werr_tol = tolerance(werr), serr_tol = tolerance(serr);
      check_close(f, what + " result", got[call][r][0], out, [&](size_t) { return out_tol; });
      check_close(f, what + " worker error", got[call][r][1], werr,
                  [&](size_t) { return werr_tol; });
      // Includes the padding positions, which the reference keeps at 0 and the core never writes.
      check_close(f, what + " server error", got[call][r][2], serr,
                  [&](size_t) { return serr_tol; });
      f.check(same_bits(got[call][r][0], got[call][0][0]), what + ": result differs from rank 0's");
    }
  }
  // Per call: one alltoall and one allgather of blocks [float32 scale][C / 8 bytes of bits].
  const uint64_t block = sizeof(float) + static_cast<uint64_t>(server_numel / 8);
  const uint64_t want_bytes = static_cast<uint64_t>(calls) * 2 * (n - 1) * block;
  for (int r = 0; r < n; ++r)
    f.check(stats[r].bytes_sent == want_bytes && stats[r].bytes_received == want_bytes,
            str(name, ": rank ", r, " of ", n, " counted ", stats[r].bytes_sent, " bytes sent and ",
                stats[r].bytes_received, " received, want ", want_bytes, " each"));
}

// A NaN on the last rank: every rank agrees (onebit_prepare's reason rides in the signature, as
// in onebit_bindings.cc) and throws UsageError naming that rank and element; no buffer changes.
void nonfinite_rejected_everywhere(Failures& f, int n) {
  const int64_t numel = 100;
  const int64_t server_numel = onebit_padded_numel(numel, n) / n;
  ThreadWorld world(n, kHangS);
  const std::vector<std::string> failed = world.run([&](Communicator& comm) {
    const int r = comm.rank();
    const std::string what = str("non-finite input at n=", n, ": rank ", r);
    std::vector<float> x(numel, 1.5f), werr(numel, 0.25f), serr(server_numel, -0.5f);
    if (r == n - 1) x[5] = std::numeric_limits<float>::quiet_NaN();
    const std::vector<float> x0 = x, werr0 = werr, serr0 = serr;
    const TensorView buf = view_of(x.data(), numel, DType::kFloat32);
    CallSignature sig = signature_of(kCompressedAllreduce, buf, 0, "nan");
    OneBitCall call;
    const std::string why =
        onebit_prepare(buf, view_of(werr.data(), numel, DType::kFloat32),
                       view_of(serr.data(), server_numel, DType::kFloat32), n, call);
    std::snprintf(sig.error, sizeof(sig.error), "%s", why.c_str());
    std::string message;
    try {
      agree_on_signature(comm, sig, 30, "compressed_allreduce");
      compressed_allreduce_prepared(comm, call);
    } catch (const UsageError& e) {
      message = e.what();
    }
    f.check(message.find(str("rank ", n - 1, " rejected")) != std::string::npos &&
                message.find("element 5 is nan") != std::string::npos,
            what + ": expected UsageError naming the rank and element, got '" + message + "'");
    f.check(std::memcmp(x.data(), x0.data(), sizeof(float) * numel) == 0, what + ": buffer changed");
    f.check(werr == werr0 && serr == serr0, what + ": error buffers changed");
  });
  f.ran();
  for (int r = 0; r < n; ++r)
    f.check(failed[r].empty(), str("non-finite input at n=", n, ": rank ", r, " threw ", failed[r]));
}

// Deterministic test values: mostly moderate, with zeros of both signs and a few large ones
// (finite in float16), so that signs, ties at 0 and scales all get exercised.
struct Lcg {
  uint64_t s;
  uint32_t next() {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<uint32_t>(s >> 33);
  }
  float value() {
    const uint32_t kind = next() % 32;
    const float u = static_cast<float>(next() >> 8) * (1.0f / 16777216.0f) - 0.5f;
    if (kind == 0) return 0.0f;
    if (kind == 1) return -0.0f;
    if (kind == 2) return u * 3e4f;
    return u * 4.0f;
  }
};

// One rank's state after `calls` calls in a row: the buffer's bytes, worker and server error.
struct RankRun {
  std::vector<unsigned char> buf;
  std::vector<float> werr, serr;
  CommStats stats;
};

std::vector<RankRun> run_calls(Failures& f, const std::string& what, int n, int64_t numel,
                               DType dtype, KernelChoice kernels, OneBitPipeline pipeline,
                               int calls) {
  const int64_t server_numel = onebit_padded_numel(numel, n) / n;
  std::vector<RankRun> runs(static_cast<size_t>(n));
  ThreadWorld world(n, kHangS);
  const std::vector<std::string> failed = world.run([&](Communicator& comm) {
    const int r = comm.rank();
    RankRun& run = runs[r];
    Lcg rng{static_cast<uint64_t>(r) * 7919 + static_cast<uint64_t>(numel) * 31 + 5};
    run.werr.assign(static_cast<size_t>(numel), 0.0f);
    run.serr.assign(static_cast<size_t>(server_numel), 0.0f);
    for (float& e : run.werr) e = 0.1f * rng.value();
    for (float& e : run.serr) e = 0.1f * rng.value();
    for (int call = 0; call < calls; ++call) {
      std::vector<double> in(static_cast<size_t>(numel));
      for (double& v : in) v = rng.value();
      run.buf = to_dtype(in, dtype);
      compressed_allreduce(comm, view_of(run.buf.data(), numel, dtype),
                           view_of(run.werr.data(), numel, DType::kFloat32),
                           view_of(run.serr.data(), server_numel, DType::kFloat32), kernels,
                           pipeline);
    }
    run.stats = comm.stats();
  });
  for (int r = 0; r < n; ++r)
    f.check(failed[r].empty(), str(what, ": rank ", r, " threw: ", failed[r]));
  return runs;
}

// The pipelined run (pieces of `piece` elements, also ones that do not divide the chunk) against
// the unpipelined one: the same result, worker error and server error bytes on every rank after
// three calls in a row, and the same bytes counted.
void pipelined_matches_unpipelined(Failures& f) {
  const DType dtypes[] = {DType::kFloat32, DType::kFloat16, DType::kBFloat16};
  const KernelChoice choices[] = {KernelChoice::kAuto, KernelChoice::kScalar};
  for (int n : {2, 3, 4})
    for (DType dtype : dtypes)
      for (KernelChoice kernels : choices)
        for (int64_t numel : {int64_t{1}, int64_t{37}, int64_t{1000}, int64_t{4099},
                              int64_t{20000}, int64_t{33333}})
          for (int64_t piece : {int64_t{32}, int64_t{96}, int64_t{1024}}) {
            if (piece == 32 && numel > 5000) continue;  // thousands of messages: slow, no news
            const std::string what =
                str("pipelined n=", n, " ", dtype_name(dtype), " numel=", numel,
                    " piece=", piece, kernels == KernelChoice::kScalar ? " scalar" : " auto");
            f.ran();
            const std::vector<RankRun> want =
                run_calls(f, what + " (unpipelined)", n, numel, dtype, kernels,
                          OneBitPipeline{0, 0}, 3);
            const std::vector<RankRun> got =
                run_calls(f, what, n, numel, dtype, kernels, OneBitPipeline{piece, 0}, 3);
            for (int r = 0; r < n; ++r) {
              const std::string at = str(what, ": rank ", r);
              f.check(got[r].buf == want[r].buf, at + ": result bytes differ");
              f.check(std::memcmp(got[r].werr.data(), want[r].werr.data(),
                                  sizeof(float) * want[r].werr.size()) == 0,
                      at + ": worker error bits differ");
              f.check(std::memcmp(got[r].serr.data(), want[r].serr.data(),
                                  sizeof(float) * want[r].serr.size()) == 0,
                      at + ": server error bits differ");
              f.check(got[r].stats.bytes_sent == want[r].stats.bytes_sent &&
                          got[r].stats.bytes_received == want[r].stats.bytes_received,
                      str(at, ": counted ", got[r].stats.bytes_sent, "/",
                          got[r].stats.bytes_received, " bytes sent/received, unpipelined ",
                          want[r].stats.bytes_sent, "/", want[r].stats.bytes_received));
            }
          }
}

}  // namespace
}  // namespace hvdc

int main(int argc, char** argv) {
  return hvdc::run_fixture_cases(argc, argv, "test_compressed_allreduce", "onebit", 75,
                                 hvdc::run_case, [](hvdc::Failures& f) {
                                   for (int n = 1; n <= 5; ++n)
                                     hvdc::nonfinite_rejected_everywhere(f, n);
                                   hvdc::pipelined_matches_unpipelined(f);
                                 });
}
