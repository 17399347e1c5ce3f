// 1-bit Adam's fused compression-stage passes on the device (hvdc/onebit_adam_kernels.h, paper
// 003 Algorithm 1 line 6 and lines 12-13), over the per-element functions of
// hvdc/elementwise/onebit_adam.h.
#include "hvdc/cuda/kernels.h"
#include "hvdc/elementwise/onebit_adam.h"
#include "launch.cuh"

namespace hvdc {
namespace cuda {
namespace {

template <bool kL2>
__global__ void momentum_kernel(const float* g, const float* m, const float* x, int64_t n,
                                float omb1, float l2, float b1, float* work) {
  for (int64_t i = grid_first(); i < n; i += grid_step())
    work[i] = onebit_momentum<kL2>(g[i], m[i], kL2 ? x[i] : 0.0f, omb1, l2, b1);
}

template <bool kDecay>
__global__ void apply_kernel(const float* work, const float* denom, int64_t n, float decay,
                             float value, float floor_denom, float cap, float* m, float* x) {
  for (int64_t i = grid_first(); i < n; i += grid_step()) {
    const float w = work[i];
    m[i] = w;
    x[i] = onebit_adam_param<kDecay>(w, denom[i], x[i], decay, value, floor_denom, cap);
  }
}

}  // namespace

void onebit_local_momentum(const float* g, const float* m, const float* x, int64_t n,
                           float one_minus_b1, float l2, float b1, float* work,
                           cudaStream_t stream) {
  if (n <= 0) return;
  if (x != nullptr)
    momentum_kernel<true><<<grid_for(n), kThreads, 0, stream>>>(g, m, x, n, one_minus_b1, l2, b1, work);
  else
    momentum_kernel<false><<<grid_for(n), kThreads, 0, stream>>>(g, m, x, n, one_minus_b1, l2, b1, work);
  check_launch("1-bit Adam local momentum");
}

void onebit_adam_apply(const float* work, const float* denom, int64_t n, float decay, float value,
                       float floor_denom, float cap, float* m, float* x, cudaStream_t stream) {
  if (n <= 0) return;
  // x * 1 is x: as the CPU kernel, the multiply is skipped for decay == 1 (no bit changes).
  if (decay != 1.0f)
    apply_kernel<true><<<grid_for(n), kThreads, 0, stream>>>(work, denom, n, decay, value,
                                                             floor_denom, cap, m, x);
  else
    apply_kernel<false><<<grid_for(n), kThreads, 0, stream>>>(work, denom, n, decay, value,
                                                              floor_denom, cap, m, x);
  check_launch("1-bit Adam apply");
}

}  // namespace cuda
}  // namespace hvdc
