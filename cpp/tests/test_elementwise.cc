// The per-element functions that the CPU kernels and the CUDA kernels share (hvdc/elementwise/),
// where the kernels' own tests do not pin them: known answers for the half casts (subnormals,
// ties, overflow, NaN), the 1-bit and Birder rules at their edges, the explicit fma of 1-bit Adam
// and LAMB against rounding twice elsewhere, Adasum's single rounding from double, and the fixed summation order of the CUDA kernels (block_sum.h). Then
// the CUDA kernels' way of working, replayed on the host with these functions (per-element Philox
// draws, sums in block order), against the CPU kernels: the same bits, and the 1-bit scale within
// one float32 ulp (the two sum in different orders).
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "check.h"
#include "hvdc/elementwise/adasum.h"
#include "hvdc/elementwise/block_sum.h"
#include "hvdc/elementwise/half.h"
#include "hvdc/elementwise/mask.h"
#include "hvdc/elementwise/onebit.h"
#include "hvdc/elementwise/onebit_adam.h"
#include "hvdc/elementwise/onebit_lamb.h"
#include "hvdc/elementwise/stochastic.h"
#include "hvdc/masks.h"
#include "hvdc/onebit_kernels.h"
#include "hvdc/philox.h"
#include "hvdc/stochastic_kernels.h"

namespace hvdc {
namespace {

float f32(uint32_t u) { return bits_float(u); }
std::string hex(uint32_t u) { return str(std::hex, "0x", u); }

void half_casts(Failures& f) {
  f.ran();
  struct ToHalf {
    uint32_t in;
    uint16_t want;
  };
  const ToHalf to_half[] = {
      {0x3f800000u, 0x3c00},  // 1
      {0x80000000u, 0x8000},  // -0
      {0x477fe000u, 0x7bff},  // 65504, the largest half
      {0x477ff000u, 0x7c00},  // 65520: half-way to the next, rounds (to even) to +inf
      {0x477fefffu, 0x7bff},  // just below that tie
      {0x33800000u, 0x0001},  // 2^-24, the smallest subnormal
      {0x33000000u, 0x0000},  // 2^-25: a tie, to even (0)
      {0x33c00000u, 0x0002},  // 3 * 2^-25: a tie, to even (2)
      {0x3f801000u, 0x3c00},  // 1 + 2^-11: a tie, to even
      {0x3f803000u, 0x3c02},  // 1 + 3 * 2^-11: a tie, to even
      {0x7f800000u, 0x7c00},  // +inf
      {0x7fc00000u, 0x7e00},  // the quiet NaN
      {0xffa00000u, 0xff00},  // a signalling NaN with payload: quieted, top payload bits kept
  };
  for (const ToHalf& c : to_half) {
    const uint16_t got = float_to_half(f32(c.in));
    f.check(got == c.want, str("float_to_half(", hex(c.in), ") = ", hex(got), ", want ", hex(c.want)));
  }
  struct FromHalf {
    uint16_t in;
    uint32_t want;
  };
  const FromHalf from_half[] = {
      {0x0001, 0x33800000u}, {0x8400, 0xb8800000u}, {0x7bff, 0x477fe000u},
      {0x7c00, 0x7f800000u}, {0x7e00, 0x7fc00000u},
  };
  for (const FromHalf& c : from_half) {
    const uint32_t got = float_bits(half_to_float(c.in));
    f.check(got == c.want, str("half_to_float(", hex(c.in), ") = ", hex(got), ", want ", hex(c.want)));
  }
  struct ToBf16 {
    uint32_t in;
    uint16_t want;
  };
  const ToBf16 to_bf16[] = {
      {0x3f800000u, 0x3f80}, {0x3f808000u, 0x3f80},  // a tie, to even
      {0x3f818000u, 0x3f82},                         // a tie, to even (up)
      {0x3f808001u, 0x3f81}, {0x7f7fffffu, 0x7f80},  // the largest float rounds to +inf
      {0x7f800001u, 0x7fc0},                         // NaN stays NaN, made quiet
  };
  for (const ToBf16& c : to_bf16) {
    const uint16_t got = float_to_bf16(f32(c.in));
    f.check(got == c.want, str("float_to_bf16(", hex(c.in), ") = ", hex(got), ", want ", hex(c.want)));
  }
  // narrow_scaled: the float32 product, then the half type.
  f.check(narrow_scaled<HalfKind::kFloat16>(3.0f, 0.5f) == 0x3e00, "narrow_scaled 3 * 0.5");
  f.check(narrow_scaled<HalfKind::kBFloat16>(3.0f, 0.5f) == 0x3fc0, "narrow_scaled bf16 3 * 0.5");
  f.check(widen<HalfKind::kBFloat16>(0x3fc0) == 1.5f, "widen bf16 1.5");
}

void onebit_rules(Failures& f) {
  f.ran();
  f.check(onebit_sign(-0.0f) && onebit_sign(0.0f), "+0 and -0 are sent as +1");
  f.check(!onebit_sign(-1e-45f), "the smallest negative subnormal is sent as -1");
  f.check(!onebit_sign(std::numeric_limits<float>::quiet_NaN()), "NaN gives a clear bit");
  f.check(same_bits(onebit_error(-0.0f, 0.5f), -0.5f), "error of -0 is -0 - scale");
  f.check(same_bits(onebit_error(-0.25f, 0.5f), 0.25f), "error of a negative c is c + scale");
  f.check(onebit_scale_of(8.0, 2) == 2.0f, "scale sqrt(8 / 2)");
  f.check(onebit_scale_of(123.0, 0) == 0.0f, "an empty chunk has scale 0");
  // sqrt(1/3) rounded to float once from the double: not the float32 sqrt of a float32 1/3.
  f.check(onebit_scale_of(1.0, 3) == static_cast<float>(std::sqrt(1.0 / 3.0)), "scale sqrt(1/3)");
  f.check(onebit_add_rank(0.0f, 0, 0.0f) == 0.0f && std::signbit(onebit_add_rank(-0.0f, 0, 0.0f)),
          "a rank's term is an IEEE addition (-0 + -0 stays -0)");
  f.check(OneBitDivide(3)(1.0f) == 1.0f / 3.0f, "division by 3 is a float32 division");
  f.check(OneBitDivide(4)(3.0f) == 0.75f && OneBitDivide(4).pow2, "division by 4 is a multiply");
  f.check(onebit_pick<uint16_t>(1, 7, 9) == 7 && onebit_pick<uint16_t>(0, 7, 9) == 9, "pick");
  const uint8_t bits[2] = {0x81, 0x02};
  f.check(bit_of(bits, 0) == 1 && bit_of(bits, 1) == 0 && bit_of(bits, 7) == 1 &&
              bit_of(bits, 9) == 1 && bit_of(bits, 8) == 0,
          "element 8 i + j is bit j of byte i");
}

void birder_rules(Failures& f) {
  f.ran();
  float e = 0;
  f.check(birder_quantize(0.5f, 0.74f, e) && e == -0.5f, "Q(0.5) with u = 0.74 < 0.75 is +1");
  f.check(!birder_quantize(0.5f, 0.75f, e) && e == 1.5f, "Q(0.5) with u = 0.75 = p is -1");
  f.check(birder_quantize(1.0f, f32(0x3f7fffffu), e) && e == 0.0f, "Q(1) is +1 for every u < 1");
  f.check(!birder_quantize(-1.0f, 0.0f, e) && e == 0.0f, "Q(-1) is -1 even for u = 0");
  f.check(birder_server_value(2, 3, 0.0f) == 1.0f / 3.0f, "server: (2 * 2 - 3) / 3");
  f.check(birder_server_value(0, 4, 0.25f) == -0.75f, "server: (0 - 4) / 4 + 0.25");
  float m = 1.0f, b = 1.0f;
  const float r = birder_moments(-2.0f, 0.5f, 0.5f, 0.0f, m, b);
  f.check(m == -0.5f && b == 1.5f && r == -0.5f / 1.5f, "moments: m, b and m / (b + eps)");
  // beta * m + omb * a rounds twice: with m = beta = 1 + 2^-12, omb * a = -1, the exact product
  // 1 + 2^-11 + 2^-24 rounds (a tie, to even) to 1 + 2^-11, so m becomes 2^-11 (a contracted
  // fma would keep the 2^-24).
  m = f32(0x3f800800u);
  b = 0.0f;
  birder_moments(-1.0f, f32(0x3f800800u), 1.0f, 1.0f, m, b);
  f.check(m == std::ldexp(1.0f, -11), str("moments without contraction: m = ", m));
}

void onebit_adam_rules(Failures& f) {
  f.ran();
  const float x = f32(0x3f800800u);  // 1 + 2^-12
  // l2 term as an fma: (1 + 2^-12)^2 - 1 = 2^-11 + 2^-24 exactly, which one rounding keeps.
  const float w = onebit_momentum<true>(-1.0f, 0.0f, x, 1.0f, x, 0.9f);
  f.check(w == std::ldexp(1.0f, -11) + std::ldexp(1.0f, -24), str("momentum's fma: ", w));
  f.check(onebit_momentum<false>(2.0f, 1.0f, std::numeric_limits<float>::infinity(), 0.5f, 1.0f,
                                 0.5f) == 1.5f,
          "momentum without L2 ignores an infinite x");
  // x * decay + step rounds twice (no contraction): 2^-11, not 2^-11 + 2^-24.
  const float p = onebit_adam_param<true>(-1.0f, 1.0f, x, x, 1.0f,
                                          -std::numeric_limits<float>::infinity(), 0.0f);
  f.check(p == std::ldexp(1.0f, -11), str("apply without contraction: ", p));
  f.check(onebit_adam_param<true>(1.0f, 0.5f, 2.0f, 0.5f, -0.25f,
                                  -std::numeric_limits<float>::infinity(), 1.0f) == 0.5f,
          "apply: 2 * 0.5 + 1 * -0.25 / 0.5");
  f.check(onebit_adam_param<false>(3.0f, 0.1f, 0.0f, 1.0f, 1.0f, 0.2f, 1.0f) == 1.0f,
          "apply: a floored denominator is lifted to |m| * cap");
  f.check(onebit_adam_param<false>(0.05f, 0.1f, 0.0f, 1.0f, 1.0f, 0.2f, 1.0f) == 0.05f / 0.1f,
          "apply: |m| * cap below the floored denominator leaves it");
}

void onebit_lamb_rules(Failures& f) {
  f.ran();
  const OneBitLambMomentsArgs a{-1.0f, 1.0f, 0.5f, 0.5f, 1.0f, 0.0f, 0.0f};
  float m = 1.0f, fresh = 0.0f;
  // g = fma(1, -1, 2) / 1 = 1; fresh = fma(0.5 * 1, 1, 0 * 0.5) = 0.5; r = 1 / sqrt(0.5).
  const float r = onebit_lamb_ratio(2.0f, 1.0f, a, m, fresh);
  f.check(m == 2.0f && fresh == 0.5f && r == 1.0f / std::sqrt(0.5f),
          str("1-bit LAMB pass A: m ", m, ", fresh ", fresh, ", r ", r));
  {
    OneBitLambMomentsArgs floored = a;
    floored.floor = 2.0f;  // max(sqrt(0.5), 2) = 2
    float m2 = 1.0f, fresh2 = 0.0f;
    f.check(onebit_lamb_ratio(2.0f, 1.0f, floored, m2, fresh2) == 0.5f, "1-bit LAMB: the floor");
  }
  OneBitLambMax mx;
  f.check(mx.result() == -INFINITY, "max of no ratio is -inf");
  mx.add(1.0f);
  mx.add(3.0f);
  mx.add(2.0f);
  f.check(mx.result() == 3.0f, "max of 1, 3, 2");
  OneBitLambMax with_nan;
  with_nan.add(1.0f);
  with_nan.add(NAN);
  with_nan.add(3.0f);
  mx.merge(with_nan);
  f.check(std::isnan(mx.result()), "a NaN ratio makes the max NaN, merged too");
  // x + u * scale rounds twice: (1 + 2^-12)^2 - 1 = 2^-11 (+ 2^-24 only if contracted).
  const float x12 = f32(0x3f800800u);
  const float p = onebit_lamb_param<false>(x12, 1.0f, -1.0f, 1.0f, 0.0f, x12);
  f.check(p == std::ldexp(1.0f, -11), str("1-bit LAMB pass B without contraction: ", p));
  // The weight-decay term is an fma: fma(x, wd, u) with x = wd = 1 + 2^-12, u = -1.
  const float q = onebit_lamb_param<true>(-1.0f, 1.0f, x12, 1.0f, x12, 1.0f);
  f.check(q == x12 + (std::ldexp(1.0f, -11) + std::ldexp(1.0f, -24)), str("1-bit LAMB's fma: ", q));
}

void adasum_rules(Failures& f) {
  f.ran();
  // One rounding from double: 1 + 2^-11 + 2^-40 is above the tie, so it rounds up; through float32
  // it would first become the tie 1 + 2^-11 and then round to even (1).
  const double above_tie = 1.0 + std::ldexp(1.0, -11) + std::ldexp(1.0, -40);
  f.check(double_to_half(above_tie) == 0x3c01, str("double_to_half rounds once: ", hex(double_to_half(above_tie))));
  uint16_t h = 0;
  AdasumF16::store(&h, 0, above_tie);
  f.check(h == 0x3c01 && AdasumF16::load(&h, 0) == 1.0 + std::ldexp(1.0, -10), "Adasum's float16 store and load");
  AdasumBF16::store(&h, 0, 1.0 + std::ldexp(1.0, -8) + std::ldexp(1.0, -40));
  f.check(h == 0x3f80, "Adasum's bfloat16 store rounds through float32 (a tie, to even)");
  // ca * x + cb * y rounds each product: (1 + 2^-27)^2 - 1 = 2^-26 (+ 2^-54 only if contracted).
  const double c = 1.0 + std::ldexp(1.0, -27);
  f.check(adasum_mix(c, c, -1.0, 1.0) == std::ldexp(1.0, -26), "Adasum's combine without contraction");
  f.check(adasum_coefficient_of(1.0, std::ldexp(1.0, -511)) == 1.0 - std::ldexp(1.0, 510),
          "coefficient at |x|^2 = 2^-511");
  f.check(adasum_coefficient_of(1.0, std::nextafter(std::ldexp(1.0, -511), 0.0)) == 1.0,
          "coefficient below 2^-511 is 1");
  f.check(adasum_coefficient_of(2.0, 4.0) == 0.75, "coefficient 1 - 2 / (2 * 4)");
}

void block_order(Failures& f) {
  f.ran();
  const double big = std::ldexp(1.0, 53);  // adding 1 to it is lost (a tie, to even); adding 2 is not
  // Lanes 1 and 3 meet first (halving, s = 2), then lane 0: 2^53 + 2. Left to right would give 2^53.
  const double lanes = blocked_sum(4, [&](int64_t i) { return i == 0 ? big : i == 2 ? 0.0 : 1.0; });
  f.check(lanes == big + 2.0, str("lanes combine by halving: ", lanes - big));
  // Lane l's terms in index order: 1 + 2^53 loses the 1 only when 2^53 comes first.
  const double in_lane = blocked_sum(kSumLanes + 1, [&](int64_t i) {
    return i == 0 ? big : i == kSumLanes ? 1.0 : 0.0;
  });
  f.check(in_lane == big, str("a lane adds its terms in index order: ", in_lane - big));
  // Blocks in block order: (2^53 + 1) + 1 = 2^53, where a tree over blocks would give 2^53 + 2.
  const double blocks = blocked_sum(2 * kSumBlock + 1, [&](int64_t i) {
    return i == 0 ? big : i % kSumBlock == 0 ? 1.0 : 0.0;
  });
  f.check(blocks == big, str("blocks add in block order: ", blocks - big));
  const double count = blocked_sum(3 * kSumBlock + 17, [](int64_t) { return 1.0; });
  f.check(count == 3 * kSumBlock + 17, str("sum of ones: ", count));
  f.check(sum_blocks(0) == 0 && sum_blocks(1) == 1 && sum_blocks(kSumBlock) == 1 &&
              sum_blocks(kSumBlock + 1) == 2,
          "sum_blocks");
}

void mask_rules(Failures& f) {
  f.ran();
  f.check(cyclic_selected(5, 3, 4) && !cyclic_selected(7, 3, 4) && !cyclic_selected(2, 3, 4),
          "cyclic: ranks 3..6 selected for base 3, width 4");
  f.check(!cyclic_selected(0, 0, 0), "cyclic: an empty chunk selects nothing");
  const BernoulliDraw half = bernoulli_draw_of(7, 3, uint64_t{1} << 31);
  f.check(half.th == 0x8000 && half.tl == 0 && half.key.step == 3 &&
              half.key.stream == kMaskBernoulliStream && half.tie_key.stream == kMaskBernoulliTieStream,
          "Bernoulli draw of T = 2^31");
  f.check(bernoulli_selected(half, 0x7fff, 0) == 1 && bernoulli_selected(half, 0x8000, 0) == 0,
          "Bernoulli: hi < T >> 16 selects; a tie with T & 0xFFFF = 0 does not");
  // A tie with T & 0xFFFF = 0xFFFF: selected unless lo, the tie stream's half, is 0xFFFF.
  const BernoulliDraw tie = bernoulli_draw_of(7, 3, 0x1234FFFFu);
  const uint64_t i = 12345;
  f.check(bernoulli_selected(tie, 0x1234, i) == (bernoulli_half(tie.tie_key, i) < 0xFFFFu),
          "Bernoulli: a tie reads the tie stream");
  f.check(bernoulli_half(tie.key, 5) == (philox_word(tie.key, 2) >> 16), "element 5 is the high half of word 2");
}

// Bernoulli masks as cpp/cuda/mask.cu draws them (element by element) against random_mask (the
// bulk Philox fill, vectorized where the CPU allows), over a range that starts mid-word.
void mask_as_the_device(Failures& f, double ratio, int64_t first, int64_t n) {
  f.ran();
  MaskSpec spec;
  spec.numel = first + n;
  spec.ratio = ratio;
  spec.seed = 99;
  spec.step = 5;
  spec.kind = MaskKind::kBernoulli;
  spec.first = first;
  spec.length = n;
  std::vector<uint8_t> cpu(n);
  random_mask(spec, cpu.data());
  const BernoulliDraw d = bernoulli_draw_of(spec.seed, spec.step, bernoulli_threshold(ratio));
  std::vector<uint8_t> dev(n);
  for (int64_t x = 0; x < n; ++x) {
    const uint64_t e = static_cast<uint64_t>(first + x);
    dev[x] = bernoulli_selected(d, bernoulli_half(d.key, e), e);
  }
  f.check(cpu == dev, str("Bernoulli mask, ratio ", ratio, ", elements ", first, "..", first + n,
                          ": differs from the device's"));
}

struct Lcg {
  uint64_t s;
  float next() {  // in [-2, 2), with a zero now and then
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    const uint32_t r = static_cast<uint32_t>(s >> 33);
    return r % 97 == 0 ? 0.0f : (static_cast<float>(r >> 8) * (1.0f / 16777216.0f) - 0.5f) * 4.0f;
  }
};

// The worker step as cpp/cuda/onebit.cu computes it, on the host, against onebit_compress.
void onebit_as_the_device(Failures& f, int64_t n, KernelChoice choice) {
  f.ran();
  const int64_t padded = (n + 7) / 8 * 8 + 8;  // one byte of padding beyond the rounding
  Lcg rng{static_cast<uint64_t>(n) + 11};
  std::vector<float> x(n), e0(n);
  for (auto& v : x) v = rng.next();
  for (auto& v : e0) v = rng.next() * 0.125f;

  std::vector<float> err_cpu = e0;
  std::vector<uint8_t> bits_cpu(padded / 8, 0xAB);
  const float scale_cpu =
      onebit_compress(x.data(), DType::kFloat32, err_cpu.data(), n, padded, bits_cpu.data(), choice);

  std::vector<uint8_t> bits_dev(padded / 8, 0);
  for (int64_t i = 0; i < n; ++i)
    bits_dev[i >> 3] |= static_cast<uint8_t>(onebit_sign(onebit_compensated(x[i], e0[i])) << (i & 7));
  const double sumsq = blocked_sum(n, [&](int64_t i) { return onebit_square(onebit_compensated(x[i], e0[i])); });
  const float scale_dev = onebit_scale_of(sumsq, n);
  std::vector<float> err_dev(n);
  for (int64_t i = 0; i < n; ++i) err_dev[i] = onebit_error(onebit_compensated(x[i], e0[i]), scale_dev);

  const std::string at = str("1-bit worker step, n = ", n, choice == KernelChoice::kScalar ? " (scalar)" : " (auto)");
  f.check(bits_cpu == bits_dev, at + ": bits differ from the device's");
  const float ulp = std::nextafter(scale_cpu, INFINITY) - scale_cpu;
  f.check(std::fabs(scale_cpu - scale_dev) <= ulp,
          str(at, ": scales ", scale_cpu, " (CPU) and ", scale_dev, " (block order) more than one ulp apart"));
  if (scale_cpu == scale_dev && n > 0)
    f.check(std::memcmp(err_cpu.data(), err_dev.data(), n * sizeof(float)) == 0,
            at + ": errors differ from the device's with the same scale");
}

// Birder's worker and server passes as cpp/cuda/stochastic.cu computes them (one Philox word per
// element, philox_uniform), against the CPU kernels (bulk Philox fill): the same bits and errors.
void birder_as_the_device(Failures& f, int64_t n, uint64_t offset, bool with_moments) {
  f.ran();
  const int64_t padded = (n + 7) / 8 * 8;
  Lcg rng{static_cast<uint64_t>(n) * 3 + offset};
  UniformSource u;
  u.key = PhiloxKey{0x1234abcd5678ull, 17, 2};
  u.offset = offset;
  std::vector<float> x(n), e0(n), m0(n), b0(n);
  for (auto& v : x) v = rng.next() * 0.5f;
  for (auto& v : e0) v = rng.next() * 0.25f;
  for (auto& v : m0) v = rng.next();
  for (auto& v : b0) v = std::fabs(rng.next());

  std::vector<float> err = e0, m = m0, b = b0;
  BirderMoments mo{m.data(), b.data(), 0.9f, static_cast<float>(1.0 - 0.9), 1e-8f};
  std::vector<uint8_t> bits(padded / 8, 0xCD);
  stochastic_quantize(x.data(), err.data(), with_moments ? &mo : nullptr, n, padded, u, bits.data());

  std::vector<float> err_dev = e0, m_dev = m0, b_dev = b0;
  std::vector<uint8_t> bits_dev(padded / 8, 0);
  for (int64_t i = 0; i < n; ++i) {
    const float y = with_moments ? birder_moments(x[i], mo.beta, mo.one_minus_beta, mo.eps, m_dev[i], b_dev[i]) +
                                       err_dev[i]
                                 : x[i] + err_dev[i];
    if (birder_quantize(y, philox_uniform(u.key, offset + i), err_dev[i]))
      bits_dev[i >> 3] |= static_cast<uint8_t>(1u << (i & 7));
  }
  const std::string at = str("Birder worker, n = ", n, ", offset ", offset, with_moments ? ", moments" : "");
  f.check(bits == bits_dev, at + ": bits differ from the device's");
  f.check(err == err_dev && m == m_dev && b == b_dev, at + ": error or moments differ from the device's");

  // Server pass over 3 ranks' bits.
  const uint8_t* ranks[3] = {bits.data(), bits_dev.data(), bits.data()};
  std::vector<uint8_t> out(padded / 8), out_dev(padded / 8, 0);
  std::vector<float> serr = e0, serr_dev = e0;
  stochastic_server_quantize(ranks, 3, serr.data(), n, padded, u, out.data());
  for (int64_t i = 0; i < n; ++i) {
    int ones = 0;
    for (const uint8_t* r : ranks) ones += bit_of(r, i);
    if (birder_quantize(birder_server_value(ones, 3, serr_dev[i]), philox_uniform(u.key, offset + i), serr_dev[i]))
      out_dev[i >> 3] |= static_cast<uint8_t>(1u << (i & 7));
  }
  f.check(out == out_dev && serr == serr_dev, at + ": server bits or error differ from the device's");
}

}  // namespace
}  // namespace hvdc

int main() {
  hvdc::Failures f;
  hvdc::half_casts(f);
  hvdc::onebit_rules(f);
  hvdc::birder_rules(f);
  hvdc::onebit_adam_rules(f);
  hvdc::onebit_lamb_rules(f);
  hvdc::adasum_rules(f);
  hvdc::block_order(f);
  hvdc::mask_rules(f);
  for (const double ratio : {0.1, 0.5, 0.999})
    for (const int64_t first : {0, 1, 4097}) hvdc::mask_as_the_device(f, ratio, first, 20000);
  for (const auto choice : {hvdc::KernelChoice::kScalar, hvdc::KernelChoice::kAuto})
    for (const int64_t n : {0, 1, 7, 8, 33, 4095, 4096, 4097, 3 * 4096 + 1000, 100003})
      hvdc::onebit_as_the_device(f, n, choice);
  for (const bool moments : {false, true})
    for (const int64_t n : {1, 7, 8, 255, 256, 257, 1000})
      for (const uint64_t offset : {0ull, 3ull, 1001ull}) hvdc::birder_as_the_device(f, n, offset, moments);
  return f.finish("test_elementwise");
}
