// 1-bit LAMB's fused passes (hvdc/onebit_lamb_kernels.h, paper 001 Alg. 1 lines 14-17 and 20-21) against
// plain float32 loops that take the backend path's steps one whole-array pass at a time (torch's fmadd as
// std::fma), bit for bit, on the AVX2 and the portable implementation, at lengths around the 8-lane
// vectors; with and without the variance floor, bias correction and weight decay; a NaN reaching the max.
#pragma GCC optimize("fp-contract=off")
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

#include "check.h"
#include "sample_values.h"
#include "hvdc/kernel_isa.h"
#include "hvdc/onebit_lamb_kernels.h"

namespace hvdc {
namespace {

struct Case {
  float sqrt_bc2, floor, bc1, wd;
};

void check_length(Failures& f, int64_t n, KernelChoice choice, const Case& c, bool with_nan) {
  const char* isa = choice == KernelChoice::kScalar ? "scalar" : "auto";
  const float b1 = 0.9f, b2 = 0.999f, eps = 1e-6f;
  const float neg_b1 = static_cast<float>(-0.9), omb1 = static_cast<float>(1.0 - 0.9);
  const float omb2 = static_cast<float>(1.0 - 0.999);
  (void)b1;
  const std::vector<float> work = sample_values(n, 0.5f, 1), m0 = sample_values(n, 0.4f, 2),
                           x0 = sample_values(n, 1.5f, 3);
  std::vector<float> fresh0 = sample_values(n, 0.03f, 4), denom = sample_values(n, 0.02f, 5);
  for (float& e : fresh0) e = e * e;                  // v >= 0
  for (float& e : denom) e = std::fabs(e) + 1e-3f;    // d = max(sqrt(vh), floor) + eps > 0
  if (with_nan && n > 3) fresh0[n / 2] = std::numeric_limits<float>::quiet_NaN();

  // The backend path, one whole-array step after the other (onebit_lamb.py's `compressed`).
  std::vector<float> g(n), fresh = fresh0, m = m0, s(n), r(n), x = x0, u(n);
  for (int64_t i = 0; i < n; ++i) g[i] = std::fma(m[i], neg_b1, work[i]);  // sub(alpha=b1): fmadd
  for (int64_t i = 0; i < n; ++i) g[i] = g[i] / omb1;
  for (int64_t i = 0; i < n; ++i) fresh[i] = fresh[i] * b2;
  for (int64_t i = 0; i < n; ++i) fresh[i] = std::fma(omb2 * g[i], g[i], fresh[i]);  // addcmul_: fmadd
  for (int64_t i = 0; i < n; ++i) m[i] = work[i];
  for (int64_t i = 0; i < n; ++i) s[i] = std::sqrt(fresh[i]);
  for (int64_t i = 0; i < n; ++i) s[i] = s[i] / c.sqrt_bc2;
  for (int64_t i = 0; i < n; ++i) s[i] = std::isnan(s[i]) ? s[i] : std::max(s[i], c.floor);  // clamp_min_
  for (int64_t i = 0; i < n; ++i) s[i] = s[i] + eps;
  for (int64_t i = 0; i < n; ++i) r[i] = denom[i] / s[i];
  float want_max = -std::numeric_limits<float>::infinity();
  for (int64_t i = 0; i < n; ++i) want_max = std::isnan(want_max) || std::isnan(r[i]) ? NAN : std::max(want_max, r[i]);
  const float scale = -0.01f * 1.3f;
  for (int64_t i = 0; i < n; ++i) u[i] = m[i] / denom[i];
  for (int64_t i = 0; i < n; ++i) u[i] = u[i] / c.bc1;
  if (c.wd != 0.0f)
    for (int64_t i = 0; i < n; ++i) u[i] = std::fma(x[i], c.wd, u[i]);  // foreach_add_(alpha=wd): fmadd
  for (int64_t i = 0; i < n; ++i) u[i] = u[i] * scale;
  for (int64_t i = 0; i < n; ++i) x[i] = x[i] + u[i];

  const std::string what =
      str(isa, " n=", n, " sqrt_bc2=", c.sqrt_bc2, " floor=", c.floor, " bc1=", c.bc1, " wd=", c.wd, " nan=", with_nan);
  f.ran();
  std::vector<float> got_m = m0, got_fresh = fresh0, got_x = x0;
  const float got_max = onebit_lamb_moments(work.data(), denom.data(), n, neg_b1, omb1, b2, omb2, c.sqrt_bc2,
                                            c.floor, eps, got_m.data(), got_fresh.data(), choice);
  int bad = 0;
  for (int64_t i = 0; i < n && bad < 3; ++i) {
    const bool ok = same_bits(got_m[i], m[i]) && same_bits(got_fresh[i], fresh[i]);
    if (!f.check(ok, str("moments ", what, " i=", i, ": fresh ", got_fresh[i], " vs ", fresh[i]))) ++bad;
  }
  const bool max_ok = std::isnan(want_max) ? std::isnan(got_max) : same_bits(got_max, want_max);
  f.check(max_ok, str("moments max ", what, ": ", got_max, " vs ", want_max));

  f.ran();
  onebit_lamb_apply(got_m.data(), denom.data(), n, c.bc1, c.wd, scale, got_x.data(), choice);
  bad = 0;
  for (int64_t i = 0; i < n && bad < 3; ++i)
    if (!f.check(same_bits(got_x[i], x[i]), str("apply ", what, " i=", i, ": ", got_x[i], " vs ", x[i]))) ++bad;
}

}  // namespace
}  // namespace hvdc

int main() {
  hvdc::Failures f;
  const hvdc::Case cases[] = {
      {0.0316f, 0.0f, 0.271f, 0.0f},    // bias-corrected, no floor, no weight decay
      {0.0316f, 0.004f, 0.271f, 0.05f},  // with the floor and weight decay
      {1.0f, 0.004f, 1.0f, 0.05f},       // no bias correction
  };
  std::printf("test_onebit_lamb_kernels: AVX2 kernels on this CPU: %s\n",
              hvdc::cpu_has_avx2_kernels() ? "yes" : "no (both runs take the portable code)");
  for (const auto choice : {hvdc::KernelChoice::kAuto, hvdc::KernelChoice::kScalar})
    for (const auto& c : cases)
      for (const int64_t n : {0, 1, 7, 8, 9, 15, 17, 1023, 1024, 1025, 3001})
        for (const bool nan : {false, true}) hvdc::check_length(f, n, choice, c, nan);
  return f.finish("test_onebit_lamb_kernels");
}
