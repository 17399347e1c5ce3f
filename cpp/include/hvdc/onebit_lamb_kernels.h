// 1-bit LAMB's compression-stage arithmetic fused (hvd_compress/algorithms/onebit_lamb.py, paper 001
// Algorithm 1 lines 14-21) over float32 buffers, one layer (parameter tensor) per call: two passes over
// memory where the backend's separate tensor ops take about fourteen.
//
// Exactness: each element goes through the float32 operations of the backend path, in its order, with
// its scalars (cast to float as torch casts them), including the fused multiply-adds that torch's CPU
// kernels use (sub/add with alpha and addcmul are fmadd in torch and in the NumPy backend): those are
// explicit fma calls here, and the file is compiled without contraction so that no other one appears.
// sqrt is the correctly rounded one (sqrtps), like the NumPy backend's; torch 2.x's CPU float32 sqrt is
// not (one ulp off on about 1 element in 6), the one place where this differs from the torch path.
// The AVX2 and the portable implementation compute the same bits; `choice` picks as for the 1-bit
// kernels (hvdc/kernel_isa.h).
#pragma once
#include <cstdint>

#include "hvdc/kernel_isa.h"

namespace hvdc {

// Pass A, lines 14-17 on one layer of n elements, per element (float32, neg_b1 = -b1, etc. as given):
//   g     = fma(m, neg_b1, work) / one_minus_b1                   reconstructed gradient (line 15)
//   fresh = fma(one_minus_b2 * g, g, fresh * b2)                  fresh variance (line 16)
//   m     = work                                                  the averaged momentum (line 12)
//   r     = denom / (max(sqrt(fresh) / sqrt_bc2, floor) + eps)    frozen / fresh ratio (line 17)
// `denom` is the frozen d = max(sqrt(vh), floor) + eps; `floor` is the layer's sqrt(variance floor), 0
// when there is none (max with 0 keeps every non-negative root and NaN). Returns max over the layer of r
// (NaN if any r is NaN, as torch's max; -inf for n = 0).
float onebit_lamb_moments(const float* work, const float* denom, int64_t n, float neg_b1, float one_minus_b1,
                          float b2, float one_minus_b2, float sqrt_bc2, float floor, float eps, float* m,
                          float* fresh, KernelChoice choice = KernelChoice::kAuto);

// Pass B, lines 20-21 on one layer: x = x + fma(x, wd, (m / denom) / bc1) * scale per element, the
// weight-decay term only when wd != 0 (adding 0 * x is not neutral for an infinite x or a signed zero);
// scale = -lr r c_avg, bc1 = 1 - b1^t (1 without bias correction: dividing by 1 is exact).
void onebit_lamb_apply(const float* m, const float* denom, int64_t n, float bc1, float wd, float scale, float* x,
                       KernelChoice choice = KernelChoice::kAuto);

}  // namespace hvdc
