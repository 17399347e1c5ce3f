// A non-owning view of a framework tensor's memory, as received through DLPack.
#pragma once
#include <cstdint>
#include <vector>

#include "hvdc/dtype.h"

namespace hvdc {

enum class Device : int32_t { kCPU = 0, kCUDA = 1 };

struct TensorView {
  void* data = nullptr;
  int64_t numel = 0;
  DType dtype = DType::kFloat32;
  Device device = Device::kCPU;
  int32_t device_id = 0;  // the CUDA device's ordinal (DLPack's device_id); 0 on the CPU
  // The framework's dims, read only for the call signature: ranks whose tensors hold the same
  // number of elements in different shapes (2x3 vs 3x2) must raise, as Horovod does, instead of
  // reducing unrelated elements together. Empty means a flat buffer of `numel` elements (what the
  // core's own buffers and C++ callers pass); the kernels never look at it.
  std::vector<int64_t> shape;

  size_t nbytes() const { return static_cast<size_t>(numel) * dtype_size(dtype); }
};

}  // namespace hvdc
