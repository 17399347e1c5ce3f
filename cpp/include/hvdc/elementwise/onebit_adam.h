// The per-element arithmetic of 1-bit Adam's fused compression-stage passes (paper 003,
// Algorithm 1 line 6 and lines 12-13; the rules and their scalars are documented in
// hvdc/onebit_adam_kernels.h), written once for the CPU kernels (onebit_adam_kernels.cc, their
// portable code) and the CUDA kernels (cpp/cuda/onebit_adam.cu). The only single-rounding
// multiply-adds are the explicit fma32 that mirror torch's fmadd; everything else rounds step by
// step, as the backend path does.
#pragma once
#include "hvdc/host_device.h"

namespace hvdc {

// Line 6, the local momentum: fma(m, b1, fma(x, l2, g * omb1)); the L2 term only when kL2 (adding
// 0 * x is not neutral for an infinite x).
template <bool kL2>
HVDC_HOST_DEVICE inline float onebit_momentum(float g, float m, float x, float omb1, float l2,
                                              float b1) {
  float w = g * omb1;
  if (kL2) w = fma32(x, l2, w);
  return fma32(m, b1, w);
}

// Lines 12-13 on one element: m = w (the compressed average, stored by the caller), then
// x = x * decay (only when kDecay), d = denom, lifted to |w| * cap where d <= floor_denom, and
// x + (w * value) / d is the new parameter.
template <bool kDecay>
HVDC_HOST_DEVICE inline float onebit_adam_param(float w, float denom, float x, float decay,
                                                float value, float floor_denom, float cap) {
  if (kDecay) x = x * decay;
  float d = denom;
  if (d <= floor_denom) {
    const float c = abs32(w) * cap;
    if (c > d) d = c;
  }
  return x + w * value / d;
}

}  // namespace hvdc
