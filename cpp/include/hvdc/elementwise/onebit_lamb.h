// The per-element arithmetic of 1-bit LAMB's fused compression-stage passes (paper 001, Algorithm 1
// lines 14-17 and 20-21; the rules and their scalars are documented in hvdc/onebit_lamb_kernels.h),
// written once for the CPU kernels (onebit_lamb_kernels.cc, their portable code) and the CUDA
// kernels (cpp/cuda/onebit_lamb.cu). The fma32 calls mirror torch's fmadd; sqrt is the correctly
// rounded one on both sides (nvcc's default -prec-sqrt=true).
#pragma once
#include <cmath>

#include "hvdc/host_device.h"

namespace hvdc {

struct OneBitLambMomentsArgs {
  float neg_b1, one_minus_b1, b2, one_minus_b2, sqrt_bc2, floor, eps;
};

// Pass A on one element: reconstructs the gradient from the averaged momentum w, updates the fresh
// variance and m (= w), and returns the frozen / fresh ratio r.
HVDC_HOST_DEVICE inline float onebit_lamb_ratio(float w, float denom, const OneBitLambMomentsArgs& a,
                                                float& m, float& fresh) {
  const float g = fma32(m, a.neg_b1, w) / a.one_minus_b1;
  const float v = fma32(a.one_minus_b2 * g, g, fresh * a.b2);
  fresh = v;
  m = w;
  float s = sqrtf(v) / a.sqrt_bc2;
  s = a.floor > s ? a.floor : s;  // torch's clamp_min: NaN stays NaN
  return denom / (s + a.eps);
}

// Pass A's running max over a layer, NaN as soon as one ratio is NaN (torch's max). Max is exact,
// so any order of the ratios gives the same result.
struct OneBitLambMax {
  float max = -INFINITY;
  bool nan = false;
  HVDC_HOST_DEVICE void add(float r) {
    if (r != r) nan = true;
    else if (r > max) max = r;
  }
  HVDC_HOST_DEVICE void merge(const OneBitLambMax& o) {
    nan = nan || o.nan;
    add(o.max);
  }
  HVDC_HOST_DEVICE float result() const { return nan ? NAN : max; }
};

// Pass B on one element: x + fma(x, wd, (m / denom) / bc1) * scale, the weight-decay term only
// when kDecay.
template <bool kDecay>
HVDC_HOST_DEVICE inline float onebit_lamb_param(float m, float denom, float x, float bc1, float wd,
                                                float scale) {
  float u = m / denom / bc1;
  if (kDecay) u = fma32(x, wd, u);
  return x + u * scale;
}

}  // namespace hvdc
