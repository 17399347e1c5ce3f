// 1-bit Adam's fused compression-stage passes (see hvdc/onebit_adam_kernels.h; paper 003 Algorithm 1 line 6
// and lines 12-13). No contraction into FMAs: the only fused multiply-adds are the explicit ones that mirror
// torch's fmadd, everything else rounds step by step like the backend path.
#pragma GCC optimize("fp-contract=off")
#include "hvdc/onebit_adam_kernels.h"

#include "hvdc/elementwise/onebit_adam.h"

#if HVDC_AVX2_FMA_KERNELS
#include <immintrin.h>
#endif

namespace hvdc {
namespace {

template <bool kL2>
void momentum_scalar(const float* g, const float* m, const float* x, int64_t n, float omb1, float l2, float b1,
                     float* work, int64_t from) {
  for (int64_t i = from; i < n; ++i) work[i] = onebit_momentum<kL2>(g[i], m[i], kL2 ? x[i] : 0.0f, omb1, l2, b1);
}

template <bool kDecay>
void adam_apply_scalar(const float* work, const float* denom, int64_t n, float decay, float value,
                       float floor_denom, float cap, float* m, float* x, int64_t from) {
  for (int64_t i = from; i < n; ++i) {
    const float w = work[i];
    m[i] = w;
    x[i] = onebit_adam_param<kDecay>(w, denom[i], x[i], decay, value, floor_denom, cap);
  }
}

#if HVDC_AVX2_FMA_KERNELS
template <bool kL2>
HVDC_AVX2_FMA void momentum_avx2(const float* g, const float* m, const float* x, int64_t n, float omb1, float l2,
                                 float b1, float* work) {
  const __m256 vomb1 = _mm256_set1_ps(omb1), vl2 = _mm256_set1_ps(l2), vb1 = _mm256_set1_ps(b1);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    __m256 w = _mm256_mul_ps(_mm256_loadu_ps(g + i), vomb1);
    if (kL2) w = _mm256_fmadd_ps(_mm256_loadu_ps(x + i), vl2, w);
    _mm256_storeu_ps(work + i, _mm256_fmadd_ps(_mm256_loadu_ps(m + i), vb1, w));
  }
  momentum_scalar<kL2>(g, m, x, n, omb1, l2, b1, work, i);
}

template <bool kDecay>
HVDC_AVX2_FMA void adam_apply_avx2(const float* work, const float* denom, int64_t n, float decay, float value,
                                   float floor_denom, float cap, float* m, float* x) {
  const __m256 vdecay = _mm256_set1_ps(decay), vvalue = _mm256_set1_ps(value);
  const __m256 vfloor = _mm256_set1_ps(floor_denom), vcap = _mm256_set1_ps(cap);
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 w = _mm256_loadu_ps(work + i);
    _mm256_storeu_ps(m + i, w);
    __m256 xv = _mm256_loadu_ps(x + i);
    if (kDecay) xv = _mm256_mul_ps(xv, vdecay);
    __m256 d = _mm256_loadu_ps(denom + i);
    // max(d, c) where d <= floor_denom; _mm256_max_ps(c, d) is c > d ? c : d, the scalar code's choice.
    const __m256 c = _mm256_mul_ps(_mm256_and_ps(w, abs_mask), vcap);
    d = _mm256_blendv_ps(d, _mm256_max_ps(c, d), _mm256_cmp_ps(d, vfloor, _CMP_LE_OQ));
    const __m256 step = _mm256_div_ps(_mm256_mul_ps(w, vvalue), d);
    _mm256_storeu_ps(x + i, _mm256_add_ps(xv, step));
  }
  adam_apply_scalar<kDecay>(work, denom, n, decay, value, floor_denom, cap, m, x, i);
}
#endif

}  // namespace

void onebit_local_momentum(const float* g, const float* m, const float* x, int64_t n, float one_minus_b1, float l2,
                           float b1, float* work, KernelChoice choice) {
#if HVDC_AVX2_FMA_KERNELS
  if (use_avx2_kernels(choice)) {
    if (x) momentum_avx2<true>(g, m, x, n, one_minus_b1, l2, b1, work);
    else momentum_avx2<false>(g, m, x, n, one_minus_b1, l2, b1, work);
    return;
  }
#else
  (void)choice;
#endif
  if (x) momentum_scalar<true>(g, m, x, n, one_minus_b1, l2, b1, work, 0);
  else momentum_scalar<false>(g, m, x, n, one_minus_b1, l2, b1, work, 0);
}

void onebit_adam_apply(const float* work, const float* denom, int64_t n, float decay, float value,
                       float floor_denom, float cap, float* m, float* x, KernelChoice choice) {
  const bool decays = decay != 1.0f;  // x * 1 is x: the backend's multiply by a float 1 changes no bit
#if HVDC_AVX2_FMA_KERNELS
  if (use_avx2_kernels(choice)) {
    if (decays) adam_apply_avx2<true>(work, denom, n, decay, value, floor_denom, cap, m, x);
    else adam_apply_avx2<false>(work, denom, n, decay, value, floor_denom, cap, m, x);
    return;
  }
#else
  (void)choice;
#endif
  if (decays) adam_apply_scalar<true>(work, denom, n, decay, value, floor_denom, cap, m, x, 0);
  else adam_apply_scalar<false>(work, denom, n, decay, value, floor_denom, cap, m, x, 0);
}

}  // namespace hvdc
