// out = fma(p, q, base) (see hvdc/scaled_add_kernels.h). Compiled without contraction: the one fma is explicit.
#pragma GCC optimize("fp-contract=off")
#include "hvdc/scaled_add_kernels.h"

#include <cmath>

#if HVDC_AVX2_FMA_KERNELS
#include <immintrin.h>
#endif

namespace hvdc {
namespace {

void scaled_add_scalar(const float* base, const float* p, int64_t n, float q, float* out, int64_t from) {
  for (int64_t i = from; i < n; ++i) out[i] = std::fma(p[i], q, base[i]);
}

#if HVDC_AVX2_FMA_KERNELS
HVDC_AVX2_FMA void scaled_add_avx2(const float* base, const float* p, int64_t n, float q, float* out) {
  const __m256 vq = _mm256_set1_ps(q);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(out + i, _mm256_fmadd_ps(_mm256_loadu_ps(p + i), vq, _mm256_loadu_ps(base + i)));
  scaled_add_scalar(base, p, n, q, out, i);
}
#endif

}  // namespace

void scaled_add(const float* base, const float* p, int64_t n, float q, float* out, KernelChoice choice) {
#if HVDC_AVX2_FMA_KERNELS
  if (use_avx2_kernels(choice)) {
    scaled_add_avx2(base, p, n, q, out);
    return;
  }
#else
  (void)choice;
#endif
  scaled_add_scalar(base, p, n, q, out, 0);
}

}  // namespace hvdc
