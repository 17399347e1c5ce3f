// The element-wise work of one Adasum pair step (paper 002, Algorithm 1, line 15: partial dot
// product and squared norms; line 18: the combine), for every storage dtype. Sums and the combine
// run in double whatever the storage dtype (paper 002, Section 4.4.1): the coefficients decide how
// much of each gradient survives, and a half-precision dot product of a million elements would be
// dominated by rounding. Results are rounded once, on store, to the storage dtype.
//
// float32 and float64 run vectorized (AVX-512 or AVX2 where the CPU has it, picked at the first
// call; SSE2 otherwise) with the same operations in the same order as the scalar loop, so every
// version returns the same bits; no fused multiply-add anywhere.
#pragma once
#include <cstdint>

#include "hvdc/dtype.h"

namespace hvdc {

// Partial sums over one slice of a tensor; summed over the ranks that share the tensor, they give
// the full dot product and squared norms (Algorithm 1, line 17). `left` is always the vector of
// the lower rank of the pair, so every rank of a group fills the same fields with the same roles.
struct AdasumDots {
  double dot = 0;      // <left, right>
  double left_sq = 0;  // |left|^2
  double right_sq = 0; // |right|^2
};

AdasumDots adasum_dot_norms(const void* left, const void* right, DType dtype, int64_t n);

// The weight of one side: 1 - dot / (2 |x|^2). A squared norm below sqrt(DBL_MIN) (a zero vector,
// or one so small that the quotient is meaningless) gives weight 1, so Adasum(0, b) = b. NaN and
// Inf pass through as IEEE arithmetic makes them.
double adasum_coefficient(double dot, double norm_sq);

// out[i] = left_coeff * left[i] + right_coeff * right[i], evaluated in double and rounded to
// `dtype`. `out` may be the same buffer as `left` or `right` (the RVH combines in place).
void adasum_combine(const void* left, double left_coeff, const void* right, double right_coeff,
                    void* out, DType dtype, int64_t n);

// dst[i] = double(src[i]).
void widen_to_double(const void* src, DType dtype, double* dst, int64_t n);
// dst[i] = round_to_dtype(src[i] / divisor).
void narrow_from_double(const double* src, double divisor, void* dst, DType dtype, int64_t n);

}  // namespace hvdc
