#include "hvdc/dense_allreduce.h"

#include <algorithm>
#include <vector>

#include "hvdc/cast.h"
#include "hvdc/errors.h"

namespace hvdc {
namespace {

// Half buffers are widened in slices so the float32 scratch stays bounded for huge tensors.
constexpr int64_t kHalfSliceElems = int64_t{1} << 24;

// Horovod's Average of integers: the sum times 1/n, computed in double and truncated toward zero
// on the store (its ScaleBuffer), so hc and Horovod give the same integers.
template <typename T>
void scale_integers(void* buf, int64_t n, double scale) {
  auto* p = static_cast<T*>(buf);
  for (int64_t i = 0; i < n; ++i) p[i] = static_cast<T>(scale * static_cast<double>(p[i]));
}

void scale_integers(const TensorView& t, double scale) {
  switch (t.dtype) {
    case DType::kUInt8: return scale_integers<uint8_t>(t.data, t.numel, scale);
    case DType::kInt8: return scale_integers<int8_t>(t.data, t.numel, scale);
    case DType::kInt16: return scale_integers<int16_t>(t.data, t.numel, scale);
    case DType::kInt32: return scale_integers<int32_t>(t.data, t.numel, scale);
    case DType::kInt64: return scale_integers<int64_t>(t.data, t.numel, scale);
    default: throw UsageError(std::string("scale_integers: ") + dtype_name(t.dtype));
  }
}
}  // namespace

void dense_allreduce(Communicator& comm, const TensorView& t, ReduceOp op) {
  if (op != ReduceOp::kAverage && !is_elementwise_op(op))
    throw UsageError(std::string("dense_allreduce: op ") + reduce_op_name(op));
  if (t.numel == 0) return;
  const int n = comm.size();
  // Average is a Sum followed by a scale of 1/n.
  const ReduceOp wire = op == ReduceOp::kAverage ? ReduceOp::kSum : op;
  if (is_integer(t.dtype)) {
    comm.allreduce_op(t.data, t.numel, t.dtype, wire);
    if (op == ReduceOp::kAverage && n > 1) scale_integers(t, 1.0 / n);
    return;
  }
  if (!is_half(t.dtype)) {
    if (wire == ReduceOp::kSum)
      comm.allreduce_sum(t.data, t.numel, t.dtype);
    else
      comm.allreduce_op(t.data, t.numel, t.dtype, wire);
    if (op == ReduceOp::kAverage && n > 1) scale_in_place(t.data, t.dtype, 1.0 / n, t.numel);
    return;
  }
  const float scale = op == ReduceOp::kAverage ? 1.0f / static_cast<float>(n) : 1.0f;
  std::vector<float> scratch(static_cast<size_t>(std::min(t.numel, kHalfSliceElems)));
  auto* base = static_cast<uint16_t*>(t.data);
  for (int64_t off = 0; off < t.numel; off += kHalfSliceElems) {
    const int64_t len = std::min(kHalfSliceElems, t.numel - off);
    widen_to_float(base + off, t.dtype, scratch.data(), len);
    if (wire == ReduceOp::kSum)
      comm.allreduce_sum(scratch.data(), len, DType::kFloat32);
    else
      comm.allreduce_op(scratch.data(), len, DType::kFloat32, wire);
    narrow_from_float(scratch.data(), scale, base + off, t.dtype, len);
  }
}

void dense_allreduce(Communicator& comm, DeviceTable& dev, const TensorView& t, ReduceOp op) {
  if (op != ReduceOp::kAverage && !is_elementwise_op(op))
    throw UsageError(std::string("dense_allreduce: op ") + reduce_op_name(op));
  HostCopy host(dev, t.data, t.nbytes());
  TensorView h = t;
  h.data = host.get();
  h.device = Device::kCPU;
  dense_allreduce(comm, h, op);
  host.write_back();
}

}  // namespace hvdc
