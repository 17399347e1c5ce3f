// Adasum's element-wise work on the device (hvdc/adasum_kernels.h; paper 002, Algorithm 1, lines
// 15 and 18), over hvdc/elementwise/adasum.h. The dot product and both squared norms are three
// sums in the fixed order of hvdc/elementwise/block_sum.h, taken in one pass over both vectors.
#include "block_sum.cuh"
#include "hvdc/cuda/kernels.h"
#include "hvdc/elementwise/adasum.h"
#include "launch.cuh"

namespace hvdc {
namespace cuda {
namespace {

// Steps 1-3 of the order for the three sums; partials[3 b + k] is block b's sum k (dot, left,
// right).
template <typename A>
__global__ void __launch_bounds__(kSumLanes)
dots_kernel(const typename A::T* a, const typename A::T* b, int64_t n, double* partials) {
  __shared__ double shared[kSumLanes];
  const int l = threadIdx.x;
  const int64_t nblocks = sum_blocks(n);
  for (int64_t blk = blockIdx.x; blk < nblocks; blk += gridDim.x) {
    const int64_t b0 = blk * kSumBlock;
    const int64_t end = b0 + kSumBlock < n ? b0 + kSumBlock : n;
    double d = 0.0, na = 0.0, nb = 0.0;
    for (int64_t i = b0 + l; i < end; i += kSumLanes) {
      const double x = A::load(a, i), y = A::load(b, i);
      d += x * y;
      na += x * x;
      nb += y * y;
    }
    const double sd = block_tree_sum(d, shared);
    const double sa = block_tree_sum(na, shared);
    const double sb = block_tree_sum(nb, shared);
    if (l == 0) {
      partials[3 * blk] = sd;
      partials[3 * blk + 1] = sa;
      partials[3 * blk + 2] = sb;
    }
  }
}

// Step 4 for the three sums, one thread.
__global__ void dots_finish_kernel(const double* partials, int64_t nblocks, double* out) {
  double s[3] = {0.0, 0.0, 0.0};
  for (int64_t b = 0; b < nblocks; ++b)
    for (int k = 0; k < 3; ++k) s[k] += partials[3 * b + k];
  for (int k = 0; k < 3; ++k) out[k] = s[k];
}

template <typename A>
__global__ void combine_kernel(const typename A::T* a, double ca, const typename A::T* b,
                               double cb, typename A::T* out, int64_t n) {
  for (int64_t i = grid_first(); i < n; i += grid_step())
    A::store(out, i, adasum_mix(ca, A::load(a, i), cb, A::load(b, i)));
}

template <typename A>
__global__ void widen_kernel(const typename A::T* src, double* dst, int64_t n) {
  for (int64_t i = grid_first(); i < n; i += grid_step()) dst[i] = A::load(src, i);
}

template <typename A>
__global__ void narrow_kernel(const double* src, double divisor, typename A::T* dst, int64_t n) {
  for (int64_t i = grid_first(); i < n; i += grid_step()) A::store(dst, i, src[i] / divisor);
}

}  // namespace

int64_t adasum_workspace_doubles(int64_t n) { return 3 * sum_blocks(n); }

void adasum_dot_norms(const void* left, const void* right, DType dtype, int64_t n, double* dots,
                      double* workspace, cudaStream_t stream) {
  adasum_dispatch(dtype, [&](auto acc) {
    using A = decltype(acc);
    const int64_t nblocks = sum_blocks(n);
    if (nblocks > 0) {
      const unsigned grid = static_cast<unsigned>(nblocks < kMaxBlocks ? nblocks : kMaxBlocks);
      dots_kernel<A><<<grid, kSumLanes, 0, stream>>>(static_cast<const typename A::T*>(left),
                                                     static_cast<const typename A::T*>(right), n,
                                                     workspace);
      check_launch("Adasum dot products");
    }
    dots_finish_kernel<<<1, 1, 0, stream>>>(workspace, nblocks, dots);
    check_launch("Adasum dot products");
  });
}

void adasum_combine(const void* left, double left_coeff, const void* right, double right_coeff,
                    void* out, DType dtype, int64_t n, cudaStream_t stream) {
  adasum_dispatch(dtype, [&](auto acc) {
    using A = decltype(acc);
    if (n <= 0) return;
    combine_kernel<A><<<grid_for(n), kThreads, 0, stream>>>(
        static_cast<const typename A::T*>(left), left_coeff,
        static_cast<const typename A::T*>(right), right_coeff, static_cast<typename A::T*>(out), n);
    check_launch("Adasum combine");
  });
}

void widen_to_double(const void* src, DType dtype, double* dst, int64_t n, cudaStream_t stream) {
  adasum_dispatch(dtype, [&](auto acc) {
    using A = decltype(acc);
    if (n <= 0) return;
    widen_kernel<A><<<grid_for(n), kThreads, 0, stream>>>(static_cast<const typename A::T*>(src),
                                                          dst, n);
    check_launch("widen_to_double");
  });
}

void narrow_from_double(const double* src, double divisor, void* dst, DType dtype, int64_t n,
                        cudaStream_t stream) {
  adasum_dispatch(dtype, [&](auto acc) {
    using A = decltype(acc);
    if (n <= 0) return;
    narrow_kernel<A><<<grid_for(n), kThreads, 0, stream>>>(src, divisor,
                                                           static_cast<typename A::T*>(dst), n);
    check_launch("narrow_from_double");
  });
}

}  // namespace cuda
}  // namespace hvdc
