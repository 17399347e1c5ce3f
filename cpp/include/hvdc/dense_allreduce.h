// Sum/Average allreduce of one contiguous buffer, in place. float32/float64 go to MPI as they are;
// float16/bfloat16 are widened to float32 first, so partial sums keep float32 precision.
#pragma once
#include "hvdc/communicator.h"
#include "hvdc/reduce_op.h"
#include "hvdc/tensor.h"

namespace hvdc {

void dense_allreduce(Communicator& comm, const TensorView& t, ReduceOp op);

}  // namespace hvdc
