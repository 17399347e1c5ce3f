// The DLPack translation (hvdc/dlpack_view.h).
#include "hvdc/dlpack_view.h"

#include <utility>

#include "hvdc/errors.h"

namespace hvdc {

namespace {

const char* const kSupported = "hvd_compress reduces float16, bfloat16, float32 and float64";
const char* const kSupportedWithInts =
    "this collective takes float16, bfloat16, float32, float64, uint8, int8, int16, int32 and int64";

// DLPack's name of a device type (dlpack.h), for messages.
std::string device_name(int32_t type) {
  switch (type) {
    case 1: return "cpu";
    case 2: return "cuda";
    case 3: return "cuda_host";
    case 4: return "opencl";
    case 7: return "vulkan";
    case 8: return "metal";
    case 9: return "vpi";
    case 10: return "rocm";
    case 11: return "rocm_host";
    case 12: return "ext_dev";
    case 13: return "cuda_managed";
    case 14: return "oneapi";
    case 15: return "webgpu";
    case 16: return "hexagon";
    default: return "device type " + std::to_string(type);
  }
}

}  // namespace

DType dlpack_dtype(uint8_t code, uint8_t bits, uint16_t lanes, bool allow_bytes, bool allow_ints) {
  constexpr uint8_t kInt = 0, kUInt = 1, kFloat = 2, kBfloat = 4;
  if (lanes == 1 && allow_ints) {
    if (code == kUInt && bits == 8) return DType::kUInt8;
    if (code == kInt && bits == 8) return DType::kInt8;
    if (code == kInt && bits == 16) return DType::kInt16;
    if (code == kInt && bits == 32) return DType::kInt32;
    if (code == kInt && bits == 64) return DType::kInt64;
  }
  if (lanes == 1) {
    if (code == kFloat && bits == 16) return DType::kFloat16;
    if (code == kFloat && bits == 32) return DType::kFloat32;
    if (code == kFloat && bits == 64) return DType::kFloat64;
    if (code == kBfloat && bits == 16) return DType::kBFloat16;
    if (allow_bytes && code == kUInt && bits == 8) return DType::kUInt8;
  }
  static const char* kinds[] = {"int", "uint", "float", "opaque", "bfloat", "complex", "bool"};
  const std::string kind = code < 7 ? kinds[code] : "code" + std::to_string(code);
  throw UsageError("unsupported dtype " + kind + std::to_string(bits) + ": " +
                   (allow_ints ? kSupportedWithInts : kSupported));
}

TensorView cuda_view_decision(TensorView v, int32_t device_type, int32_t device_id, const std::string& prefix) {
  (void)v;
  throw UsageError(prefix + "tensor is on " + device_name(device_type) + ":" + std::to_string(device_id) +
                   "; this build of hvd_compress._core handles CPU tensors only (move it to the CPU; the "
                   "CUDA path is not wired into the runtime yet)");
}

TensorView dlpack_view(const DLPackFields& t, const std::string& what, bool allow_bytes, bool allow_ints) {
  const std::string prefix = what.empty() ? "" : what + ": ";
  TensorView v;
  try {
    v.dtype = dlpack_dtype(t.code, t.bits, t.lanes, allow_bytes, allow_ints);
  } catch (const UsageError& e) {
    throw UsageError(prefix + e.what());
  }
  const bool cuda = t.device_type == kDLCUDA || t.device_type == kDLCUDAManaged;
  if (!cuda && t.device_type != kDLCPU && t.device_type != kDLCUDAHost)
    throw UsageError(prefix + "tensor is on " + device_name(t.device_type) +
                     "; hvd_compress takes CPU and CUDA tensors");
  int64_t expect = 1, numel = 1;
  for (int32_t d = t.ndim; d-- > 0;) {
    if (t.strides != nullptr && t.shape[d] != 1 && t.strides[d] != expect)
      throw UsageError(prefix + "tensor is not contiguous; call .contiguous() first");
    expect *= t.shape[d];
  }
  for (int32_t d = 0; d < t.ndim; ++d) {
    v.shape.push_back(t.shape[d]);
    numel *= t.shape[d];
  }
  v.numel = numel;
  v.data = t.data;
  v.device = cuda ? Device::kCUDA : Device::kCPU;
  v.device_id = t.device_id;
  if (cuda) return cuda_view_decision(std::move(v), t.device_type, t.device_id, prefix);
  return v;
}

}  // namespace hvdc
