// The per-element arithmetic of the compression= path's top-k and random-k allreduce
// (hvdc/sparse_allreduce.h), written once for the CPU's device table (cpp/src/cpu_device.cc) and
// the CUDA one (cpp/cuda/device_table.cu): one element's float32 value, DGC's velocity and the
// compensated value c, with the rounding points of the NumPy reference
// (hvd_compress/reference/compression.py): u = mu * u + x and c = e + u, two float32 roundings each.
#pragma once
#include <cstdint>

#include "hvdc/dtype.h"
#include "hvdc/elementwise/half.h"
#include "hvdc/host_device.h"

namespace hvdc {

// Element i of `x` (float32, float64, float16 or bfloat16) as float32: float64 rounded once, half
// widened exactly.
HVDC_HOST_DEVICE inline float sparse_load(const void* x, DType dtype, int64_t i) {
  switch (dtype) {
    case DType::kFloat64: return static_cast<float>(static_cast<const double*>(x)[i]);
    case DType::kFloat16: return half_to_float(static_cast<const uint16_t*>(x)[i]);
    case DType::kBFloat16: return bf16_to_float(static_cast<const uint16_t*>(x)[i]);
    default: return static_cast<const float*>(x)[i];
  }
}

// float32 `v` into element i of `out` (the dtypes of sparse_load): half rounded to nearest even.
HVDC_HOST_DEVICE inline void sparse_store(float v, void* out, DType dtype, int64_t i) {
  switch (dtype) {
    case DType::kFloat64: static_cast<double*>(out)[i] = v; return;
    case DType::kFloat16: static_cast<uint16_t*>(out)[i] = float_to_half(v); return;
    case DType::kBFloat16: static_cast<uint16_t*>(out)[i] = float_to_bf16(v); return;
    default: static_cast<float*>(out)[i] = v;
  }
}

// The compensated value of one element, x plus error e; with momentum correction (u not null, DGC)
// *u becomes mu * u + x first and c = e + u.
HVDC_HOST_DEVICE inline float sparse_compensated(float x, float e, float mu, float* u) {
  if (u == nullptr) return e + x;
  *u = mu * *u + x;
  return e + *u;
}

}  // namespace hvdc
