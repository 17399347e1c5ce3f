// Allgather of row-major tensors whose first dimension may differ per rank (Horovod's allgather):
// every rank gets all ranks' rows, concatenated in rank order.
#pragma once
#include <cstdint>
#include <vector>

#include "hvdc/communicator.h"
#include "hvdc/device.h"

namespace hvdc {

// Rank r contributes `rows` rows of `row_bytes` bytes from `send`. On return `rows_per_rank[r]`
// is rank r's row count and `out` holds every rank's rows in rank order. The blocks travel padded
// to the largest rank's row count (one fixed-size allgather after a small one of the counts).
// `send` is memory of `device` (null: the CPU's), whose rows reach the host through its copies;
// `out` is host memory (the face puts it on the tensor's device).
void allgather_rows(Communicator& comm, const void* send, int64_t rows, size_t row_bytes,
                    std::vector<unsigned char>& out, std::vector<int64_t>& rows_per_rank,
                    DeviceTable* device = nullptr);

}  // namespace hvdc
