// block_quant_allreduce (cpp/src/block_quant_allreduce.cc: the int8/int4 outer gradients of op=DiLoCo's
// outer_compression, Streaming DiLoCo arXiv 2501.18512 Section 2.4) on 1..4 thread ranks against a
// straightforward model of its rule written here, element by element: per rank c = x + error, quantized in
// blocks of 64 (s = max |c| / Q, q = rint(c / s) clamped to [-Q, Q], value q * s), error = c - value; each
// chunk's values summed over the ranks in rank order in float32, divided by n for Average, quantized once;
// every rank gets the dequantized result. Checked bit for bit: the result (the same on every rank) and each
// rank's new error, over three calls in a row (errors carried), for int8 and int4, Average and Sum, sizes that
// pad a chunk and that do not, with and without an error buffer; and the bytes the communicator counts. Also
// the input check: a non-finite compensated value is refused with its element.
//
// Usage: test_block_quant_allreduce [FIXTURES] (no fixture is read: the model is the expectation).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "check.h"
#include "hvdc/block_quant_allreduce.h"
#include "hvdc/device.h"
#include "thread_communicator.h"

namespace hvdc {
namespace {

constexpr double kHangS = 60;  // a rank that waits this long is deadlocked: fail, do not hang
constexpr int64_t kBlock = 64;

TensorView view_of(float* data, int64_t numel) {
  TensorView v;
  v.data = data;
  v.numel = data != nullptr ? numel : 0;
  v.dtype = DType::kFloat32;
  return v;
}

// The model: x (a whole padded buffer, a multiple of 64) quantized block by block and dequantized.
std::vector<float> model_quantize(const std::vector<float>& x, int bits) {
  const float levels = bits == 8 ? 127.0f : 7.0f;
  std::vector<float> out(x.size());
  for (size_t b = 0; b < x.size(); b += kBlock) {
    float amax = 0.0f;
    for (size_t i = b; i < b + kBlock; ++i) amax = std::fabs(x[i]) > amax ? std::fabs(x[i]) : amax;
    const float s = amax / levels;
    for (size_t i = b; i < b + kBlock; ++i) {
      float q = s == 0.0f ? 0.0f : std::nearbyint(x[i] / s);
      q = q > levels ? levels : (q < -levels ? -levels : q);
      out[i] = static_cast<float>(static_cast<int>(q)) * s;  // an integer code: rint's -0 travels as 0
    }
  }
  return out;
}

// The model of one call over every rank's (x, error): the result and the new errors.
void model_allreduce(std::vector<std::vector<float>>& xs, std::vector<std::vector<float>>* errors, int bits,
                     bool average) {
  const int n = static_cast<int>(xs.size());
  const int64_t numel = static_cast<int64_t>(xs[0].size());
  const int64_t chunk = ((numel + n - 1) / n + kBlock - 1) / kBlock * kBlock;
  const int64_t padded = chunk * n;
  std::vector<float> sum(static_cast<size_t>(padded), 0.0f);
  for (int r = 0; r < n; ++r) {
    std::vector<float> c(static_cast<size_t>(padded), 0.0f);
    for (int64_t i = 0; i < numel; ++i) c[i] = errors != nullptr ? xs[r][i] + (*errors)[r][i] : xs[r][i];
    const std::vector<float> sent = model_quantize(c, bits);
    if (errors != nullptr)
      for (int64_t i = 0; i < numel; ++i) (*errors)[r][i] = c[i] - sent[i];
    for (int64_t i = 0; i < padded; ++i) sum[i] += sent[i];
  }
  if (average && n > 1)
    for (float& v : sum) v /= static_cast<float>(n);
  const std::vector<float> result = model_quantize(sum, bits);
  for (int r = 0; r < n; ++r) xs[r].assign(result.begin(), result.begin() + numel);
}

std::vector<float> inputs(int rank, int call, int64_t numel, float spread) {
  std::vector<float> x(static_cast<size_t>(numel));
  uint32_t state = 2654435761u * static_cast<uint32_t>(rank + 1) + 40503u * static_cast<uint32_t>(call + 7);
  for (float& v : x) {
    state = state * 1664525u + 1013904223u;
    const float u = static_cast<float>(state >> 8) / 16777216.0f - 0.5f;  // [-0.5, 0.5)
    v = u * spread * (1.0f + static_cast<float>((state >> 3) % 5));
  }
  if (numel > 70) std::fill(x.begin() + 64, x.begin() + 70, 0.0f);  // part of a block of zeros
  return x;
}

bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

std::string first_difference(const std::vector<float>& got, const std::vector<float>& want) {
  for (size_t i = 0; i < got.size() && i < want.size(); ++i)
    if (std::memcmp(&got[i], &want[i], sizeof(float)) != 0)
      return str("element ", i, ": got ", got[i], ", want ", want[i]);
  return str(got.size(), " elements, want ", want.size());
}

void matches_model(Failures& f, int n, int bits, bool average, int64_t numel, bool with_error) {
  constexpr int kCalls = 3;
  const std::string name = str("int", bits, average ? " Average" : " Sum", " of ", numel, " at n=", n,
                               with_error ? "" : " without error");
  std::vector<std::vector<std::vector<float>>> got(kCalls, std::vector<std::vector<float>>(n));
  std::vector<std::vector<std::vector<float>>> got_error(kCalls, std::vector<std::vector<float>>(n));
  std::vector<CommStats> stats(static_cast<size_t>(n));
  ThreadWorld world(n, kHangS);
  const std::vector<std::string> failed = world.run([&](Communicator& comm) {
    const int r = comm.rank();
    std::vector<float> error(static_cast<size_t>(numel), 0.0f);
    for (int call = 0; call < kCalls; ++call) {
      std::vector<float> x = inputs(r, call, numel, call == 2 ? 1e-3f : 4.0f);
      const TensorView e = view_of(with_error ? error.data() : nullptr, numel);
      const std::string why = block_quant_check_input(view_of(x.data(), numel), e, bits,
                                                      average ? ReduceOp::kAverage : ReduceOp::kSum);
      f.check(why.empty(), name + ": refused: " + why);
      block_quant_allreduce_prepared(comm, cpu_device(KernelChoice::kAuto), view_of(x.data(), numel), e, bits,
                                     average ? ReduceOp::kAverage : ReduceOp::kSum);
      got[call][r] = x;
      got_error[call][r] = error;
    }
    stats[r] = comm.stats();
  });
  f.ran();
  for (int r = 0; r < n; ++r)
    if (!f.check(failed[r].empty(), str(name, ": rank ", r, " threw: ", failed[r]))) return;
  std::vector<std::vector<float>> errors(n, std::vector<float>(static_cast<size_t>(numel), 0.0f));
  bool lost = false;
  for (int call = 0; call < kCalls; ++call) {
    std::vector<std::vector<float>> xs;
    for (int r = 0; r < n; ++r) xs.push_back(inputs(r, call, numel, call == 2 ? 1e-3f : 4.0f));
    model_allreduce(xs, with_error ? &errors : nullptr, bits, average);
    for (int r = 0; r < n; ++r) {
      const std::string what = str(name, ", call ", call, ", rank ", r);
      f.check(same_bits(got[call][r], xs[r]), what + ": result " + first_difference(got[call][r], xs[r]));
      if (with_error) {
        f.check(same_bits(got_error[call][r], errors[r]),
                what + ": error " + first_difference(got_error[call][r], errors[r]));
        for (float v : errors[r]) lost = lost || v != 0.0f;
      }
    }
  }
  // Not vacuous: quantization lost something the error carries.
  if (with_error) f.check(lost, name + ": the model's error is zero everywhere");
  const int64_t chunk = ((numel + n - 1) / n + kBlock - 1) / kBlock * kBlock;
  const uint64_t want = static_cast<uint64_t>(kCalls) * 2 * (n - 1) *
                        static_cast<uint64_t>(chunk / kBlock * (4 + kBlock * bits / 8));
  for (int r = 0; r < n; ++r)
    f.check(stats[r].bytes_sent == want && stats[r].bytes_received == want,
            str(name, ": rank ", r, " counted ", stats[r].bytes_sent, " bytes sent and ", stats[r].bytes_received,
                " received, want ", want, " each"));
}

void nonfinite_refused(Failures& f) {
  std::vector<float> x(100, 1.0f), e(100, 0.0f);
  e[77] = std::nanf("");
  const std::string why = block_quant_check_input(view_of(x.data(), 100), view_of(e.data(), 100), 8,
                                                  ReduceOp::kAverage);
  f.ran();
  f.check(why.find("non-finite input at element 77") != std::string::npos, "a NaN in the error: refused with '" +
          why + "'");
  const std::string bits = block_quant_check_input(view_of(x.data(), 100), view_of(nullptr, 0), 3,
                                                   ReduceOp::kAverage);
  f.check(!bits.empty(), "bits=3 accepted");
}

}  // namespace
}  // namespace hvdc

int main() {
  hvdc::Failures f;
  for (int n = 1; n <= 4; ++n)
    for (int bits : {8, 4})
      for (bool average : {true, false})
        for (int64_t numel : {int64_t{5}, int64_t{1000}, int64_t{64} * n})
          hvdc::matches_model(f, n, bits, average, numel, true);
  hvdc::matches_model(f, 3, 4, true, 300, false);
  hvdc::nonfinite_refused(f);
  return f.finish("test_block_quant_allreduce");
}
