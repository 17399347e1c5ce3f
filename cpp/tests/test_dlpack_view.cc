// hvdc/dlpack_view.h on hand-made DLTensor fields (no Python, no GPU): a CPU tensor (and pinned
// host memory) becomes a view with its dtype, shape and data; a tensor in CUDA memory reaches the
// CUDA decision and is refused there naming its device and ordinal; other devices, non-contiguous
// layouts and unsupported dtypes are refused with the caller's prefix. The refusal on every rank
// at 2 and 3 ranks is in test_runtime.cc (a rank holding a CUDA tensor).
#include <string>
#include <vector>

#include "check.h"
#include "hvdc/dlpack_view.h"
#include "hvdc/errors.h"

namespace hvdc {
namespace {

std::string refusal(const DLPackFields& t, const std::string& what = "x") {
  try {
    dlpack_view(t, what);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

DLPackFields fields(float* data, const int64_t* shape, const int64_t* strides, int32_t ndim, int32_t device_type,
                    int32_t device_id = 0) {
  DLPackFields t;
  t.data = data;
  t.device_type = device_type;
  t.device_id = device_id;
  t.ndim = ndim;
  t.shape = shape;
  t.strides = strides;
  return t;
}

void cpu_views(Failures& f) {
  f.ran();
  std::vector<float> x(6);
  const int64_t shape[2] = {2, 3}, strides[2] = {3, 1};
  for (int32_t type : {kDLCPU, kDLCUDAHost}) {
    const TensorView v = dlpack_view(fields(x.data(), shape, strides, 2, type));
    f.check(v.device == Device::kCPU && v.data == x.data() && v.numel == 6 && v.dtype == DType::kFloat32 &&
                v.shape == std::vector<int64_t>{2, 3},
            str("device type ", type, ": view device ", static_cast<int>(v.device), ", numel ", v.numel));
  }
  // Null strides are row-major; a dimension of 1 may have any stride.
  const int64_t odd_strides[2] = {1, 99}, row[2] = {2, 1};
  f.check(dlpack_view(fields(x.data(), shape, nullptr, 2, kDLCPU)).numel == 6, "null strides");
  f.check(dlpack_view(fields(x.data(), row, odd_strides, 2, kDLCPU)).numel == 2, "stride of a size-1 dimension");
}

void cuda_is_decided_and_refused(Failures& f) {
  f.ran();
  std::vector<float> x(4);
  const int64_t shape[1] = {4};
  for (int32_t type : {kDLCUDA, kDLCUDAManaged})
    for (int32_t id : {0, 3}) {
      const std::string why = refusal(fields(x.data(), shape, nullptr, 1, type, id), "grad");
      const std::string dev = str(type == kDLCUDA ? "cuda:" : "cuda_managed:", id);
      f.check(why.rfind("grad: tensor is on " + dev, 0) == 0 && why.find("CPU tensors only") != std::string::npos,
              str("device type ", type, " id ", id, ": ", why));
    }
  // The dtype is judged first, on any device: a bool CUDA tensor is refused for its dtype.
  DLPackFields b = fields(x.data(), shape, nullptr, 1, kDLCUDA);
  b.code = 6;
  b.bits = 8;
  f.check(refusal(b).find("unsupported dtype bool8") != std::string::npos, "bool on CUDA: " + refusal(b));
}

void other_refusals(Failures& f) {
  f.ran();
  std::vector<float> x(6);
  const int64_t shape[2] = {2, 3}, transposed[2] = {1, 2};
  const std::string metal = refusal(fields(x.data(), shape, nullptr, 2, 8));
  f.check(metal == "x: tensor is on metal; hvd_compress takes CPU and CUDA tensors", "metal: " + metal);
  const std::string strided = refusal(fields(x.data(), shape, transposed, 2, kDLCPU));
  f.check(strided == "x: tensor is not contiguous; call .contiguous() first", "transposed: " + strided);
  DLPackFields c = fields(x.data(), shape, nullptr, 2, kDLCPU);
  c.code = 5;
  c.bits = 64;
  f.check(refusal(c).rfind("x: unsupported dtype complex64: hvd_compress reduces", 0) == 0, "complex: " + refusal(c));
  f.check(dlpack_dtype(0, 32, 1, false, true) == DType::kInt32, "int32 with allow_ints");
  f.check(dlpack_dtype(1, 8, 1, true, false) == DType::kUInt8, "uint8 with allow_bytes");
}

}  // namespace
}  // namespace hvdc

int main() {
  hvdc::Failures f;
  hvdc::cpu_views(f);
  hvdc::cuda_is_decided_and_refused(f);
  hvdc::other_refusals(f);
  return f.finish("test_dlpack_view");
}
