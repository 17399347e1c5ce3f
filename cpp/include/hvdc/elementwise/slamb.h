// The per-element arithmetic of SLAMB's fused passes (spec shared/specs/slamb.md section 2 steps 3,
// 5 and 8; the passes and their scalars are documented in hvdc/slamb_kernels.h), written once for
// the CPU kernels (slamb_kernels.cc, their portable code; the AVX2 code does the same operations
// lane by lane) and the CUDA kernels (cpp/cuda/slamb.cu). No fused multiply-add: every * and +
// rounds on its own, as the backend's separate tensor ops round (both sides build without
// contraction).
#pragma once
#include "hvdc/host_device.h"

namespace hvdc {

// Step 3: b1 * m + (1 - b1) * g, with one_minus_b1 = 1 - b1 rounded to float once by the caller.
HVDC_HOST_DEVICE inline float slamb_momentum_of(float m, float g, float b1, float one_minus_b1) {
  return m * b1 + one_minus_b1 * g;
}

// Step 5: b2 * v + (1 - b2) * g * g, one_minus_b2 as above.
HVDC_HOST_DEVICE inline float slamb_variance_of(float v, float g, float b2, float one_minus_b2) {
  return v * b2 + one_minus_b2 * (g * g);
}

// Step 8 on one element: phi = clamp(c * dphi + phi_min, clip_min, clip_max) (std::max then std::min,
// so a NaN product stays NaN as there), eta = c * deta + eta_min, x - (u * phi) * eta.
HVDC_HOST_DEVICE inline float slamb_apply_of(float u, float c, float x, float dphi, float phi_min,
                                             float clip_min, float clip_max, float deta,
                                             float eta_min) {
  const float t = c * dphi + phi_min;
  const float lo = t < clip_min ? clip_min : t;     // std::max(t, clip_min)
  const float phi = clip_max < lo ? clip_max : lo;  // std::min(lo, clip_max)
  const float eta = c * deta + eta_min;
  return x - (u * phi) * eta;
}

}  // namespace hvdc
