// SLAMB's fused passes (hvdc/slamb_kernels.h) against plain per-element loops of the same float32 math
// (bit for bit) and sums taken in double (relative 1e-6), at lengths around the kernels' 1024-element
// blocks, with and without the variance floor and the weight decay; and the direction's AVX2 version against
// its portable one, bit for bit (u and the four sums), with an infinity and a NaN among the values.
#pragma GCC optimize("fp-contract=off")
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <vector>

#include "check.h"
#include "sample_values.h"
#include "hvdc/slamb_kernels.h"

namespace hvdc {
namespace {

bool close(double got, double want) { return std::fabs(got - want) <= 1e-6 * std::fabs(want) + 1e-30; }

void check_length(Failures& f, int64_t n) {
  const std::vector<float> m0 = sample_values(n, 0.5f, 1), g = sample_values(n, 2.0f, 2),
                           x = sample_values(n, 1.5f, 3);
  std::vector<float> v0 = sample_values(n, 0.3f, 4);
  for (float& e : v0) e = e * e;  // v >= 0
  std::vector<uint8_t> mask(n);
  for (int64_t i = 0; i < n; ++i) mask[i] = (i * 7919) % 10 < 3;

  f.ran();
  std::vector<float> work(n);
  slamb_momentum(m0.data(), g.data(), n, 0.9f, work.data());
  for (int64_t i = 0; i < n; ++i)
    f.check(work[i] == m0[i] * 0.9f + (1.0f - 0.9f) * g[i], str("momentum n=", n, " i=", i));

  f.ran();
  std::vector<float> m(n), v = v0;
  const double total = slamb_moments(work.data(), g.data(), n, 0.999f, m.data(), v.data());
  double want_total = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const float want = v0[i] * 0.999f + (1.0f - 0.999f) * (g[i] * g[i]);
    f.check(m[i] == work[i] && v[i] == want, str("moments n=", n, " i=", i));
    want_total += want;
  }
  f.check(close(total, want_total), str("moments sum n=", n, ": ", total, " vs ", want_total));

  for (const float floor : {0.0f, 0.05f}) {
    for (const float wd : {0.0f, 0.01f}) {
      f.ran();
      std::vector<float> u(n);
      const SlambNorms r = slamb_direction(m.data(), v.data(), x.data(), mask.data(), n, 0.7f, floor, 1e-6f, 0.3f,
                                           wd, u.data());
      double sums[4] = {}, count = 0;
      for (int64_t i = 0; i < n; ++i) {
        float s = std::sqrt(v[i]) / 0.7f;
        if (floor > 0.0f) s = std::fmax(s, floor);
        float want = (1.0f / (s + 1e-6f)) * m[i] / 0.3f;
        if (wd != 0.0f) want = want + wd * x[i];
        f.check(u[i] == want, str("direction n=", n, " floor=", floor, " wd=", wd, " i=", i));
        const double xx = static_cast<double>(x[i]) * x[i], uu = static_cast<double>(want) * want;
        sums[mask[i] ? 0 : 1] += xx;
        sums[mask[i] ? 2 : 3] += uu;
        count += mask[i];
      }
      const double got[4] = {r.x.selected, r.x.unselected, r.u.selected, r.u.unselected};
      for (int k = 0; k < 4; ++k) f.check(close(got[k], sums[k]), str("direction norm ", k, " n=", n));
      f.check(r.x.count == count && r.u.count == count, str("direction count n=", n));
    }
  }

  f.ran();
  std::vector<float> c = sample_values(n, 0.5f, 5), xo = x, u = sample_values(n, 1.0f, 6);
  for (float& e : c) e = std::fabs(e);  // freshness in [0, 1)
  slamb_apply(u.data(), c.data(), n, 2.5f, 0.2f, 0.3f, 2.0f, 0.004f, 0.001f, xo.data());
  for (int64_t i = 0; i < n; ++i) {
    const float phi = std::fmin(std::fmax(c[i] * 2.5f + 0.2f, 0.3f), 2.0f);
    const float want = x[i] - (u[i] * phi) * (c[i] * 0.004f + 0.001f);
    f.check(xo[i] == want, str("apply n=", n, " i=", i));
  }
}

bool same_sum(double a, double b) { return std::memcmp(&a, &b, sizeof a) == 0; }

void check_direction_isa(Failures& f, int64_t n) {
  const std::vector<float> x = sample_values(n, 1.5f, 7);
  std::vector<float> m = sample_values(n, 0.5f, 8), v = sample_values(n, 0.3f, 9);
  for (float& e : v) e = e * e;
  std::vector<uint8_t> mask(n);
  for (int64_t i = 0; i < n; ++i) mask[i] = (i * 104729) % 10 < 1;
  if (n > 2100) {  // one block with an infinity, another with a NaN: the sums carry them alike
    v[n / 3] = std::numeric_limits<float>::infinity();
    m[n / 2] = std::numeric_limits<float>::quiet_NaN();
  }
  for (const float floor : {0.0f, 0.05f}) {
    for (const float wd : {0.0f, 0.01f}) {
      f.ran();
      std::vector<float> portable(n), avx2(n);
      const SlambNorms a = slamb_direction(m.data(), v.data(), x.data(), mask.data(), n, 0.7f, floor, 1e-6f, 0.3f,
                                           wd, portable.data(), KernelChoice::kScalar);
      const SlambNorms b = slamb_direction(m.data(), v.data(), x.data(), mask.data(), n, 0.7f, floor, 1e-6f, 0.3f,
                                           wd, avx2.data(), KernelChoice::kAuto);
      const std::string what = str("direction isa n=", n, " floor=", floor, " wd=", wd);
      int bad = 0;
      for (int64_t i = 0; i < n && bad < 3; ++i)
        if (!f.check(same_bits(avx2[i], portable[i]), str(what, " i=", i, ": ", avx2[i], " vs ", portable[i]))) ++bad;
      f.check(same_sum(a.x.selected, b.x.selected) && same_sum(a.x.unselected, b.x.unselected) &&
                  same_sum(a.u.selected, b.u.selected) && same_sum(a.u.unselected, b.u.unselected),
              str(what, ": sums ", b.u.selected, " ", b.u.unselected, " vs ", a.u.selected, " ", a.u.unselected));
      f.check(a.x.count == b.x.count && a.u.count == b.u.count, str(what, ": counts"));
    }
  }
}

}  // namespace
}  // namespace hvdc

int main() {
  hvdc::Failures f;
  for (const int64_t n : {0, 1, 7, 1023, 1024, 1025, 3000}) hvdc::check_length(f, n);
  for (const int64_t n : {0, 8, 1023, 1024, 1031, 4096, 5000}) hvdc::check_direction_isa(f, n);
  return f.finish("test_slamb_kernels");
}
