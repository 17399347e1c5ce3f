// 1-bit Adam's fused passes (hvdc/onebit_adam_kernels.h, paper 003 Alg. 1 line 6 and lines 12-13) against
// plain float32 loops that take the backend path's steps one whole-array pass at a time (torch's fmadd as
// std::fma), bit for bit, on the AVX2 and the portable implementation, at lengths around the 8-lane
// vectors; with and without Adam's L2 term and AdamW's decoupled decay; an infinite parameter; with the
// variance floor's cap (elements at the floor, some raised to |m| * cap, some not) and without it.
#pragma GCC optimize("fp-contract=off")
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "check.h"
#include "sample_values.h"
#include "hvdc/kernel_isa.h"
#include "hvdc/onebit_adam_kernels.h"

namespace hvdc {
namespace {

// Bitwise equal arrays, or up to three failures naming the element.
void check_same(Failures& f, const std::string& what, const std::vector<float>& got, const std::vector<float>& want) {
  int bad = 0;
  for (size_t i = 0; i < got.size() && bad < 3; ++i)
    if (!f.check(same_bits(got[i], want[i]), str(what, " i=", i, ": ", got[i], " vs ", want[i]))) ++bad;
}

void check_length(Failures& f, int64_t n, KernelChoice choice, bool l2, float decay, bool with_inf, bool floored) {
  const char* isa = choice == KernelChoice::kScalar ? "scalar" : "auto";
  const std::string what = str(isa, " n=", n, " l2=", l2, " decay=", decay, " inf=", with_inf, " floor=", floored);
  const float b1 = 0.9f, omb1 = static_cast<float>(1.0 - 0.9), l2c = static_cast<float>((1.0 - 0.9) * 0.05);
  const float value = static_cast<float>(-1e-2 / (1.0 - std::pow(0.9, 7)));
  const std::vector<float> g = sample_values(n, 0.5f, 1), m0 = sample_values(n, 0.04f, 2);
  std::vector<float> x0 = sample_values(n, 1.5f, 3), denom = sample_values(n, 0.02f, 5);
  for (float& e : denom) e = std::fabs(e) + 1e-3f;  // d = max(sqrt(vh), floor) + eps > 0
  // The floor: every third element sits at it (d == floor_denom); |m| * cap lands on both sides of it.
  const float floor_denom = floored ? 0.06f : -std::numeric_limits<float>::infinity();
  const float cap = static_cast<float>(1.0 / (1.0 - std::pow(0.9, 7)));
  if (floored)
    for (int64_t i = 0; i < n; i += 3) denom[i] = floor_denom;
  if (with_inf && n > 3) x0[n / 2] = std::numeric_limits<float>::infinity();

  // The backend path, one whole-array step after the other (onebit.py's `local_momentum`).
  std::vector<float> work = g;
  for (int64_t i = 0; i < n; ++i) work[i] = work[i] * omb1;                       // mul_(1 - b1)
  if (l2)
    for (int64_t i = 0; i < n; ++i) work[i] = std::fma(x0[i], l2c, work[i]);     // foreach_add_(alpha): fmadd
  for (int64_t i = 0; i < n; ++i) work[i] = std::fma(m0[i], b1, work[i]);        // add_(alpha=b1): fmadd
  f.ran();
  std::vector<float> got_work(n, -1.0f);
  onebit_local_momentum(g.data(), m0.data(), l2 ? x0.data() : nullptr, n, omb1, l2c, b1, got_work.data(), choice);
  check_same(f, "momentum " + what, got_work, work);

  // onebit_adam.py's `compressed` + `apply`: copy_(m, work); foreach_mul_(x, decay); the floor's cap
  // (where(d <= floor_denom, maximum(d, |m| * cap), d)); foreach_addcdiv_.
  std::vector<float> m = work, x = x0, step(n), d = denom;
  if (decay != 1.0f)
    for (int64_t i = 0; i < n; ++i) x[i] = x[i] * decay;
  int lifted = 0, raised = 0;
  for (int64_t i = 0; i < n; ++i) {
    if (denom[i] > floor_denom) continue;
    ++lifted;
    if (std::fabs(m[i]) * cap > denom[i]) d[i] = std::fabs(m[i]) * cap, ++raised;
  }
  if (floored && n >= 100)  // both sides of the cap occur, or half of it goes untested
    f.check(raised > 0 && raised < lifted, str(what, ": the cap raised ", raised, " of ", lifted));
  for (int64_t i = 0; i < n; ++i) step[i] = m[i] * value;  // torch's addcdiv: self + value * t1 / t2
  for (int64_t i = 0; i < n; ++i) step[i] = step[i] / d[i];
  for (int64_t i = 0; i < n; ++i) x[i] = x[i] + step[i];
  f.ran();
  std::vector<float> got_m = m0, got_x = x0;
  onebit_adam_apply(work.data(), denom.data(), n, decay, value, floor_denom, cap, got_m.data(), got_x.data(),
                    choice);
  check_same(f, "apply m " + what, got_m, m);
  check_same(f, "apply x " + what, got_x, x);
}

}  // namespace
}  // namespace hvdc

int main() {
  hvdc::Failures f;
  std::printf("test_onebit_adam_kernels: AVX2 kernels on this CPU: %s\n",
              hvdc::cpu_has_avx2_kernels() ? "yes" : "no (both runs take the portable code)");
  const float adamw_decay = static_cast<float>(1.0 - 1e-2 * 0.05);
  for (const auto choice : {hvdc::KernelChoice::kAuto, hvdc::KernelChoice::kScalar})
    for (const bool l2 : {false, true})
      for (const float decay : {1.0f, adamw_decay})
        for (const int64_t n : {0, 1, 7, 8, 9, 15, 17, 1023, 1024, 1025, 3001})
          for (const bool inf : {false, true})
            for (const bool floored : {false, true}) hvdc::check_length(f, n, choice, l2, decay, inf, floored);
  return f.finish("test_onebit_adam_kernels");
}
