// The float32 scaled add (hvdc/scaled_add_kernels.h) against a std::fma loop, bit for bit, on the AVX2 and the
// portable implementation, at lengths around the 8-lane vectors, in place and into another buffer, with an
// infinity and a NaN among the values; and an fma case where a float64 sum rounded to float32 (the NumPy
// backend's emulation) differs from the one rounding.
#pragma GCC optimize("fp-contract=off")
#include <cmath>
#include <cstdint>
#include <limits>
#include <vector>

#include "check.h"
#include "sample_values.h"
#include "hvdc/kernel_isa.h"
#include "hvdc/scaled_add_kernels.h"

namespace hvdc {
namespace {

void check_length(Failures& f, int64_t n, KernelChoice choice, bool in_place) {
  const char* isa = choice == KernelChoice::kScalar ? "scalar" : "auto";
  const std::string what = str(isa, " n=", n, " in_place=", in_place);
  std::vector<float> base = sample_values(n, 1.5f, 1);
  const std::vector<float> p = sample_values(n, 0.5f, 2);
  if (n > 3) {
    base[n / 2] = std::numeric_limits<float>::infinity();
    base[n / 3] = std::numeric_limits<float>::quiet_NaN();
  }
  const float q = -0.0123f;
  std::vector<float> want(n);
  for (int64_t i = 0; i < n; ++i) want[i] = std::fma(p[i], q, base[i]);
  std::vector<float> out(n, 7.0f);
  if (in_place) {
    out = base;
    scaled_add(out.data(), p.data(), n, q, out.data(), choice);
  } else {
    scaled_add(base.data(), p.data(), n, q, out.data(), choice);
  }
  int bad = 0;
  for (int64_t i = 0; i < n && bad < 3; ++i)
    if (!f.check(same_bits(out[i], want[i]), str(what, " i=", i, ": ", out[i], " vs ", want[i]))) ++bad;
  f.ran();
}

// base = 1 + 2^-23 (odd last bit), p = 1 + 2^-23, q = 2^-24 (1 - 2^-23): the exact sum is 1 + 3 2^-24 - 2^-70, just
// below the float32 midpoint 1 + 3 2^-24 by less than half a float64 ulp. Rounded to float64 first it lands on the
// midpoint and ties-to-even goes up to 1 + 2^-22; one rounding (fma) goes down to 1 + 2^-23.
void check_single_rounding(Failures& f, KernelChoice choice) {
  const float base = 1.0f + std::ldexp(1.0f, -23);
  const float p = 1.0f + std::ldexp(1.0f, -23);
  const float q = std::ldexp(1.0f - std::ldexp(1.0f, -23), -24);
  const double twice = static_cast<double>(static_cast<float>(static_cast<double>(base) +
                                                              static_cast<double>(p) * static_cast<double>(q)));
  const float once = std::fma(p, q, base);
  float out = 0;
  scaled_add(&base, &p, 1, q, &out, choice);
  f.check(same_bits(out, once), str("single rounding: ", out, " vs fma ", once));
  f.check(static_cast<float>(twice) != once, "the case must tell one rounding from two");
  f.ran();
}

}  // namespace
}  // namespace hvdc

int main() {
  hvdc::Failures f;
  std::printf("test_scaled_add_kernels: AVX2 kernels on this CPU: %s\n",
              hvdc::cpu_has_avx2_kernels() ? "yes" : "no (both runs take the portable code)");
  for (const auto choice : {hvdc::KernelChoice::kAuto, hvdc::KernelChoice::kScalar}) {
    for (const int64_t n : {0, 1, 7, 8, 9, 15, 17, 1023, 1024, 1025, 3001})
      for (const bool in_place : {false, true}) hvdc::check_length(f, n, choice, in_place);
    hvdc::check_single_rounding(f, choice);
  }
  return f.finish("test_scaled_add_kernels");
}
