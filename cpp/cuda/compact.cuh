// Compaction in index order on the device: the j-th selected element i of a byte mask (byte != 0)
// is handed to op(i, j), j counted from 0 in index order over the whole mask, exactly the pairing
// of the CPU's mask_gather / mask_scatter (hvdc/masks.h) and slamb_momentum_gather. Three passes
// on the stream, each a grid-stride loop over tiles of kCompactTile elements: the tiles' counts,
// their exclusive prefix (one thread, in tile order), and the op, each thread taking
// kCompactPer consecutive elements of its tile and its start from a scan of the block's counts.
// Integers only, so the pairing does not depend on the grid or the card.
#pragma once
#include <cstdint>

#include "launch.cuh"

namespace hvdc {
namespace cuda {
namespace {

constexpr int kCompactPer = 16;
constexpr int64_t kCompactTile = int64_t{kCompactPer} * kThreads;

__host__ __device__ inline int64_t compact_tiles(int64_t n) { return (n + kCompactTile - 1) / kCompactTile; }

inline unsigned compact_grid(int64_t tiles) {
  return static_cast<unsigned>(tiles < 1 ? 1 : tiles > kMaxBlocks ? kMaxBlocks : tiles);
}

// Pass 1: counts[t] = the selected elements of tile t.
__global__ void __launch_bounds__(kThreads)
compact_count_kernel(const uint8_t* mask, int64_t n, int64_t* counts) {
  __shared__ int shared[kThreads];
  const int l = threadIdx.x;
  const int64_t tiles = compact_tiles(n);
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const int64_t i0 = t * kCompactTile;
    const int64_t end = i0 + kCompactTile < n ? i0 + kCompactTile : n;
    int c = 0;
    for (int64_t i = i0 + l; i < end; i += kThreads) c += mask[i] != 0;
    shared[l] = c;
    __syncthreads();
    for (int s = kThreads / 2; s > 0; s >>= 1) {
      if (l < s) shared[l] += shared[l + s];
      __syncthreads();
    }
    if (l == 0) counts[t] = shared[0];
    __syncthreads();
  }
}

// Pass 2, one thread: counts become their exclusive prefix in tile order; *total (if not null) =
// the number selected, or -1 when it exceeds `capacity` (the CPU kernels' -1).
__global__ void compact_scan_kernel(int64_t* counts, int64_t tiles, int64_t capacity,
                                    int64_t* total) {
  int64_t run = 0;
  for (int64_t t = 0; t < tiles; ++t) {
    const int64_t c = counts[t];
    counts[t] = run;
    run += c;
  }
  if (total != nullptr) *total = run > capacity ? -1 : run;
}

// Pass 3: op(i, j) for every selected element i with j < capacity.
template <typename Op>
__global__ void __launch_bounds__(kThreads)
compact_apply_kernel(const uint8_t* mask, int64_t n, const int64_t* offsets, int64_t capacity,
                     Op op) {
  __shared__ int shared[kThreads];
  const int l = threadIdx.x;
  const int64_t tiles = compact_tiles(n);
  for (int64_t t = blockIdx.x; t < tiles; t += gridDim.x) {
    const int64_t first = t * kCompactTile + int64_t{l} * kCompactPer;
    const int64_t end = first + kCompactPer < n ? first + kCompactPer : n;
    int c = 0;
    for (int64_t i = first; i < end; ++i) c += mask[i] != 0;
    shared[l] = c;
    __syncthreads();
    for (int s = 1; s < kThreads; s <<= 1) {  // inclusive scan of the threads' counts
      const int add = l >= s ? shared[l - s] : 0;
      __syncthreads();
      shared[l] += add;
      __syncthreads();
    }
    int64_t j = offsets[t] + shared[l] - c;
    __syncthreads();  // shared is reused by the next tile
    for (int64_t i = first; i < end; ++i) {
      if (mask[i] == 0) continue;
      if (j < capacity) op(i, j);
      ++j;
    }
  }
}

// The three passes: op(i, j) for the selected elements with j < capacity, *total as pass 2 says.
// `counts` holds compact_tiles(n) int64 of device memory (at least one).
template <typename Op>
void compact(const uint8_t* mask, int64_t n, int64_t capacity, const Op& op, int64_t* total,
             int64_t* counts, cudaStream_t stream, const char* what) {
  const int64_t tiles = compact_tiles(n);
  if (tiles > 0) {
    compact_count_kernel<<<compact_grid(tiles), kThreads, 0, stream>>>(mask, n, counts);
    check_launch(what);
  }
  compact_scan_kernel<<<1, 1, 0, stream>>>(counts, tiles, capacity, total);
  check_launch(what);
  if (tiles > 0) {
    compact_apply_kernel<<<compact_grid(tiles), kThreads, 0, stream>>>(mask, n, counts, capacity, op);
    check_launch(what);
  }
}

}  // namespace
}  // namespace cuda
}  // namespace hvdc
