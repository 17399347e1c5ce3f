// The scalar conversions between float32 and the two half types, and the per-element casts that
// the widening/narrowing passes (cast.h) and every kernel with a half-typed buffer run.
// Round to nearest even everywhere; a NaN stays a NaN with its sign, quiet bit set, and its payload's
// top bits (x86's F16C and libgcc's soft-float both do this on the host, the device branch below
// spells it out so that the device gives the same bits).
#pragma once
#include <cstdint>

#include "hvdc/host_device.h"

#if defined(__CUDACC__)
#include <cuda_fp16.h>
#endif

namespace hvdc {

// IEEE binary16. On the host through the compiler's _Float16 (GCC >= 12 on x86-64, clang): exact
// conversions, and F16C instructions where the target has them.
HVDC_HOST_DEVICE inline float half_to_float(uint16_t h) {
#if defined(__CUDA_ARCH__)
  if ((h & 0x7c00u) == 0x7c00u && (h & 0x03ffu) != 0)
    return bits_float((static_cast<uint32_t>(h & 0x8000u) << 16) | 0x7fc00000u |
                      (static_cast<uint32_t>(h & 0x03ffu) << 13));
  return __half2float(__ushort_as_half(h));
#else
  _Float16 v;
  std::memcpy(&v, &h, 2);
  return static_cast<float>(v);
#endif
}

HVDC_HOST_DEVICE inline uint16_t float_to_half(float f) {
#if defined(__CUDA_ARCH__)
  const uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u)
    return static_cast<uint16_t>(((u >> 16) & 0x8000u) | 0x7e00u | ((u >> 13) & 0x03ffu));
  return __half_as_ushort(__float2half_rn(f));
#else
  _Float16 v = static_cast<_Float16>(f);
  uint16_t h;
  std::memcpy(&h, &v, 2);
  return h;
#endif
}

// A double rounded once to binary16 (Adasum stores its double combine this way).
HVDC_HOST_DEVICE inline uint16_t double_to_half(double d) {
#if defined(__CUDA_ARCH__)
  const uint64_t u = static_cast<uint64_t>(__double_as_longlong(d));
  if ((u & 0x7fffffffffffffffull) > 0x7ff0000000000000ull)
    return static_cast<uint16_t>(((u >> 48) & 0x8000u) | 0x7e00u | ((u >> 42) & 0x03ffu));
  return __half_as_ushort(__double2half(d));
#else
  _Float16 v = static_cast<_Float16>(d);
  uint16_t h;
  std::memcpy(&h, &v, 2);
  return h;
#endif
}

// bfloat16 is the top half of a float32; rounding to nearest-even, NaN kept quiet.
HVDC_HOST_DEVICE inline float bf16_to_float(uint16_t b) {
  return bits_float(static_cast<uint32_t>(b) << 16);
}
HVDC_HOST_DEVICE inline uint16_t float_to_bf16(float f) {
  uint32_t u = float_bits(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x40);
  u += 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}

// Which half type a cast works on: the kernels are templates over it, so the branch is taken once
// per call, not per element.
enum class HalfKind { kFloat16, kBFloat16 };

template <HalfKind K>
HVDC_HOST_DEVICE inline float widen(uint16_t h) {
  return K == HalfKind::kFloat16 ? half_to_float(h) : bf16_to_float(h);
}

// narrow_from_float's element: the float32 product src * scale (one rounding), then the half.
template <HalfKind K>
HVDC_HOST_DEVICE inline uint16_t narrow_scaled(float src, float scale) {
  const float v = src * scale;
  return K == HalfKind::kFloat16 ? float_to_half(v) : float_to_bf16(v);
}

}  // namespace hvdc
