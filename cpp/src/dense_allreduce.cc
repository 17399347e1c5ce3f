#include "hvdc/dense_allreduce.h"

#include <algorithm>
#include <vector>

#include "hvdc/cast.h"
#include "hvdc/errors.h"

namespace hvdc {
namespace {

// Half buffers are widened in slices so the float32 scratch stays bounded for huge tensors.
constexpr int64_t kHalfSliceElems = int64_t{1} << 24;

}  // namespace

void dense_allreduce(Communicator& comm, const TensorView& t, ReduceOp op) {
  if (op != ReduceOp::kSum && op != ReduceOp::kAverage)
    throw UsageError(std::string("dense_allreduce: op ") + reduce_op_name(op));
  if (t.numel == 0) return;
  const int n = comm.size();
  if (!is_half(t.dtype)) {
    comm.allreduce_sum(t.data, t.numel, t.dtype);
    if (op == ReduceOp::kAverage && n > 1) scale_in_place(t.data, t.dtype, 1.0 / n, t.numel);
    return;
  }
  const float scale = op == ReduceOp::kAverage ? 1.0f / static_cast<float>(n) : 1.0f;
  std::vector<float> scratch(static_cast<size_t>(std::min(t.numel, kHalfSliceElems)));
  auto* base = static_cast<uint16_t*>(t.data);
  for (int64_t off = 0; off < t.numel; off += kHalfSliceElems) {
    const int64_t len = std::min(kHalfSliceElems, t.numel - off);
    widen_to_float(base + off, t.dtype, scratch.data(), len);
    comm.allreduce_sum(scratch.data(), len, DType::kFloat32);
    narrow_from_float(scratch.data(), scale, base + off, t.dtype, len);
  }
}

}  // namespace hvdc
