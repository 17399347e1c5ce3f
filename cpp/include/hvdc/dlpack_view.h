// The one translation from a DLPack tensor (the fields of its DLTensor, read by the binding layer)
// to a core view: dtype, shape, contiguity, and the device it lives on. Framework-free, so that a
// C++ test can hand it a DLTensor of any device without Python or a GPU.
//
// Devices: CPU memory (kDLCPU, and kDLCUDAHost: pinned host memory the CPU reads directly) becomes
// a Device::kCPU view. CUDA memory (kDLCUDA, kDLCUDAManaged) reaches one decision point,
// cuda_view_decision: this build refuses it there, with the device named, before any byte is read.
// Any other device type is refused with its DLPack name.
#pragma once
#include <cstdint>
#include <string>

#include "hvdc/tensor.h"

namespace hvdc {

// DLPack's device types (dlpack.h, DLDeviceType) that the core tells apart.
constexpr int32_t kDLCPU = 1;
constexpr int32_t kDLCUDA = 2;
constexpr int32_t kDLCUDAHost = 3;
constexpr int32_t kDLCUDAManaged = 13;

// What the translation reads of a DLTensor (DLPack's own field meanings).
struct DLPackFields {
  void* data = nullptr;  // data + byte_offset
  int32_t device_type = kDLCPU;
  int32_t device_id = 0;
  uint8_t code = 2;  // DLDataTypeCode: 0 int, 1 uint, 2 float, 4 bfloat, ...
  uint8_t bits = 32;
  uint16_t lanes = 1;
  int32_t ndim = 0;
  const int64_t* shape = nullptr;
  const int64_t* strides = nullptr;  // in elements; null: row-major contiguous
};

// The core dtype of a DLPack dtype; UsageError naming the supported ones otherwise.
// `allow_bytes`: uint8 too (the broadcast of pickled objects); `allow_ints`: every integer type.
DType dlpack_dtype(uint8_t code, uint8_t bits, uint16_t lanes, bool allow_bytes, bool allow_ints);

// The view of `t`; UsageError, prefixed with `what` when given, for anything the core cannot
// address (dtype, device, a non-contiguous layout).
TensorView dlpack_view(const DLPackFields& t, const std::string& what = "", bool allow_bytes = false,
                       bool allow_ints = false);

// The decision for a tensor in CUDA memory on device `device_id` (the DLPack device type given):
// the view to use, or UsageError. Without the CUDA path in the runtime it refuses.
TensorView cuda_view_decision(TensorView v, int32_t device_type, int32_t device_id, const std::string& prefix);

}  // namespace hvdc
