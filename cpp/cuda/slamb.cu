// SLAMB's fused element-wise passes on the device (hvdc/slamb_kernels.h; spec
// shared/specs/slamb.md section 2 steps 3, 5 and 8), over the per-element functions of
// hvdc/elementwise/slamb.h. The moments passes also sum the new v for the variance floor's layer
// mean: in double, in the block order of block_sum.h (each CUDA block takes whole blocks of
// kSumBlock elements, one thread adds the partial sums in block order). The masked momentum's
// gather pairs the j-th selected element with out[j] through compact.cuh.
#include "block_sum.cuh"
#include "compact.cuh"
#include "hvdc/cuda/kernels.h"
#include "hvdc/elementwise/slamb.h"
#include "launch.cuh"

namespace hvdc {
namespace cuda {
namespace {

__global__ void momentum_kernel(const float* m, const float* g, int64_t n, float b1, float a1,
                                float* work) {
  for (int64_t i = grid_first(); i < n; i += grid_step()) work[i] = slamb_momentum_of(m[i], g[i], b1, a1);
}

struct MomentumGather {
  const float* m;
  const float* g;
  float b1, a1;
  float* out;
  __device__ void operator()(int64_t i, int64_t j) const { out[j] = slamb_momentum_of(m[i], g[i], b1, a1); }
};

// What the moments passes do to m beside v: slamb_moments copies the averaged momentum in,
// slamb_local_moments updates the unselected elements (step 3) and keeps the selected ones.
struct CopyM {
  const float* work;
  float* m;
  __device__ void operator()(int64_t i) const { m[i] = work[i]; }
};
struct LocalM {
  const float* g;
  const uint8_t* mask;
  float b1, a1;
  float* m;
  __device__ void operator()(int64_t i) const {
    const float nm = slamb_momentum_of(m[i], g[i], b1, a1);
    m[i] = mask[i] ? m[i] : nm;
  }
};

template <typename UpdateM>
__global__ void __launch_bounds__(kSumLanes)
moments_kernel(const float* g, int64_t n, float b2, float a2, float* v, UpdateM update_m,
               double* partials) {
  __shared__ double shared[kSumLanes];
  const int l = threadIdx.x;
  const int64_t nblocks = sum_blocks(n);
  for (int64_t b = blockIdx.x; b < nblocks; b += gridDim.x) {
    const int64_t b0 = b * kSumBlock;
    const int64_t end = b0 + kSumBlock < n ? b0 + kSumBlock : n;
    double lane = 0.0;
    for (int64_t i = b0 + l; i < end; i += kSumLanes) {
      update_m(i);
      const float nv = slamb_variance_of(v[i], g[i], b2, a2);
      v[i] = nv;
      lane += nv;
    }
    const double partial = block_tree_sum(lane, shared);
    if (l == 0) partials[b] = partial;
  }
}

__global__ void total_kernel(const double* partials, int64_t nblocks, double* total) {
  *total = sum_in_block_order(partials, nblocks);
}

template <typename UpdateM>
void launch_moments(const float* g, int64_t n, float b2, float* v, const UpdateM& update_m,
                    double* sum_v, double* workspace, cudaStream_t stream) {
  const int64_t nblocks = sum_blocks(n);
  if (nblocks > 0) {
    const unsigned grid = static_cast<unsigned>(nblocks < kMaxBlocks ? nblocks : kMaxBlocks);
    moments_kernel<<<grid, kSumLanes, 0, stream>>>(g, n, b2, 1.0f - b2, v, update_m, workspace);
    check_launch("SLAMB moments");
  }
  total_kernel<<<1, 1, 0, stream>>>(workspace, nblocks, sum_v);
  check_launch("SLAMB moments sum");
}

__global__ void apply_kernel(const float* u, const float* c, int64_t n, float dphi, float phi_min,
                             float clip_min, float clip_max, float deta, float eta_min, float* x) {
  for (int64_t i = grid_first(); i < n; i += grid_step())
    x[i] = slamb_apply_of(u[i], c[i], x[i], dphi, phi_min, clip_min, clip_max, deta, eta_min);
}

}  // namespace

int64_t slamb_workspace_doubles(int64_t n) {
  const int64_t b = sum_blocks(n);
  return b < 1 ? 1 : b;
}

void slamb_momentum(const float* m, const float* g, int64_t n, float b1, float* work,
                    cudaStream_t stream) {
  if (n <= 0) return;
  momentum_kernel<<<grid_for(n), kThreads, 0, stream>>>(m, g, n, b1, 1.0f - b1, work);
  check_launch("SLAMB momentum");
}

void slamb_momentum_gather(const float* m, const float* g, const uint8_t* mask, int64_t n,
                           float b1, float* out, int64_t capacity, int64_t* count,
                           int64_t* workspace, cudaStream_t stream) {
  compact(mask, n, capacity, MomentumGather{m, g, b1, 1.0f - b1, out}, count, workspace, stream,
          "SLAMB momentum gather");
}

void slamb_moments(const float* work, const float* g, int64_t n, float b2, float* m, float* v,
                   double* sum_v, double* workspace, cudaStream_t stream) {
  launch_moments(g, n, b2, v, CopyM{work, m}, sum_v, workspace, stream);
}

void slamb_local_moments(const float* g, const uint8_t* mask, int64_t n, float b1, float b2,
                         float* m, float* v, double* sum_v, double* workspace,
                         cudaStream_t stream) {
  launch_moments(g, n, b2, v, LocalM{g, mask, b1, 1.0f - b1, m}, sum_v, workspace, stream);
}

void slamb_apply(const float* u, const float* c, int64_t n, float dphi, float phi_min,
                 float clip_min, float clip_max, float deta, float eta_min, float* x,
                 cudaStream_t stream) {
  if (n <= 0) return;
  apply_kernel<<<grid_for(n), kThreads, 0, stream>>>(u, c, n, dphi, phi_min, clip_min, clip_max,
                                                    deta, eta_min, x);
  check_launch("SLAMB apply");
}

}  // namespace cuda
}  // namespace hvdc
