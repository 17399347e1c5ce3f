// SLAMB's fused element-wise passes (see hvdc/slamb_kernels.h). No contraction into FMAs: the backend's
// float32 rounding, step by step.
#pragma GCC optimize("fp-contract=off")
#include "hvdc/slamb_kernels.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include <algorithm>
#include <cmath>

namespace hvdc {
namespace {

// Blocks small enough to stay in L1 between the element pass and the norm pass over them.
constexpr int64_t kBlock = 1024;

// out = sqrt(v). std::sqrt may set errno, so the compiler keeps a libm call per element and does not
// vectorize the loop around it; sqrtps is as correctly rounded as sqrtss.
void sqrt_block(const float* v, int64_t n, float* out) {
  int64_t i = 0;
#if defined(__SSE2__)
  for (; i + 4 <= n; i += 4) _mm_storeu_ps(out + i, _mm_sqrt_ps(_mm_loadu_ps(v + i)));
#endif
  for (; i < n; ++i) out[i] = std::sqrt(v[i]);
}

template <bool kFloor, bool kDecay>
void direction_block(const float* m, const float* v, const float* x, int64_t n, float sqrt_bc2, float floor,
                     float eps, float bc1, float wd, float* u) {
  sqrt_block(v, n, u);
  for (int64_t i = 0; i < n; ++i) {
    float s = u[i] / sqrt_bc2;
    if (kFloor) s = std::max(s, floor);
    float r = (1.0f / (s + eps)) * m[i] / bc1;
    if (kDecay) r = r + wd * x[i];
    u[i] = r;
  }
}

template <bool kFloor, bool kDecay>
SlambNorms direction(const float* m, const float* v, const float* x, const uint8_t* mask, int64_t n,
                     float sqrt_bc2, float floor, float eps, float bc1, float wd, float* u) {
  SlambNorms r;
  for (int64_t i = 0; i < n; i += kBlock) {
    const int64_t len = std::min(kBlock, n - i);
    direction_block<kFloor, kDecay>(m + i, v + i, x + i, len, sqrt_bc2, floor, eps, bc1, wd, u + i);
    const MaskedSumSquares xs = mask_sum_squares(x + i, mask + i, len);
    const MaskedSumSquares us = mask_sum_squares(u + i, mask + i, len);
    r.x.selected += xs.selected;
    r.x.unselected += xs.unselected;
    r.x.count += xs.count;
    r.u.selected += us.selected;
    r.u.unselected += us.unselected;
    r.u.count += us.count;
  }
  return r;
}

}  // namespace

void slamb_momentum(const float* m, const float* g, int64_t n, float b1, float* work) {
  const float a = 1.0f - b1;
  for (int64_t i = 0; i < n; ++i) work[i] = m[i] * b1 + a * g[i];
}

double slamb_moments(const float* work, const float* g, int64_t n, float b2, float* m, float* v) {
  // Fixed-width float lanes per block so that the sum vectorizes without reassociation (no fast-math).
  constexpr int kLanes = 8;
  const float a = 1.0f - b2;
  double total = 0.0;
  int64_t i = 0;
  for (; i + kBlock <= n; i += kBlock) {
    float lane[kLanes] = {};
    for (int64_t b = 0; b < kBlock; b += kLanes) {
      for (int l = 0; l < kLanes; ++l) {
        const int64_t k = i + b + l;
        m[k] = work[k];
        const float nv = v[k] * b2 + a * (g[k] * g[k]);
        v[k] = nv;
        lane[l] += nv;
      }
    }
    for (int l = 0; l < kLanes; ++l) total += lane[l];
  }
  for (; i < n; ++i) {
    m[i] = work[i];
    v[i] = v[i] * b2 + a * (g[i] * g[i]);
    total += v[i];
  }
  return total;
}

SlambNorms slamb_direction(const float* m, const float* v, const float* x, const uint8_t* mask, int64_t n,
                           float sqrt_bc2, float floor, float eps, float bc1, float wd, float* u) {
  const bool fl = floor > 0.0f, dec = wd != 0.0f;
  if (fl && dec) return direction<true, true>(m, v, x, mask, n, sqrt_bc2, floor, eps, bc1, wd, u);
  if (fl) return direction<true, false>(m, v, x, mask, n, sqrt_bc2, floor, eps, bc1, wd, u);
  if (dec) return direction<false, true>(m, v, x, mask, n, sqrt_bc2, floor, eps, bc1, wd, u);
  return direction<false, false>(m, v, x, mask, n, sqrt_bc2, floor, eps, bc1, wd, u);
}

void slamb_apply(const float* u, const float* c, int64_t n, float dphi, float phi_min, float clip_min,
                 float clip_max, float deta, float eta_min, float* x) {
  for (int64_t i = 0; i < n; ++i) {
    const float phi = std::min(std::max(c[i] * dphi + phi_min, clip_min), clip_max);
    const float eta = c[i] * deta + eta_min;
    x[i] = x[i] - (u[i] * phi) * eta;
  }
}

}  // namespace hvdc
