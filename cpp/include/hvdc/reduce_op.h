// The reductions a collective call can ask for; values are shared with hvd_compress/ops/constants.py
// and are Horovod's (horovod/common/message.h), so a Horovod op constant means the same here.
#pragma once
#include <cstdint>

namespace hvdc {

enum class ReduceOp : int32_t {
  kAverage = 0,
  kSum = 1,
  kAdasum = 2,
  kMin = 3,
  kMax = 4,
  kProduct = 5,
};

inline const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "Sum";
    case ReduceOp::kAverage: return "Average";
    case ReduceOp::kAdasum: return "Adasum";
    case ReduceOp::kMin: return "Min";
    case ReduceOp::kMax: return "Max";
    case ReduceOp::kProduct: return "Product";
  }
  return "unknown";
}

// The element-wise ops a Communicator reduces with (Average is Sum then a scale, in dense_allreduce).
inline bool is_elementwise_op(ReduceOp op) {
  return op == ReduceOp::kSum || op == ReduceOp::kMin || op == ReduceOp::kMax ||
         op == ReduceOp::kProduct;
}

}  // namespace hvdc
