// A non-owning view of a framework tensor's memory, as received through DLPack.
#pragma once
#include <cstdint>
#include "hvdc/dtype.h"

namespace hvdc {

enum class Device : int32_t { kCPU = 0, kCUDA = 1 };

struct TensorView {
  void* data = nullptr;
  int64_t numel = 0;
  DType dtype = DType::kFloat32;
  Device device = Device::kCPU;

  size_t nbytes() const { return static_cast<size_t>(numel) * dtype_size(dtype); }
};

}  // namespace hvdc
