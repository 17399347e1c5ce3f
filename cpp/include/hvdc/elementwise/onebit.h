// The per-element arithmetic of error-compensated 1-bit compression (paper 003, Algorithm 1,
// line 7: worker compress + worker error; line 10: server average + server error + re-compress),
// written once for the CPU kernels (onebit_kernels.cc, their scalar code) and the CUDA kernels
// (cpp/cuda/onebit.cu). The rounding points are those of hvdc/onebit_kernels.h; each function
// below is one of them, so a kernel is only the loop and the memory traffic around these.
#pragma once
#include <cmath>
#include <cstdint>

#include "hvdc/host_device.h"

namespace hvdc {

// The compensated value c = v + e: one float32 addition (v is the buffer element widened to
// float32, or the server's average over ranks).
HVDC_HOST_DEVICE inline float onebit_compensated(float v, float e) { return v + e; }

// The sign bit sent for c: set for c >= 0, so +0 and -0 are sent as +1 (DESIGN.md). NaN gives 0,
// but a NaN never reaches the wire (the sum of squares rejects it first).
HVDC_HOST_DEVICE inline bool onebit_sign(float c) { return c >= 0.0f; }

// c's term of the sum of squares: exact in double (a float32 has 24 significant bits).
HVDC_HOST_DEVICE inline double onebit_square(float c) {
  return static_cast<double>(c) * static_cast<double>(c);
}

// The 1-bit scale of a chunk, ||c||_2 / sqrt(n_real), from its sum of squares; 0 for an empty
// chunk (all padding).
HVDC_HOST_DEVICE inline float onebit_scale_of(double sumsq, int64_t n_real) {
  if (n_real == 0) return 0.0f;
  return static_cast<float>(sqrt(sumsq / static_cast<double>(n_real)));
}

// The new error e = c - (+/-scale): one float32 subtraction, the sign taken as onebit_sign does.
HVDC_HOST_DEVICE inline float onebit_error(float c, float scale) {
  return c >= 0.0f ? c - scale : c + scale;
}

// What a bit decompresses to: +scale for a set bit, -scale for a clear one (exact). T is float,
// or the bit pattern of the scale already rounded to a half type (the result of a half buffer
// takes only these two values, so the kernels round them once, not per element).
template <typename T>
HVDC_HOST_DEVICE inline T onebit_pick(int bit, T pos, T neg) {
  return bit ? pos : neg;
}

// One rank's term in the server's float32 sum over ranks: acc + (+/-scale_r), ranks added in rank
// order from 0.0f.
HVDC_HOST_DEVICE inline float onebit_add_rank(float acc, int bit, float scale) {
  return acc + (bit ? scale : -scale);
}

// Division of the server's sum by the rank count n: a multiplication by 1/n when n is a power of
// two (1/n is then exact and both give the correctly rounded quotient, and the multiply is
// cheaper), a float32 division otherwise.
struct OneBitDivide {
  float n, inv;
  bool pow2;
  HVDC_HOST_DEVICE explicit OneBitDivide(int nranks)
      : n(static_cast<float>(nranks)),
        inv(1.0f / static_cast<float>(nranks)),
        pow2(nranks > 0 && (nranks & (nranks - 1)) == 0) {}
  HVDC_HOST_DEVICE float operator()(float a) const { return pow2 ? a * inv : a / n; }
};

}  // namespace hvdc
