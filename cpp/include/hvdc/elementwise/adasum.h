// The per-element arithmetic of one Adasum pair step (paper 002, Algorithm 1, line 15: the terms of
// the dot product and squared norms; line 18: the combine), written once for the CPU kernels
// (adasum_kernels.cc, their scalar code and the tails of their vector code) and the CUDA kernels
// (cpp/cuda/adasum.cu). Everything runs in double whatever the storage type (hvdc/adasum_kernels.h);
// the storage accessors below are where a value is widened exactly and rounded once on store.
#pragma once
#include <cstdint>
#include <string>

#include "hvdc/dtype.h"
#include "hvdc/elementwise/half.h"
#include "hvdc/errors.h"
#include "hvdc/host_device.h"

namespace hvdc {

// Storage accessors, one per dtype: load widens exactly to double, store rounds once (bfloat16:
// through float32, as the CPU always did).
struct AdasumF32 {
  using T = float;
  HVDC_HOST_DEVICE static double load(const T* p, int64_t i) { return p[i]; }
  HVDC_HOST_DEVICE static void store(T* p, int64_t i, double v) { p[i] = static_cast<float>(v); }
};
struct AdasumF64 {
  using T = double;
  HVDC_HOST_DEVICE static double load(const T* p, int64_t i) { return p[i]; }
  HVDC_HOST_DEVICE static void store(T* p, int64_t i, double v) { p[i] = v; }
};
struct AdasumF16 {
  using T = uint16_t;
  HVDC_HOST_DEVICE static double load(const T* p, int64_t i) { return half_to_float(p[i]); }
  HVDC_HOST_DEVICE static void store(T* p, int64_t i, double v) { p[i] = double_to_half(v); }
};
struct AdasumBF16 {
  using T = uint16_t;
  HVDC_HOST_DEVICE static double load(const T* p, int64_t i) { return bf16_to_float(p[i]); }
  HVDC_HOST_DEVICE static void store(T* p, int64_t i, double v) {
    p[i] = float_to_bf16(static_cast<float>(v));
  }
};

// f(accessor) for the storage dtype (host code: the kernels' dispatch, CPU and CUDA alike).
template <typename F>
auto adasum_dispatch(DType dtype, F&& f) {
  switch (dtype) {
    case DType::kFloat32: return f(AdasumF32{});
    case DType::kFloat64: return f(AdasumF64{});
    case DType::kFloat16: return f(AdasumF16{});
    case DType::kBFloat16: return f(AdasumBF16{});
    default: break;
  }
  throw UsageError(std::string("Adasum is not defined for ") + dtype_name(dtype));
}

// Line 18 on one element: left_coeff * x + right_coeff * y, two products and a sum, each rounded.
HVDC_HOST_DEVICE inline double adasum_mix(double left_coeff, double x, double right_coeff,
                                          double y) {
  return left_coeff * x + right_coeff * y;
}

// The weight of one side, 1 - dot / (2 |x|^2); 1 where |x|^2 < sqrt(DBL_MIN) = 2^-511 (a zero
// vector, or one so small that the quotient is meaningless).
HVDC_HOST_DEVICE inline double adasum_coefficient_of(double dot, double norm_sq) {
  if (norm_sq < 0x1p-511) return 1.0;
  return 1.0 - dot / norm_sq * 0.5;
}

}  // namespace hvdc
