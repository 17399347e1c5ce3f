// The per-element arithmetic of Birder's stochastic binary quantization (paper 004, Algorithm 1,
// the quantizer Q of Section 3, lines 8-9 worker and 11-12 server; specs/birder.md 2, 3.2-3.6),
// written once for the CPU kernels (stochastic_kernels.cc, their scalar code) and the CUDA kernels
// (cpp/cuda/stochastic.cu). The rounding points are those of hvdc/stochastic_kernels.h, all float32.
#pragma once
#include <cstdint>

#include "hvdc/host_device.h"

namespace hvdc {

// Q(y) with the uniform u in [0, 1) of this element: true for +1, with p = (y + 1) * 0.5 (no clip:
// u < p is always true for p >= 1, always false for p <= 0). Writes the new error y - Q(y).
HVDC_HOST_DEVICE inline bool birder_quantize(float y, float u, float& error) {
  const bool plus = u < (y + 1.0f) * 0.5f;
  error = y - (plus ? 1.0f : -1.0f);
  return plus;
}

// Birder's moments of one element (spec 3.2-3.4), updated in place from the gradient a; returns
// the ratio m / (b + eps) that the worker compensates and quantizes. omb = float32(1 - beta).
HVDC_HOST_DEVICE inline float birder_moments(float a, float beta, float omb, float eps, float& m,
                                             float& b) {
  m = beta * m + omb * a;
  b = beta * b + omb * abs32(a);
  return m / (b + eps);
}

// The server's average of the n received +/-1 (exact: `ones` set bits among n), compensated with
// its error: float(2 * ones - n) / float(n) + e.
HVDC_HOST_DEVICE inline float birder_server_value(int ones, int nranks, float e) {
  return static_cast<float>(2 * ones - nranks) / static_cast<float>(nranks) + e;
}

}  // namespace hvdc
