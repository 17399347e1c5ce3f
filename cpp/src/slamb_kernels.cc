// SLAMB's fused element-wise passes (see hvdc/slamb_kernels.h). No contraction into FMAs: the backend's
// float32 rounding, step by step.
#pragma GCC optimize("fp-contract=off")
#include "hvdc/slamb_kernels.h"

#include "hvdc/elementwise/slamb.h"
#include "hvdc/mask_lanes.h"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#if HVDC_AVX2_FMA_KERNELS
#include <immintrin.h>
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

// `factor`: where mask is set, u = 1 / (s + eps) instead (slamb_direction_local).
template <bool kFloor, bool kDecay>
void direction_block(const float* m, const float* v, const float* x, const uint8_t* mask, bool factor, int64_t n,
                     float sqrt_bc2, float floor, float eps, float bc1, float wd, float* u) {
  sqrt_block(v, n, u);
  for (int64_t i = 0; i < n; ++i) {
    float s = u[i] / sqrt_bc2;
    if (kFloor) s = std::max(s, floor);
    const float d = 1.0f / (s + eps);
    float r = d * m[i] / bc1;
    if (kDecay) r = r + wd * x[i];
    u[i] = factor && mask[i] ? d : r;
  }
}

template <bool kFloor, bool kDecay>
SlambNorms direction(const float* m, const float* v, const float* x, const uint8_t* mask, bool factor, int64_t n,
                     float sqrt_bc2, float floor, float eps, float bc1, float wd, float* u) {
  SlambNorms r;
  for (int64_t i = 0; i < n; i += kBlock) {
    const int64_t len = std::min(kBlock, n - i);
    direction_block<kFloor, kDecay>(m + i, v + i, x + i, mask + i, factor, len, sqrt_bc2, floor, eps, bc1, wd,
                                    u + i);
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

#if HVDC_AVX2_FMA_KERNELS
// The same pass on 8-float vectors: every lane does the portable code's float operations in its order (no
// FMA), and lane l of a block's norm accumulators sums elements b + l as mask_sum_squares' lane l does, so u
// and the four sums are bit for bit the portable ones. The portable code is compute-bound here (three
// divisions per element, and the byte mask turned into floats by scalar code).
template <bool kFloor, bool kDecay>
HVDC_AVX2_FMA SlambNorms direction_avx2(const float* m, const float* v, const float* x, const uint8_t* mask,
                                        bool factor, int64_t n, float sqrt_bc2, float floor, float eps, float bc1,
                                        float wd, float* u) {
  const __m256 vbc2 = _mm256_set1_ps(sqrt_bc2), vfloor = _mm256_set1_ps(floor), veps = _mm256_set1_ps(eps),
               vbc1 = _mm256_set1_ps(bc1), vwd = _mm256_set1_ps(wd), one = _mm256_set1_ps(1.0f);
  SlambNorms r;
  int64_t i = 0;
  for (; i + kBlock <= n; i += kBlock) {
    __m256 x_in = _mm256_setzero_ps(), x_out = x_in, u_in = x_in, u_out = x_in;
    for (int64_t b = i; b < i + kBlock; b += 8) {
      __m256 s = _mm256_div_ps(_mm256_sqrt_ps(_mm256_loadu_ps(v + b)), vbc2);
      if (kFloor) s = _mm256_max_ps(vfloor, s);  // (floor > s) ? floor : s, as std::max(s, floor), NaN kept
      const __m256 d = _mm256_div_ps(one, _mm256_add_ps(s, veps));
      __m256 q = _mm256_div_ps(_mm256_mul_ps(d, _mm256_loadu_ps(m + b)), vbc1);
      const __m256 xv = _mm256_loadu_ps(x + b);
      if (kDecay) q = _mm256_add_ps(q, _mm256_mul_ps(vwd, xv));
      const __m256i bytes = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(mask + b)));
      _mm256_storeu_ps(u + b, factor ? _mm256_blendv_ps(q, d, _mm256_castsi256_ps(_mm256_cmpgt_epi32(
                                                                  bytes, _mm256_setzero_si256())))
                                     : q);
      const __m256 sel = _mm256_cvtepi32_ps(bytes);
      const __m256 xx = _mm256_mul_ps(xv, xv), uu = _mm256_mul_ps(q, q);
      const __m256 xs = _mm256_mul_ps(sel, xx), us = _mm256_mul_ps(sel, uu);
      x_in = _mm256_add_ps(x_in, xs);
      x_out = _mm256_add_ps(x_out, _mm256_sub_ps(xx, xs));
      u_in = _mm256_add_ps(u_in, us);
      u_out = _mm256_add_ps(u_out, _mm256_sub_ps(uu, us));
    }
    alignas(32) float lanes[4][8];
    _mm256_store_ps(lanes[0], x_in);
    _mm256_store_ps(lanes[1], x_out);
    _mm256_store_ps(lanes[2], u_in);
    _mm256_store_ps(lanes[3], u_out);
    for (int l = 0; l < 8; ++l) {
      r.x.selected += lanes[0][l];
      r.x.unselected += lanes[1][l];
      r.u.selected += lanes[2][l];
      r.u.unselected += lanes[3][l];
    }
    const int64_t count = mask_count(mask + i, kBlock);
    r.x.count += count;
    r.u.count += count;
  }
  if (i < n) {  // the last partial block: the portable code (its sums are in double there)
    const SlambNorms t =
        direction<kFloor, kDecay>(m + i, v + i, x + i, mask + i, factor, n - i, sqrt_bc2, floor, eps, bc1, wd, u + i);
    r.x.selected += t.x.selected;
    r.x.unselected += t.x.unselected;
    r.x.count += t.x.count;
    r.u.selected += t.u.selected;
    r.u.unselected += t.u.unselected;
    r.u.count += t.u.count;
  }
  return r;
}
#endif

template <bool kFloor, bool kDecay>
SlambNorms direction_for(KernelChoice choice, const float* m, const float* v, const float* x, const uint8_t* mask,
                         bool factor, int64_t n, float sqrt_bc2, float floor, float eps, float bc1, float wd,
                         float* u) {
#if HVDC_AVX2_FMA_KERNELS
  if (use_avx2_kernels(choice))
    return direction_avx2<kFloor, kDecay>(m, v, x, mask, factor, n, sqrt_bc2, floor, eps, bc1, wd, u);
#else
  (void)choice;
#endif
  return direction<kFloor, kDecay>(m, v, x, mask, factor, n, sqrt_bc2, floor, eps, bc1, wd, u);
}

SlambNorms direction_any(KernelChoice choice, const float* m, const float* v, const float* x, const uint8_t* mask,
                         bool factor, int64_t n, float sqrt_bc2, float floor, float eps, float bc1, float wd,
                         float* u) {
  const bool fl = floor > 0.0f, dec = wd != 0.0f;
  if (fl && dec) return direction_for<true, true>(choice, m, v, x, mask, factor, n, sqrt_bc2, floor, eps, bc1, wd, u);
  if (fl) return direction_for<true, false>(choice, m, v, x, mask, factor, n, sqrt_bc2, floor, eps, bc1, wd, u);
  if (dec) return direction_for<false, true>(choice, m, v, x, mask, factor, n, sqrt_bc2, floor, eps, bc1, wd, u);
  return direction_for<false, false>(choice, m, v, x, mask, factor, n, sqrt_bc2, floor, eps, bc1, wd, u);
}

// From element i and compact index j on: the selected elements one by one (the portable pass, and the vector
// pass's tail). u[i] holds the factor d = 1 / (s + eps) of slamb_direction_local; u = d * m / bc1 (+ wd x) as
// slamb_direction rounds it.
template <bool kDecay>
MaskedDirection masked_direction_tail(const float* m_avg, int64_t count, const float* x, const uint8_t* mask,
                                      int64_t n, float bc1, float wd, float* m, float* u, int64_t i, int64_t j,
                                      double sum) {
  for (; i < n; ++i) {
    if (!mask[i]) continue;
    if (j == count) return {sum, -1};  // more selected than averaged: the caller's buffers disagree
    float r = u[i] * m_avg[j] / bc1;
    if (kDecay) r = r + wd * x[i];
    m[i] = m_avg[j++];
    u[i] = r;
    sum += static_cast<double>(r) * r;
  }
  return {sum, j};
}

#if HVDC_AVX2_FMA_KERNELS
// Groups of 8 elements: the group's averaged values moved to their lanes (the scatter's expand permutation), u of
// all 8 lanes, both blended into m and u on the selected lanes only. A group whose 8 loads could pass m_avg's end
// goes to the tail.
template <bool kDecay>
HVDC_AVX2_FMA MaskedDirection masked_direction_avx2(const float* m_avg, int64_t count, const float* x,
                                                    const uint8_t* mask, int64_t n, float bc1, float wd, float* m,
                                                    float* u) {
  const MaskLaneTables& t = mask_lane_tables();
  const __m256 vbc1 = _mm256_set1_ps(bc1), vwd = _mm256_set1_ps(wd);
  const __m256i lanes = _mm256_set_epi32(128, 64, 32, 16, 8, 4, 2, 1);
  __m256d sum = _mm256_setzero_pd();
  int64_t i = 0, j = 0;
  for (; i + 8 <= n && j + 8 <= count; i += 8) {
    // No branch on an empty group (about 43% at k = 0.1, unpredictably): its blends keep every lane.
    const uint32_t bits = mask_bits8(mask + i);
    const __m256 mv = _mm256_permutevar8x32_ps(
        _mm256_loadu_ps(m_avg + j), _mm256_load_si256(reinterpret_cast<const __m256i*>(t.expand[bits])));
    const __m256 d = _mm256_loadu_ps(u + i);
    __m256 q = _mm256_div_ps(_mm256_mul_ps(d, mv), vbc1);
    if (kDecay) q = _mm256_add_ps(q, _mm256_mul_ps(vwd, _mm256_loadu_ps(x + i)));
    const __m256 keep = _mm256_castsi256_ps(
        _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32(static_cast<int>(bits)), lanes), lanes));
    _mm256_storeu_ps(m + i, _mm256_blendv_ps(_mm256_loadu_ps(m + i), mv, keep));
    _mm256_storeu_ps(u + i, _mm256_blendv_ps(d, q, keep));
    const __m256 qq = _mm256_and_ps(keep, _mm256_mul_ps(q, q));
    sum = _mm256_add_pd(sum, _mm256_add_pd(_mm256_cvtps_pd(_mm256_castps256_ps128(qq)),
                                           _mm256_cvtps_pd(_mm256_extractf128_ps(qq, 1))));
    j += __builtin_popcount(bits);
  }
  alignas(32) double parts[4];
  _mm256_store_pd(parts, sum);
  return masked_direction_tail<kDecay>(m_avg, count, x, mask, n, bc1, wd, m, u, i, j,
                                       parts[0] + parts[1] + parts[2] + parts[3]);
}
#endif

template <bool kDecay>
MaskedDirection masked_direction_for(KernelChoice choice, const float* m_avg, int64_t count, const float* x,
                                     const uint8_t* mask, int64_t n, float bc1, float wd, float* m, float* u) {
#if HVDC_AVX2_FMA_KERNELS
  if (use_avx2_kernels(choice)) return masked_direction_avx2<kDecay>(m_avg, count, x, mask, n, bc1, wd, m, u);
#else
  (void)choice;
#endif
  return masked_direction_tail<kDecay>(m_avg, count, x, mask, n, bc1, wd, m, u, 0, 0, 0.0);
}

int64_t momentum_gather_portable(const float* m, const float* g, const uint8_t* mask, int64_t n, float b1,
                                 float* out, int64_t capacity, int64_t i, int64_t j) {
  const float a = 1.0f - b1;
  for (; i < n; ++i) {
    if (!mask[i]) continue;
    if (j == capacity) return -1;
    out[j++] = slamb_momentum_of(m[i], g[i], b1, a);
  }
  return j;
}

#if HVDC_AVX2_FMA_KERNELS
// Groups of 8: step 3 on all 8 lanes, the selected ones moved to the front (the gather's compress permutation) and
// stored at out + j; an empty group's store is overwritten by the next (no branch: at k = 0.1 about 43% of groups
// are empty, unpredictably). A group whose store could pass out's room goes to the tail.
HVDC_AVX2_FMA int64_t momentum_gather_avx2(const float* m, const float* g, const uint8_t* mask, int64_t n, float b1,
                                           float* out, int64_t capacity) {
  const MaskLaneTables& t = mask_lane_tables();
  const __m256 vb1 = _mm256_set1_ps(b1), va = _mm256_set1_ps(1.0f - b1);
  int64_t i = 0, j = 0;
  for (; i + 8 <= n && j + 8 <= capacity; i += 8) {
    const uint32_t bits = mask_bits8(mask + i);
    const __m256 w = _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(m + i), vb1),
                                   _mm256_mul_ps(va, _mm256_loadu_ps(g + i)));
    _mm256_storeu_ps(out + j, _mm256_permutevar8x32_ps(
                                  w, _mm256_load_si256(reinterpret_cast<const __m256i*>(t.compress[bits]))));
    j += __builtin_popcount(bits);
  }
  return momentum_gather_portable(m, g, mask, n, b1, out, capacity, i, j);
}
#endif

}  // namespace

int64_t slamb_momentum_gather(const float* m, const float* g, const uint8_t* mask, int64_t n, float b1, float* out,
                              int64_t capacity, KernelChoice choice) {
#if HVDC_AVX2_FMA_KERNELS
  if (use_avx2_kernels(choice)) return momentum_gather_avx2(m, g, mask, n, b1, out, capacity);
#else
  (void)choice;
#endif
  return momentum_gather_portable(m, g, mask, n, b1, out, capacity, 0, 0);
}

MaskedDirection slamb_masked_direction(const float* m_avg, int64_t count, const float* x, const uint8_t* mask,
                                       int64_t n, float bc1, float wd, float* m, float* u, KernelChoice choice) {
  if (wd != 0.0f) return masked_direction_for<true>(choice, m_avg, count, x, mask, n, bc1, wd, m, u);
  return masked_direction_for<false>(choice, m_avg, count, x, mask, n, bc1, wd, m, u);
}

void slamb_momentum(const float* m, const float* g, int64_t n, float b1, float* work) {
  const float a = 1.0f - b1;
  for (int64_t i = 0; i < n; ++i) work[i] = slamb_momentum_of(m[i], g[i], b1, a);
}

namespace {

// v = b2 * v + (1 - b2) * g * g with `update_m(k)` beside it per element, from element i on; returns `total` plus
// the sum of the new v, in fixed-width float lanes per block so that it vectorizes without reassociation (no
// fast-math), the last partial block element by element.
template <typename UpdateM>
double moments_pass(const float* g, int64_t n, float b2, float* v, UpdateM&& update_m, int64_t i = 0,
                    double total = 0.0) {
  constexpr int kLanes = 8;
  const float a = 1.0f - b2;
  for (; i + kBlock <= n; i += kBlock) {
    float lane[kLanes] = {};
    for (int64_t b = 0; b < kBlock; b += kLanes) {
      for (int l = 0; l < kLanes; ++l) {
        const int64_t k = i + b + l;
        update_m(k);
        const float nv = slamb_variance_of(v[k], g[k], b2, a);
        v[k] = nv;
        lane[l] += nv;
      }
    }
    for (int l = 0; l < kLanes; ++l) total += lane[l];
  }
  for (; i < n; ++i) {
    update_m(i);
    v[i] = slamb_variance_of(v[i], g[i], b2, a);
    total += v[i];
  }
  return total;
}

// slamb_local_moments' portable pass: m as slamb_momentum rounds it where not selected.
double local_moments(const float* g, const uint8_t* mask, int64_t n, float b1, float b2, float* m, float* v,
                     int64_t i = 0, double total = 0.0) {
  const float a1 = 1.0f - b1;
  return moments_pass(
      g, n, b2, v,
      [&](int64_t k) {
        const float nm = slamb_momentum_of(m[k], g[k], b1, a1);
        m[k] = mask[k] ? m[k] : nm;
      },
      i, total);
}

#if HVDC_AVX2_FMA_KERNELS
// The same on 8-float vectors (no FMA; lane l sums what the portable lane l sums): the portable loop's select on
// a mask byte keeps the compiler from vectorizing it.
HVDC_AVX2_FMA double local_moments_avx2(const float* g, const uint8_t* mask, int64_t n, float b1, float b2,
                                        float* m, float* v) {
  const __m256 vb1 = _mm256_set1_ps(b1), va1 = _mm256_set1_ps(1.0f - b1), vb2 = _mm256_set1_ps(b2),
               va2 = _mm256_set1_ps(1.0f - b2);
  double total = 0.0;
  int64_t i = 0;
  for (; i + kBlock <= n; i += kBlock) {
    __m256 lane = _mm256_setzero_ps();
    for (int64_t b = i; b < i + kBlock; b += 8) {
      const __m256 gv = _mm256_loadu_ps(g + b), mv = _mm256_loadu_ps(m + b);
      const __m256 nm = _mm256_add_ps(_mm256_mul_ps(mv, vb1), _mm256_mul_ps(va1, gv));
      const __m256 keep = _mm256_castsi256_ps(_mm256_cmpgt_epi32(
          _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(mask + b))), _mm256_setzero_si256()));
      _mm256_storeu_ps(m + b, _mm256_blendv_ps(nm, mv, keep));
      const __m256 nv =
          _mm256_add_ps(_mm256_mul_ps(_mm256_loadu_ps(v + b), vb2), _mm256_mul_ps(va2, _mm256_mul_ps(gv, gv)));
      _mm256_storeu_ps(v + b, nv);
      lane = _mm256_add_ps(lane, nv);
    }
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, lane);
    for (int l = 0; l < 8; ++l) total += lanes[l];
  }
  return local_moments(g, mask, n, b1, b2, m, v, i, total);  // the last partial block, summed as the portable pass
}
#endif

}  // namespace

double slamb_moments(const float* work, const float* g, int64_t n, float b2, float* m, float* v) {
  return moments_pass(g, n, b2, v, [&](int64_t k) { m[k] = work[k]; });
}

double slamb_local_moments(const float* g, const uint8_t* mask, int64_t n, float b1, float b2, float* m, float* v,
                           KernelChoice choice) {
#if HVDC_AVX2_FMA_KERNELS
  if (use_avx2_kernels(choice)) return local_moments_avx2(g, mask, n, b1, b2, m, v);
#else
  (void)choice;
#endif
  return local_moments(g, mask, n, b1, b2, m, v);
}

SlambNorms slamb_direction(const float* m, const float* v, const float* x, const uint8_t* mask, int64_t n,
                           float sqrt_bc2, float floor, float eps, float bc1, float wd, float* u, KernelChoice choice) {
  return direction_any(choice, m, v, x, mask, false, n, sqrt_bc2, floor, eps, bc1, wd, u);
}

SlambNorms slamb_direction_local(const float* m, const float* v, const float* x, const uint8_t* mask, int64_t n,
                                 float sqrt_bc2, float floor, float eps, float bc1, float wd, float* u,
                                 KernelChoice choice) {
  return direction_any(choice, m, v, x, mask, true, n, sqrt_bc2, floor, eps, bc1, wd, u);
}

void slamb_apply(const float* u, const float* c, int64_t n, float dphi, float phi_min, float clip_min,
                 float clip_max, float deta, float eta_min, float* x) {
  for (int64_t i = 0; i < n; ++i) {
    x[i] = slamb_apply_of(u[i], c[i], x[i], dphi, phi_min, clip_min, clip_max, deta, eta_min);
  }
}

}  // namespace hvdc
