// SLAMB's mask draws on the device (hvdc/masks.h), over the per-element decisions of
// hvdc/elementwise/mask.h: the Bernoulli draw with Philox in the kernel, and the cyclic mask's
// compare against the permutation ranks (drawn once per (numel, seed) on the host and copied to the
// device by the caller).
#include "hvdc/cuda/kernels.h"
#include "hvdc/elementwise/mask.h"
#include "launch.cuh"

namespace hvdc {
namespace cuda {
namespace {

__global__ void bernoulli_kernel(BernoulliDraw d, uint64_t first, int64_t n, uint8_t* out) {
  for (int64_t x = grid_first(); x < n; x += grid_step()) {
    const uint64_t i = first + static_cast<uint64_t>(x);
    out[x] = bernoulli_selected(d, bernoulli_half(d.key, i), i);
  }
}

__global__ void cyclic_kernel(const uint32_t* ranks, uint32_t base, uint32_t width, int64_t n,
                              uint8_t* out) {
  for (int64_t x = grid_first(); x < n; x += grid_step())
    out[x] = static_cast<uint8_t>(cyclic_selected(ranks[x], base, width));
}

}  // namespace

void bernoulli_mask_draw(uint64_t seed, int64_t step, double ratio, int64_t first, int64_t n,
                         uint8_t* out, cudaStream_t stream) {
  if (n <= 0) return;
  const uint64_t t = bernoulli_threshold(ratio);
  if (t >= (uint64_t{1} << 32)) {
    const cudaError_t e = cudaMemsetAsync(out, 1, static_cast<size_t>(n), stream);
    if (e != cudaSuccess) throw CudaError(std::string("Bernoulli mask: ") + cudaGetErrorString(e));
    return;
  }
  bernoulli_kernel<<<grid_for(n), kThreads, 0, stream>>>(bernoulli_draw_of(seed, step, t),
                                                        static_cast<uint64_t>(first), n, out);
  check_launch("Bernoulli mask");
}

void cyclic_mask_compare(const uint32_t* ranks, uint32_t base, uint32_t width, int64_t n,
                         uint8_t* out, cudaStream_t stream) {
  if (n <= 0) return;
  cyclic_kernel<<<grid_for(n), kThreads, 0, stream>>>(ranks, base, width, n, out);
  check_launch("cyclic mask");
}

}  // namespace cuda
}  // namespace hvdc
