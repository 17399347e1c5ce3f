// 1-bit Adam's compression-stage arithmetic fused (paper 003 Algorithm 1 lines 6 and 12-13) over float32
// buffers: one pass over memory each, where the backend's separate tensor ops take three to four
// (hvd_compress/algorithms/onebit.py `local_momentum`, onebit_adam.py `compressed` and `apply`).
//
// Exactness, as for 1-bit LAMB's passes (hvdc/onebit_lamb_kernels.h): each element goes through the float32
// operations of the backend path in its order, with its scalars cast to float as torch casts them; add with
// alpha is torch's fmadd (an explicit fma here, the file compiled without contraction), addcdiv is not
// (torch computes x + value * a / b step by step). No sqrt on these paths (the frozen denominator is the
// backend's, computed once), so they also match the torch backend bit for bit, and the NumPy backend's, whose
// float32 fmadd is the core's scaled add (hvdc/scaled_add_kernels.h). The AVX2 and the portable implementation
// compute the same bits;
// `choice` picks as for the 1-bit kernels (hvdc/kernel_isa.h).
#pragma once
#include <cstdint>

#include "hvdc/kernel_isa.h"

namespace hvdc {

// Line 6, this rank's local momentum, for both 1-bit optimizers (OneBitAlgorithm.local_momentum), per element:
//   work = fma(m, b1, fma(x, l2, g * one_minus_b1))
// the L2 term (Adam's weight decay in the gradient, l2 = (1 - b1) wd) only when x is not null (adding
// 0 * x is not neutral for an infinite x); x, g, m and work hold n elements (one layer when x is given).
void onebit_local_momentum(const float* g, const float* m, const float* x, int64_t n, float one_minus_b1, float l2,
                           float b1, float* work, KernelChoice choice = KernelChoice::kAuto);

// Lines 12-13 on one layer of n elements, per element: m = work (the compressed average), then
//   x = x * decay                  (AdamW's decoupled weight decay 1 - lr wd; skipped for decay == 1, exact)
//   d = denom                      (the frozen d = max(sqrt(vh), floor) + eps)
//   d = max(d, |m| * cap)          only where d <= floor_denom: an element the variance floor lifted
//   x = x + (m * value) / d        (value = -lr / (1 - b1^t))
// cap = 1 / (1 - b1^t) bounds such an element's |mh / d| by 1 (hvd_compress/algorithms/onebit.py, variance
// floor); floor_denom = -inf (no floor) leaves every d as it is.
void onebit_adam_apply(const float* work, const float* denom, int64_t n, float decay, float value,
                       float floor_denom, float cap, float* m, float* x, KernelChoice choice = KernelChoice::kAuto);

}  // namespace hvdc
