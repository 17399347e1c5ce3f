// The reductions a collective call can ask for; values are shared with hvd_compress/ops/constants.py
// and are Horovod's (horovod/common/message.h), so a Horovod op constant means the same here.
#pragma once
#include <cstdint>

namespace hvdc {

enum class ReduceOp : int32_t { kAverage = 0, kSum = 1, kAdasum = 2 };

inline const char* reduce_op_name(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return "Sum";
    case ReduceOp::kAverage: return "Average";
    case ReduceOp::kAdasum: return "Adasum";
  }
  return "unknown";
}

}  // namespace hvdc
