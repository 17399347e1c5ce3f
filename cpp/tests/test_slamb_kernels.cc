// SLAMB's fused passes (hvdc/slamb_kernels.h) against plain per-element loops of the same float32 math
// (bit for bit) and sums taken in double (relative 1e-6), at lengths around the kernels' 1024-element
// blocks, with and without the variance floor and the weight decay; and the direction's AVX2 version against
// its portable one, bit for bit (u and the four sums), with an infinity and a NaN among the values; and the passes
// of a step on the wire against those they stand for.
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

// The passes of a step on the wire (slamb_algorithm's _step_on_wire): local moments, the local direction, the
// momentum gathered under the mask and the masked direction from the averages, against the whole-buffer passes
// they stand for (bit for bit), on the portable code and on the AVX2 one (`choice`), at lengths around the groups
// of 8 and the blocks of 1024.
void check_on_wire(Failures& f, int64_t n, KernelChoice choice) {
  const std::string at = str(" n=", n, choice == KernelChoice::kScalar ? " portable" : " auto");
  const std::vector<float> m0 = sample_values(n, 0.5f, 11), g = sample_values(n, 2.0f, 12),
                           x = sample_values(n, 1.5f, 13);
  std::vector<float> v0 = sample_values(n, 0.3f, 14);
  for (float& e : v0) e = e * e;
  std::vector<uint8_t> mask(n);
  int64_t count = 0;
  for (int64_t i = 0; i < n; ++i) count += mask[i] = (i * 7919) % 10 < 2 || (i % 64) < 9;  // runs and gaps

  f.ran();  // m = b1 m + (1 - b1) g where not selected, v everywhere, the sum of v as slamb_moments sums it
  std::vector<float> m = m0, v = v0, work(n), m_all(n), v_all = v0;
  const double total = slamb_local_moments(g.data(), mask.data(), n, 0.9f, 0.999f, m.data(), v.data(), choice);
  slamb_momentum(m0.data(), g.data(), n, 0.9f, work.data());
  const double want_total = slamb_moments(work.data(), g.data(), n, 0.999f, m_all.data(), v_all.data());
  int bad = 0;
  for (int64_t i = 0; i < n && bad < 3; ++i) {
    const bool ok = same_bits(m[i], mask[i] ? m0[i] : work[i]) && same_bits(v[i], v_all[i]);
    if (!f.check(ok, str("local moments", at, " i=", i))) ++bad;
  }
  f.check(same_sum(total, want_total), str("local moments sum", at, ": ", total, " vs ", want_total));

  f.ran();  // the selected elements' momentum, gathered; -1 without room for them
  std::vector<float> gathered(count + 1, -7.0f);
  f.check(slamb_momentum_gather(m0.data(), g.data(), mask.data(), n, 0.9f, gathered.data(), count, choice) == count,
          str("momentum gather count", at));
  for (int64_t i = 0, j = 0; i < n; ++i)
    if (mask[i]) f.check(same_bits(gathered[j], work[i]), str("momentum gather", at, " j=", j)), ++j;
  f.check(gathered[count] == -7.0f, str("momentum gather wrote past count", at));
  if (count > 0)
    f.check(slamb_momentum_gather(m0.data(), g.data(), mask.data(), n, 0.9f, gathered.data(), count - 1, choice) ==
                -1,
            str("momentum gather without room", at));

  for (const float floor : {0.0f, 0.05f}) {
    for (const float wd : {0.0f, 0.01f}) {
      const std::string what = str(at, " floor=", floor, " wd=", wd);
      f.ran();  // u[~M] and three sums as slamb_direction's, u[M] the factor d
      std::vector<float> u(n), want_u(n);
      const SlambNorms a = slamb_direction_local(m.data(), v.data(), x.data(), mask.data(), n, 0.7f, floor, 1e-6f,
                                                 0.3f, wd, u.data(), choice);
      const SlambNorms b = slamb_direction(m.data(), v.data(), x.data(), mask.data(), n, 0.7f, floor, 1e-6f, 0.3f, wd,
                                           want_u.data(), choice);
      bad = 0;
      for (int64_t i = 0; i < n && bad < 3; ++i) {
        float s = std::sqrt(v[i]) / 0.7f;
        if (floor > 0.0f) s = std::fmax(s, floor);
        const float want = mask[i] ? 1.0f / (s + 1e-6f) : want_u[i];
        if (!f.check(same_bits(u[i], want), str("local direction", what, " i=", i))) ++bad;
      }
      f.check(same_sum(a.x.selected, b.x.selected) && same_sum(a.x.unselected, b.x.unselected) &&
                  same_sum(a.u.unselected, b.u.unselected) && a.x.count == b.x.count,
              str("local direction sums", what));

      f.ran();  // from the averages: m[M] and u[M] as slamb_direction computes them with those m, the rest untouched
      const std::vector<float> m_avg = sample_values(count, 0.4f, 15);
      std::vector<float> m_new = m, m_want = m;
      for (int64_t i = 0, j = 0; i < n; ++i)
        if (mask[i]) m_want[i] = m_avg[j++];
      slamb_direction(m_want.data(), v.data(), x.data(), mask.data(), n, 0.7f, floor, 1e-6f, 0.3f, wd, want_u.data(),
                      choice);
      std::vector<float> u_new = u;
      const MaskedDirection r = slamb_masked_direction(m_avg.data(), count, x.data(), mask.data(), n, 0.3f, wd,
                                                       m_new.data(), u_new.data(), choice);
      f.check(r.used == count, str("masked direction used ", r.used, " of ", count, what));
      double want_sum = 0.0;
      bad = 0;
      for (int64_t i = 0; i < n && bad < 3; ++i) {
        const bool ok = mask[i] ? same_bits(u_new[i], want_u[i]) && same_bits(m_new[i], m_want[i])
                                : same_bits(u_new[i], u[i]) && same_bits(m_new[i], m[i]);
        if (!f.check(ok, str("masked direction", what, " i=", i))) ++bad;
        if (mask[i]) want_sum += static_cast<double>(want_u[i]) * want_u[i];
      }
      f.check(close(r.sum, want_sum), str("masked direction sum", what, ": ", r.sum, " vs ", want_sum));
      if (count > 0) {  // fewer averaged values than selected elements: reported, nothing read past them
        std::vector<float> m2 = m, u2 = u;
        f.check(slamb_masked_direction(m_avg.data(), count - 1, x.data(), mask.data(), n, 0.3f, wd, m2.data(),
                                       u2.data(), choice).used == -1,
                str("masked direction short", what));
      }
    }
  }
}

}  // namespace
}  // namespace hvdc

int main() {
  hvdc::Failures f;
  for (const int64_t n : {0, 1, 7, 1023, 1024, 1025, 3000}) hvdc::check_length(f, n);
  for (const int64_t n : {0, 8, 1023, 1024, 1031, 4096, 5000}) hvdc::check_direction_isa(f, n);
  for (const int64_t n : {0, 1, 9, 64, 1023, 1024, 1031, 5000})
    for (const hvdc::KernelChoice choice : {hvdc::KernelChoice::kScalar, hvdc::KernelChoice::kAuto})
      hvdc::check_on_wire(f, n, choice);
  return f.finish("test_slamb_kernels");
}
