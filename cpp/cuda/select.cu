// Top-k and random-k selection on the device (hvdc/sparse_allreduce.h topk_select / randomk_select):
// the ascending indices of the k smallest keys of hvdc/elementwise/select.h, ties to the lower index,
// the same indices as the CPU. The k-th smallest key is found by a radix select over the 32-bit keys
// (four passes, one per byte from the top: a 256-bin histogram of the keys that match the prefix
// found so far, then one thread picks the byte), with integer counts only; then select_keeps decides
// each element, its rank among the equal keys counted in index order by compact.cuh, and the
// selected indices are compacted in index order.
#include "compact.cuh"
#include "hvdc/cuda/kernels.h"
#include "hvdc/elementwise/select.h"
#include "launch.cuh"

namespace hvdc {
namespace cuda {
namespace {

// The radix select's state (device memory, at the start of the workspace).
struct SelectState {
  unsigned int hist[256];
  uint32_t prefix;      // the threshold's bytes found so far
  uint32_t prefix_mask;
  int64_t k_left;       // after the four passes: k minus the keys below the threshold (equal_left)
};

struct TopKKey {
  const float* c;
  __device__ uint32_t operator()(int64_t i) const { return topk_key(c[i]); }
};
struct RandomKKey {
  PhiloxKey key;
  uint64_t offset;
  __device__ uint32_t operator()(int64_t i) const { return philox_word(key, offset + static_cast<uint64_t>(i)); }
};

__global__ void init_kernel(SelectState* s, int64_t k) {
  for (int b = 0; b < 256; ++b) s->hist[b] = 0;
  s->prefix = 0;
  s->prefix_mask = 0;
  s->k_left = k;
}

template <typename Key>
__global__ void __launch_bounds__(kThreads) hist_kernel(Key key, int64_t n, int shift, SelectState* s) {
  __shared__ unsigned int hist[256];
  for (int b = threadIdx.x; b < 256; b += blockDim.x) hist[b] = 0;
  __syncthreads();
  const uint32_t prefix = s->prefix, mask = s->prefix_mask;
  for (int64_t i = grid_first(); i < n; i += grid_step()) {
    const uint32_t u = key(i);
    if ((u & mask) == prefix) atomicAdd(&hist[(u >> shift) & 0xffu], 1u);
  }
  __syncthreads();
  for (int b = threadIdx.x; b < 256; b += blockDim.x)
    if (hist[b] != 0) atomicAdd(&s->hist[b], hist[b]);
}

// One thread: the byte at `shift` of the k_left-th smallest key among those matching the prefix.
__global__ void pick_kernel(int shift, SelectState* s) {
  int64_t below = 0;
  int b = 0;
  for (; b < 255; ++b) {
    if (below + s->hist[b] >= s->k_left) break;
    below += s->hist[b];
  }
  s->prefix |= static_cast<uint32_t>(b) << shift;
  s->prefix_mask |= 0xffu << shift;
  s->k_left -= below;
  for (int i = 0; i < 256; ++i) s->hist[i] = 0;
}

template <typename Key>
__global__ void classify_kernel(Key key, int64_t n, const SelectState* s, uint8_t* equal, uint8_t* below) {
  const uint32_t t = s->prefix;
  for (int64_t i = grid_first(); i < n; i += grid_step()) {
    const uint32_t u = key(i);
    equal[i] = u == t;
    below[i] = u < t;
  }
}

// The j-th equal key (index order) is selected iff select_keeps says so.
struct KeepEqual {
  const SelectState* s;
  uint8_t* selected;
  __device__ void operator()(int64_t i, int64_t j) const {
    if (select_keeps(s->prefix, s->prefix, j, s->k_left)) selected[i] = 1;
  }
};
struct WriteIndex {
  uint32_t* idx;
  __device__ void operator()(int64_t i, int64_t j) const { idx[j] = static_cast<uint32_t>(i); }
};

__global__ void iota_kernel(int64_t n, uint32_t* idx) {
  for (int64_t i = grid_first(); i < n; i += grid_step()) idx[i] = static_cast<uint32_t>(i);
}

// Workspace layout: the state, the two byte flags of n, the compaction's tile counts.
constexpr int64_t kAlign = 256;
inline int64_t aligned(int64_t b) { return (b + kAlign - 1) / kAlign * kAlign; }

template <typename Key>
void select(const Key& key, int64_t n, int64_t k, uint32_t* idx, void* workspace, cudaStream_t stream,
            const char* what) {
  if (k <= 0 || n <= 0) return;
  if (k >= n) {
    iota_kernel<<<grid_for(n), kThreads, 0, stream>>>(n, idx);
    check_launch(what);
    return;
  }
  auto* base = static_cast<uint8_t*>(workspace);
  auto* s = reinterpret_cast<SelectState*>(base);
  uint8_t* equal = base + aligned(sizeof(SelectState));
  uint8_t* below = equal + aligned(n);
  auto* counts = reinterpret_cast<int64_t*>(below + aligned(n));
  init_kernel<<<1, 1, 0, stream>>>(s, k);
  check_launch(what);
  for (int shift = 24; shift >= 0; shift -= 8) {
    hist_kernel<<<grid_for(n), kThreads, 0, stream>>>(key, n, shift, s);
    check_launch(what);
    pick_kernel<<<1, 1, 0, stream>>>(shift, s);
    check_launch(what);
  }
  classify_kernel<<<grid_for(n), kThreads, 0, stream>>>(key, n, s, equal, below);
  check_launch(what);
  compact(equal, n, n, KeepEqual{s, below}, nullptr, counts, stream, what);  // below becomes "selected"
  compact(below, n, k, WriteIndex{idx}, nullptr, counts, stream, what);
}

}  // namespace

int64_t select_workspace_bytes(int64_t numel) {
  const int64_t tiles = compact_tiles(numel);
  return aligned(sizeof(SelectState)) + 2 * aligned(numel) + 8 * (tiles < 1 ? 1 : tiles);
}

void topk_select(const float* c, int64_t numel, int64_t k, uint32_t* idx, void* workspace,
                 cudaStream_t stream) {
  select(TopKKey{c}, numel, k, idx, workspace, stream, "top-k select");
}

void randomk_select(int64_t numel, int64_t k, uint64_t seed, uint32_t step, uint32_t* idx,
                    uint64_t offset, void* workspace, cudaStream_t stream) {
  select(RandomKKey{randomk_philox_key(seed, step), offset}, numel, k, idx, workspace, stream,
         "random-k select");
}

}  // namespace cuda
}  // namespace hvdc
