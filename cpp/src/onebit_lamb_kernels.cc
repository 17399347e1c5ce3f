// 1-bit LAMB's fused compression-stage passes (see hvdc/onebit_lamb_kernels.h; paper 001 Algorithm 1
// lines 14-17 and 20-21). No contraction into FMAs: the only fused multiply-adds are the explicit ones
// that mirror torch's fmadd, everything else rounds step by step like the backend path.
#pragma GCC optimize("fp-contract=off")
#include "hvdc/onebit_lamb_kernels.h"

#include <cmath>
#include <limits>

#include "hvdc/elementwise/onebit_lamb.h"

#if HVDC_AVX2_FMA_KERNELS
#include <immintrin.h>
#endif

namespace hvdc {
namespace {

using MomentsArgs = OneBitLambMomentsArgs;

// One element of pass A; returns its ratio r. The portable code, and the AVX2 loops' tail.
inline float moments_one(const float* work, const float* denom, int64_t i, const MomentsArgs& a, float* m,
                         float* fresh) {
  return onebit_lamb_ratio(work[i], denom[i], a, m[i], fresh[i]);
}

using MaxNan = OneBitLambMax;

float moments_scalar(const float* work, const float* denom, int64_t n, const MomentsArgs& a, float* m,
                     float* fresh, int64_t from, MaxNan acc) {
  for (int64_t i = from; i < n; ++i) acc.add(moments_one(work, denom, i, a, m, fresh));
  return acc.result();
}

template <bool kDecay>
void apply_scalar(const float* m, const float* denom, int64_t n, float bc1, float wd, float scale, float* x,
                  int64_t from) {
  for (int64_t i = from; i < n; ++i) x[i] = onebit_lamb_param<kDecay>(m[i], denom[i], x[i], bc1, wd, scale);
}

#if HVDC_AVX2_FMA_KERNELS
HVDC_AVX2_FMA float moments_avx2(const float* work, const float* denom, int64_t n, const MomentsArgs& a, float* m,
                             float* fresh) {
  const __m256 neg_b1 = _mm256_set1_ps(a.neg_b1), omb1 = _mm256_set1_ps(a.one_minus_b1);
  const __m256 b2 = _mm256_set1_ps(a.b2), omb2 = _mm256_set1_ps(a.one_minus_b2);
  const __m256 sqrt_bc2 = _mm256_set1_ps(a.sqrt_bc2), floor = _mm256_set1_ps(a.floor);
  const __m256 eps = _mm256_set1_ps(a.eps);
  __m256 vmax = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  __m256 nan = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 w = _mm256_loadu_ps(work + i);
    const __m256 g = _mm256_div_ps(_mm256_fmadd_ps(_mm256_loadu_ps(m + i), neg_b1, w), omb1);
    const __m256 v = _mm256_fmadd_ps(_mm256_mul_ps(omb2, g), g, _mm256_mul_ps(_mm256_loadu_ps(fresh + i), b2));
    _mm256_storeu_ps(fresh + i, v);
    _mm256_storeu_ps(m + i, w);
    // maxps returns its second operand when either is NaN: (floor, s) keeps a NaN s, as clamp_min does.
    const __m256 s = _mm256_max_ps(floor, _mm256_div_ps(_mm256_sqrt_ps(v), sqrt_bc2));
    const __m256 r = _mm256_div_ps(_mm256_loadu_ps(denom + i), _mm256_add_ps(s, eps));
    nan = _mm256_or_ps(nan, _mm256_cmp_ps(r, r, _CMP_UNORD_Q));
    vmax = _mm256_max_ps(vmax, r);  // a NaN r is recorded in `nan`, whatever maxps keeps here
  }
  MaxNan acc;
  acc.nan = _mm256_movemask_ps(nan) != 0;
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, vmax);
  for (float l : lanes) acc.add(l);
  return moments_scalar(work, denom, n, a, m, fresh, i, acc);
}

template <bool kDecay>
HVDC_AVX2_FMA void apply_avx2(const float* m, const float* denom, int64_t n, float bc1, float wd, float scale,
                          float* x) {
  const __m256 vbc1 = _mm256_set1_ps(bc1), vwd = _mm256_set1_ps(wd), vscale = _mm256_set1_ps(scale);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 xv = _mm256_loadu_ps(x + i);
    __m256 u = _mm256_div_ps(_mm256_div_ps(_mm256_loadu_ps(m + i), _mm256_loadu_ps(denom + i)), vbc1);
    if (kDecay) u = _mm256_fmadd_ps(xv, vwd, u);
    _mm256_storeu_ps(x + i, _mm256_add_ps(xv, _mm256_mul_ps(u, vscale)));
  }
  apply_scalar<kDecay>(m, denom, n, bc1, wd, scale, x, i);
}
#endif

}  // namespace

float onebit_lamb_moments(const float* work, const float* denom, int64_t n, float neg_b1, float one_minus_b1,
                          float b2, float one_minus_b2, float sqrt_bc2, float floor, float eps, float* m,
                          float* fresh, KernelChoice choice) {
  const MomentsArgs a{neg_b1, one_minus_b1, b2, one_minus_b2, sqrt_bc2, floor, eps};
#if HVDC_AVX2_FMA_KERNELS
  if (use_avx2_kernels(choice)) return moments_avx2(work, denom, n, a, m, fresh);
#else
  (void)choice;
#endif
  return moments_scalar(work, denom, n, a, m, fresh, 0, MaxNan{});
}

void onebit_lamb_apply(const float* m, const float* denom, int64_t n, float bc1, float wd, float scale, float* x,
                       KernelChoice choice) {
#if HVDC_AVX2_FMA_KERNELS
  if (use_avx2_kernels(choice)) {
    if (wd != 0.0f) apply_avx2<true>(m, denom, n, bc1, wd, scale, x);
    else apply_avx2<false>(m, denom, n, bc1, wd, scale, x);
    return;
  }
#else
  (void)choice;
#endif
  if (wd != 0.0f) apply_scalar<true>(m, denom, n, bc1, wd, scale, x, 0);
  else apply_scalar<false>(m, denom, n, bc1, wd, scale, x, 0);
}

}  // namespace hvdc
