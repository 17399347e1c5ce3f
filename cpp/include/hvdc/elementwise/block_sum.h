// The fixed order in which the CUDA kernels add a value-deciding sum (a 1-bit scale's sum of
// squares; specs/gpu.md, design point 3), and its host mirror, so that the order is a documented
// function of n alone (not of the grid, the card or the scheduling) and a CPU can reproduce the
// GPU's double bit for bit (cpp/tests/test_elementwise.cc; the GPU check compares against it).
//
// The order, over terms t(0) .. t(n-1), all in double:
//   1. blocks of kSumBlock consecutive terms (the last one may be short);
//   2. in a block, lane l (0 <= l < kSumLanes) adds its terms l, l + kSumLanes, l + 2 kSumLanes, ...
//      in index order, starting from 0.0;
//   3. the lanes are combined by halving: for s = kSumLanes / 2, ..., 2, 1, lane l < s becomes
//      lane l + lane (l + s); lane 0 is the block's partial sum;
//   4. the partial sums are added in block order, starting from 0.0.
// A CUDA block of kSumLanes threads computes steps 2-3 for one block of terms (a shared-memory
// tree), one thread step 4.
//
// The CPU kernels do not use this order (onebit_kernels.cc keeps four interleaved accumulators,
// its AVX2 code sixteen): their sums of squares and this one differ only in the last double bits,
// which moves a float32 scale only in a tie far below its last place.
#pragma once
#include <cstdint>

#include "hvdc/host_device.h"

namespace hvdc {

constexpr int kSumLanes = 256;
constexpr int64_t kSumBlock = 16 * kSumLanes;

// Number of partial sums (step 1) of n terms.
HVDC_HOST_DEVICE constexpr int64_t sum_blocks(int64_t n) { return (n + kSumBlock - 1) / kSumBlock; }

// The sum of term(0) .. term(n-1) in the order above, on the host.
template <typename Term>
double blocked_sum(int64_t n, Term term) {
  double total = 0.0;
  for (int64_t b0 = 0; b0 < n; b0 += kSumBlock) {
    const int64_t end = b0 + kSumBlock < n ? b0 + kSumBlock : n;
    double lane[kSumLanes];
    for (int l = 0; l < kSumLanes; ++l) {
      lane[l] = 0.0;
      for (int64_t i = b0 + l; i < end; i += kSumLanes) lane[l] += term(i);
    }
    for (int s = kSumLanes / 2; s > 0; s /= 2)
      for (int l = 0; l < s; ++l) lane[l] += lane[l + s];
    total += lane[0];
  }
  return total;
}

}  // namespace hvdc
