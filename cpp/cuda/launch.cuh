// How the CUDA kernels are launched: grid-stride loops (as Horovod's cuda_kernels.cu) of kThreads
// threads per block on the caller's stream, a grid capped so that one launch covers any n, and
// the launch error turned into hvdc::cuda::CudaError.
#pragma once
#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "hvdc/cuda/kernels.h"

namespace hvdc {
namespace cuda {

constexpr int kThreads = 256;
constexpr int64_t kMaxBlocks = 8192;

// Blocks for `work` items handled one per thread per pass of the grid-stride loop.
inline unsigned grid_for(int64_t work) {
  const int64_t blocks = (work + kThreads - 1) / kThreads;
  return static_cast<unsigned>(blocks < 1 ? 1 : blocks > kMaxBlocks ? kMaxBlocks : blocks);
}

inline void check_launch(const char* what) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) throw CudaError(std::string(what) + ": " + cudaGetErrorString(e));
}

// The grid-stride loop's first index and step for this thread.
__device__ inline int64_t grid_first() {
  return static_cast<int64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
}
__device__ inline int64_t grid_step() { return static_cast<int64_t>(gridDim.x) * blockDim.x; }

}  // namespace cuda
}  // namespace hvdc
