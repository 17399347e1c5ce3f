// The device side of the fixed summation order of hvdc/elementwise/block_sum.h: a block of
// kSumLanes threads combines its lanes by halving (steps 2-3), and one thread adds the blocks'
// partial sums in block order (step 4). Nothing here depends on the grid size or on timing, so
// every card and every run gives the same double.
#pragma once
#include <cstdint>

#include "hvdc/elementwise/block_sum.h"

namespace hvdc {
namespace cuda {
namespace {

// Steps 2-3 for one block of terms: thread l passes its lane's sum; every thread gets the block's
// partial sum. `shared` holds kSumLanes doubles; blockDim.x must be kSumLanes.
__device__ inline double block_tree_sum(double lane, double* shared) {
  const int l = threadIdx.x;
  shared[l] = lane;
  __syncthreads();
  for (int s = kSumLanes / 2; s > 0; s >>= 1) {
    if (l < s) shared[l] += shared[l + s];
    __syncthreads();
  }
  const double sum = shared[0];
  __syncthreads();  // shared may be reused by the next block of terms
  return sum;
}

// Step 4, one thread: *total = ((0 + partials[0]) + partials[1]) + ... .
__device__ inline double sum_in_block_order(const double* partials, int64_t nblocks) {
  double total = 0.0;
  for (int64_t b = 0; b < nblocks; ++b) total += partials[b];
  return total;
}

}  // namespace
}  // namespace cuda
}  // namespace hvdc
