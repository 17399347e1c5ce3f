// What lets one per-element function serve both the CPU kernels and the CUDA kernels
// (specs/gpu.md): HVDC_HOST_DEVICE marks it for both compilers, and the few primitives whose
// spelling differs between host and device (bit casts, an explicit fused multiply-add) are
// written here once, so the element-wise headers under hvdc/elementwise/ stay plain C++.
// Both sides are built without contraction (-ffp-contract=off, nvcc -fmad=false), so a * b + c
// rounds twice everywhere unless hvdc::fma32 asks for one rounding.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define HVDC_HOST_DEVICE __host__ __device__
#else
#define HVDC_HOST_DEVICE
#endif

namespace hvdc {

HVDC_HOST_DEVICE inline uint32_t float_bits(float f) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(f);
#else
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
#endif
}

HVDC_HOST_DEVICE inline float bits_float(uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float f;
  std::memcpy(&f, &u, 4);
  return f;
#endif
}

// a * b + c rounded once: the explicit fused multiply-add that mirrors torch's fmadd (add with
// alpha). __fmaf_rn is never split or reordered by nvcc.
HVDC_HOST_DEVICE inline float fma32(float a, float b, float c) {
#if defined(__CUDA_ARCH__)
  return __fmaf_rn(a, b, c);
#else
  return std::fma(a, b, c);
#endif
}

HVDC_HOST_DEVICE inline float abs32(float a) { return bits_float(float_bits(a) & 0x7fffffffu); }

// Bit j (1 << j) of byte i >> 3 is element i: the wire order of every packed sign in the core.
HVDC_HOST_DEVICE inline int bit_of(const uint8_t* bits, int64_t i) {
  return (bits[i >> 3] >> (i & 7)) & 1;
}

}  // namespace hvdc
