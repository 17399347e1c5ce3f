// Error-compensated 1-bit allreduce ("compressed allreduce"): paper 003 (1-bit Adam), Algorithm 1,
// lines 7-13, with the three-phase system design of its Section 6 (gather by alltoall, average,
// scatter by allgather), and paper 001 (1-bit LAMB), Algorithm 1, lines 7-13 and Section 5: every
// rank is the server of one chunk. Written over the Communicator interface only.
//
// With n ranks the buffer of `numel` elements is padded (virtually: nothing is copied) to
// P = onebit_padded_numel(numel, n), a multiple of 8 * n, and cut into n chunks of C = P / n
// elements; chunk j is served by rank j.
//   phase 1 (line 7): each rank compresses its whole error-compensated buffer, chunk by chunk
//     (one float32 scale per chunk; worker error updated);
//   gather (line 8): alltoall, block j = [scale of chunk j][C / 8 bytes of bits] goes to rank j;
//   average (line 10): rank j unpacks the n received chunks, averages them, adds its server error,
//     re-compresses the result with one scale and updates its server error;
//   scatter (line 11): allgather of the blocks [server scale][C / 8 bytes of bits];
//   result (line 13): every rank decompresses all chunks into `buffer`: identical bits everywhere.
// Each scale travels in the same message as its bits (one alltoall and one allgather per call
// instead of two each). Padding is never data: its bits are 0, it decompresses to nothing, and it
// is not counted in any scale; errors of padding positions are neither read nor written.
// Wire format, bit order and rounding points: hvdc/onebit_kernels.h.
#pragma once
#include <cstdint>
#include <string>

#include "hvdc/communicator.h"
#include "hvdc/tensor.h"

namespace hvdc {

// numel rounded up to a multiple of 8 * world_size (0 stays 0).
int64_t onebit_padded_numel(int64_t numel, int world_size);

// Why this rank cannot run the call ("" if it can): dtype (float32/float16/bfloat16 buffer,
// float32 errors), device, error sizes (worker: numel; server: padded numel / world_size), and
// non-finite compensated values (buffer + worker error), naming expected vs got. Reads only.
std::string onebit_check_input(const TensorView& buffer, const TensorView& worker_error,
                               const TensorView& server_error, int world_size);

// In place: `buffer` becomes the error-compensated 1-bit average over all ranks; `worker_error`
// (numel float32) and `server_error` (padded numel / size float32) are updated. Every rank must
// call it with the same numel and dtype (the caller agrees on a signature first) and with input
// that passes onebit_check_input (throws UsageError otherwise, before communicating).
void compressed_allreduce(Communicator& comm, const TensorView& buffer,
                          const TensorView& worker_error, const TensorView& server_error);

}  // namespace hvdc
