// Sum/Average/Min/Max/Product allreduce of one contiguous buffer, in place. float32/float64 and
// the integer types go to MPI as they are; float16/bfloat16 are widened to float32 first, so
// partial sums keep float32 precision. Average of integers is Horovod's: the sum times 1/n in
// double, truncated toward zero.
#pragma once
#include "hvdc/communicator.h"
#include "hvdc/device.h"
#include "hvdc/reduce_op.h"
#include "hvdc/tensor.h"

namespace hvdc {

void dense_allreduce(Communicator& comm, const TensorView& t, ReduceOp op);
// The same on `t` in `dev`'s memory (hvdc/device.h): the whole tensor is the payload, reduced on the
// host between a copy out and a copy back (none on the CPU).
void dense_allreduce(Communicator& comm, DeviceTable& dev, const TensorView& t, ReduceOp op);

}  // namespace hvdc
