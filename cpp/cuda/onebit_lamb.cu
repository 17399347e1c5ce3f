// 1-bit LAMB's fused compression-stage passes on the device (hvdc/onebit_lamb_kernels.h, paper
// 001 Algorithm 1 lines 14-17 and 20-21), over the per-element functions of
// hvdc/elementwise/onebit_lamb.h. Pass A's max of the ratios is exact in any order: each CUDA block
// leaves its max in the workspace, and one thread takes the max of those.
#include "hvdc/cuda/kernels.h"
#include "hvdc/elementwise/onebit_lamb.h"
#include "launch.cuh"

namespace hvdc {
namespace cuda {
namespace {

__global__ void __launch_bounds__(kThreads)
moments_kernel(const float* work, const float* denom, int64_t n, OneBitLambMomentsArgs a, float* m,
               float* fresh, float* block_max) {
  __shared__ float shared[kThreads];
  OneBitLambMax acc;
  for (int64_t i = grid_first(); i < n; i += grid_step())
    acc.add(onebit_lamb_ratio(work[i], denom[i], a, m[i], fresh[i]));
  shared[threadIdx.x] = acc.result();
  __syncthreads();
  if (threadIdx.x == 0) {
    OneBitLambMax all;
    for (int t = 0; t < kThreads; ++t) all.add(shared[t]);
    block_max[blockIdx.x] = all.result();
  }
}

__global__ void max_kernel(const float* block_max, int64_t nblocks, float* ratio_max) {
  OneBitLambMax all;
  for (int64_t b = 0; b < nblocks; ++b) all.add(block_max[b]);
  *ratio_max = all.result();
}

template <bool kDecay>
__global__ void apply_kernel(const float* m, const float* denom, int64_t n, float bc1, float wd,
                             float scale, float* x) {
  for (int64_t i = grid_first(); i < n; i += grid_step())
    x[i] = onebit_lamb_param<kDecay>(m[i], denom[i], x[i], bc1, wd, scale);
}

}  // namespace

int64_t onebit_lamb_workspace_floats(int64_t n) { return grid_for(n); }

void onebit_lamb_moments(const float* work, const float* denom, int64_t n, float neg_b1,
                         float one_minus_b1, float b2, float one_minus_b2, float sqrt_bc2,
                         float floor, float eps, float* m, float* fresh, float* ratio_max,
                         float* workspace, cudaStream_t stream) {
  const OneBitLambMomentsArgs a{neg_b1, one_minus_b1, b2, one_minus_b2, sqrt_bc2, floor, eps};
  const unsigned grid = grid_for(n);
  if (n > 0) {
    moments_kernel<<<grid, kThreads, 0, stream>>>(work, denom, n, a, m, fresh, workspace);
    check_launch("1-bit LAMB moments");
  }
  max_kernel<<<1, 1, 0, stream>>>(workspace, n > 0 ? grid : 0, ratio_max);
  check_launch("1-bit LAMB ratio max");
}

void onebit_lamb_apply(const float* m, const float* denom, int64_t n, float bc1, float wd,
                       float scale, float* x, cudaStream_t stream) {
  if (n <= 0) return;
  if (wd != 0.0f)
    apply_kernel<true><<<grid_for(n), kThreads, 0, stream>>>(m, denom, n, bc1, wd, scale, x);
  else
    apply_kernel<false><<<grid_for(n), kThreads, 0, stream>>>(m, denom, n, bc1, wd, scale, x);
  check_launch("1-bit LAMB apply");
}

}  // namespace cuda
}  // namespace hvdc
