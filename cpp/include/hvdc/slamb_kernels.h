// SLAMB's element-wise passes fused (hvd_compress/algorithms/slamb.py, spec shared/specs/slamb.md section 2
// steps 3, 5, 7 and 8) over float32 buffers: each reads and writes memory once where the backend's
// separate tensor ops take five to eight passes. The float32 operations are the backend's, in its order,
// with the same scalars (cast to float as torch casts them), so results match within an ulp or two.
#pragma once
#include <cstdint>

#include "hvdc/kernel_isa.h"
#include "hvdc/masks.h"

namespace hvdc {

// Step 3: work = b1 * m + (1 - b1) * g.
void slamb_momentum(const float* m, const float* g, int64_t n, float b1, float* work);

// Step 3 on the selected elements only, gathered: out[j] = b1 * m[i] + (1 - b1) * g[i] for the j-th element i
// that mask selects (slamb_momentum's rounding), for SLAMB's compact average. Returns the count, or -1 when more
// than `capacity` (out's room) are selected.
int64_t slamb_momentum_gather(const float* m, const float* g, const uint8_t* mask, int64_t n, float b1, float* out,
                              int64_t capacity, KernelChoice choice = KernelChoice::kAuto);

// After step 4: m = work (the averaged momentum), and step 5: v = b2 * v + (1 - b2) * g * g. Returns the
// sum of the new v (double) for the variance floor's layer mean.
double slamb_moments(const float* work, const float* g, int64_t n, float b2, float* m, float* v);

// Steps 3 and 5 on the elements a step keeps local, while the masked ones are on the wire: m = b1 * m +
// (1 - b1) * g where mask is 0 (the selected elements of m are set from the average afterwards), and
// v = b2 * v + (1 - b2) * g * g everywhere, each rounded as slamb_momentum and slamb_moments round it. Returns
// the sum of the new v (double), summed as slamb_moments sums it. AVX2 where `choice` and the CPU allow: the
// same bits.
double slamb_local_moments(const float* g, const uint8_t* mask, int64_t n, float b1, float b2, float* m, float* v,
                           KernelChoice choice = KernelChoice::kAuto);

// Step 7 on one layer: u = m / (max(sqrt(v) / sqrt_bc2, floor) + eps) / bc1 + wd * x (the max only when
// floor > 0, the weight decay only when wd != 0), with the masked sums of squares of x and of u
// (step 8's phi_max / phi_min norms) taken in the same pass. The AVX2 version (where `choice` and the CPU allow)
// gives the same bits as the portable one.
struct SlambNorms {
  MaskedSumSquares x;
  MaskedSumSquares u;
};
SlambNorms slamb_direction(const float* m, const float* v, const float* x, const uint8_t* mask, int64_t n,
                           float sqrt_bc2, float floor, float eps, float bc1, float wd, float* u,
                           KernelChoice choice = KernelChoice::kAuto);

// slamb_direction while the selected elements' averaged momentum is still on the wire: the unselected elements'
// u and the four sums as slamb_direction computes them (the selected elements' sum of squares of u is not
// meaningful), and where mask is set u = d = 1 / (max(sqrt(v) / sqrt_bc2, floor) + eps), the factor
// slamb_masked_direction finishes u with once m arrives.
SlambNorms slamb_direction_local(const float* m, const float* v, const float* x, const uint8_t* mask, int64_t n,
                                 float sqrt_bc2, float floor, float eps, float bc1, float wd, float* u,
                                 KernelChoice choice = KernelChoice::kAuto);

// Step 7 on the selected elements of one layer once their averaged momentum is in, compact (the j-th selected
// element's is m_avg[j], j < count), u holding slamb_direction_local's factor d there: m[i] = m_avg[j] and
// u[i] = d * m_avg[j] / bc1 + wd * x[i] (slamb_direction's u, the same bits); the other elements of m and u are
// left as they are. `sum` is the sum of the new u[M]^2 (double), `used` the number of averaged values consumed
// (count when the mask selects count elements) or -1 when it selects more.
struct MaskedDirection {
  double sum = 0.0;
  int64_t used = 0;
};
MaskedDirection slamb_masked_direction(const float* m_avg, int64_t count, const float* x, const uint8_t* mask,
                                       int64_t n, float bc1, float wd, float* m, float* u,
                                       KernelChoice choice = KernelChoice::kAuto);

// Step 8 on one layer, per element: phi = clamp(c * dphi + phi_min, clip_min, clip_max),
// eta = c * deta + eta_min, x -= (u * phi) * eta (dphi = phi_max - phi_min, deta = lr - lr / sqrt(n)).
void slamb_apply(const float* u, const float* c, int64_t n, float dphi, float phi_min, float clip_min,
                 float clip_max, float deta, float eta_min, float* x);

}  // namespace hvdc
