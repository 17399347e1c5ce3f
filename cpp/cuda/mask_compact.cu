// SLAMB's masked gather and scatter on the device (hvdc/masks.h mask_gather / mask_scatter: the
// masked allreduce's compaction), over the index-order pairing of compact.cuh. Each element is a
// copy of 2, 4 or 8 bytes, as on the CPU.
#include <string>

#include "compact.cuh"
#include "hvdc/cuda/kernels.h"
#include "hvdc/errors.h"

namespace hvdc {
namespace cuda {
namespace {

template <typename T>
struct Gather {
  const T* src;
  T* dst;
  __device__ void operator()(int64_t i, int64_t j) const { dst[j] = src[i]; }
};

template <typename T>
struct Scatter {
  const T* compact;
  T* dst;
  __device__ void operator()(int64_t i, int64_t j) const { dst[i] = compact[j]; }
};

void check_elem(size_t elem, const char* what) {
  if (elem != 2 && elem != 4 && elem != 8)
    throw UsageError(std::string(what) + ": element size " + std::to_string(elem) +
                     " (2, 4 or 8 bytes)");
}

}  // namespace

int64_t mask_workspace_int64(int64_t n) {
  const int64_t tiles = compact_tiles(n);
  return tiles < 1 ? 1 : tiles;
}

void mask_gather(const void* src, const uint8_t* mask, int64_t n, int64_t capacity, size_t elem,
                 void* dst, int64_t* count, int64_t* workspace, cudaStream_t stream) {
  check_elem(elem, "mask gather");
  switch (elem) {
    case 2:
      compact(mask, n, capacity, Gather<uint16_t>{static_cast<const uint16_t*>(src), static_cast<uint16_t*>(dst)},
              count, workspace, stream, "mask gather");
      break;
    case 4:
      compact(mask, n, capacity, Gather<uint32_t>{static_cast<const uint32_t*>(src), static_cast<uint32_t*>(dst)},
              count, workspace, stream, "mask gather");
      break;
    default:
      compact(mask, n, capacity, Gather<uint64_t>{static_cast<const uint64_t*>(src), static_cast<uint64_t*>(dst)},
              count, workspace, stream, "mask gather");
  }
}

void mask_scatter(const void* compact_src, const uint8_t* mask, int64_t n, int64_t count,
                  size_t elem, void* dst, int64_t* used, int64_t* workspace, cudaStream_t stream) {
  check_elem(elem, "mask scatter");
  switch (elem) {
    case 2:
      compact(mask, n, count,
              Scatter<uint16_t>{static_cast<const uint16_t*>(compact_src), static_cast<uint16_t*>(dst)}, used,
              workspace, stream, "mask scatter");
      break;
    case 4:
      compact(mask, n, count,
              Scatter<uint32_t>{static_cast<const uint32_t*>(compact_src), static_cast<uint32_t*>(dst)}, used,
              workspace, stream, "mask scatter");
      break;
    default:
      compact(mask, n, count,
              Scatter<uint64_t>{static_cast<const uint64_t*>(compact_src), static_cast<uint64_t*>(dst)}, used,
              workspace, stream, "mask scatter");
  }
}

}  // namespace cuda
}  // namespace hvdc
