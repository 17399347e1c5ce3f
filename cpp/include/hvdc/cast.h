// Widening and narrowing passes between the storage dtype of a buffer and the float32/float64
// accumulation type; the half types are never summed in their own precision.
#pragma once
#include <cstdint>

#include "hvdc/dtype.h"

namespace hvdc {

// dst[i] = float(src[i]) for a half-typed src.
void widen_to_float(const void* src, DType dtype, float* dst, int64_t n);
// dst[i] = half(src[i] * scale) for a half-typed dst.
void narrow_from_float(const float* src, float scale, void* dst, DType dtype, int64_t n);
// buf[i] *= scale (float32 or float64 buffers).
void scale_in_place(void* buf, DType dtype, double scale, int64_t n);

}  // namespace hvdc
