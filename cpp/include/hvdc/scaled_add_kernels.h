// out = fma(p, q, base) over float32 buffers, one rounding per element: torch's add_(p, alpha=q) and
// sub(base, p, alpha) (its fmadd) for the NumPy backend (hvd_compress/tensorflow/backend.py), which otherwise
// emulates the fma by a float64 sum rounded to float32 (two roundings, and three float64 temporaries of the
// whole buffer). out may be base (in place). The AVX2 and the portable implementation compute the same bits;
// `choice` picks as for the 1-bit kernels (hvdc/kernel_isa.h).
#pragma once
#include <cstdint>

#include "hvdc/kernel_isa.h"

namespace hvdc {

void scaled_add(const float* base, const float* p, int64_t n, float q, float* out,
                KernelChoice choice = KernelChoice::kAuto);

}  // namespace hvdc
