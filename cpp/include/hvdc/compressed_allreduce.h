// Error-compensated 1-bit allreduce ("compressed allreduce"): paper 003 (1-bit Adam), Algorithm 1,
// lines 7-13, with the three-phase system design of its Section 6 (gather by alltoall, average,
// scatter by allgather), and paper 001 (1-bit LAMB), Algorithm 1, lines 7-13 and Section 5: every
// rank is the server of one chunk. Written over the Communicator interface only.
//
// With n ranks the buffer of `numel` elements is padded (virtually: nothing is copied) to
// P = onebit_padded_numel(numel, n), a multiple of 8 * n, and cut into n chunks of C = P / n
// elements; chunk j is served by rank j.
//   phase 1 (line 7): each rank compresses its whole error-compensated buffer, chunk by chunk
//     (one float32 scale per chunk); this pass only reads, and doubles as the NaN/Inf check;
//   gather (line 8): alltoall, block j = [scale of chunk j][C / 8 bytes of bits] goes to rank j;
//   average (line 10): rank j unpacks the n received chunks, averages them, adds its server error,
//     re-compresses the result with one scale and updates its server error (one fused kernel);
//   scatter (line 11): allgather of the blocks [server scale][C / 8 bytes of bits];
//   result (line 13): every rank decompresses all chunks into `buffer`: identical bits everywhere.
//     The worker error of phase 1 (error = c - (+/-scale)) is written in this same pass, which
//     reads each input value just before the result overwrites it: the buffer and the worker
//     error are streamed twice per call (phase 1, result), not three or four times.
// Each scale travels in the same message as its bits (one alltoall and one allgather per call
// instead of two each). Padding is never data: its bits are 0, it decompresses to nothing, and it
// is not counted in any scale; errors of padding positions are neither read nor written.
// Wire format, bit order and rounding points: hvdc/onebit_kernels.h.
//
// Pipelined run (numel >= OneBitPipeline::min_numel, more than one rank): the same steps on the
// same data, with non-blocking transfers (Communicator::isend/irecv) so that the compute of one
// piece overlaps the transfer of another. Each chunk is cut into S pieces of `piece` elements
// (a multiple of 32; the last may be shorter); scales are still one per whole chunk.
//   gather (line 8): piece s of block j goes to rank j as its own message (piece 0 carries the
//     chunk's worker scale in front of its bits); all receives are posted first, then the sends,
//     piece-major;
//   while the pieces travel, phase 1's second pass (line 7: the worker error, which needs only
//     this rank's own scales) runs in sub-pieces between tests of the transfers (with MPI's TCP
//     transport, data moves only inside MPI calls);
//   average (line 10): as piece s has arrived from every rank, the server runs pass 1 of its step
//     on it (signs, c stored, the double sum of squares carried across pieces with the same
//     accumulators in the same order as one call over the chunk: onebit_server_reduce_signs) and
//     sends the piece's bits to every rank at once (line 11); after the last piece, its scale;
//   while the server chunks travel: pass 2 of the server step (server error), the rest of the
//     worker error, and the decompression of this rank's own chunk; then each other chunk is
//     decompressed (line 13) once its scale has arrived.
// The worker error and the decompression run as two kernels (onebit_compress_error,
// onebit_decompress) instead of the fused one, which the kernels define as the same bytes; so
// results, worker and server errors are bit for bit those of the unpipelined run, and the bytes
// counted are the same (block * (n - 1) each way per phase). Below min_numel (default 2^20
// elements: 4 MB of float32) the unpipelined run's two collective calls cost less than the
// 3 * S * (n - 1) messages and there is little compute to hide.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "hvdc/communicator.h"
#include "hvdc/device.h"
#include "hvdc/kernel_isa.h"
#include "hvdc/tensor.h"

namespace hvdc {

// numel rounded up to a multiple of 8 * world_size (0 stays 0).
int64_t onebit_padded_numel(int64_t numel, int world_size);

// Why this rank cannot run the call ("" if it can): dtype (float32/float16/bfloat16 buffer,
// float32 errors), device, error sizes (worker: numel; server: padded numel / world_size), and
// non-finite compensated values (buffer + worker error), naming expected vs got. Reads only.
std::string onebit_check_input(const TensorView& buffer, const TensorView& worker_error,
                               const TensorView& server_error, int world_size);

// One call split in two around the ranks' agreement (Runtime::compressed_allreduce), so that a
// rank's bad input is rejected on every rank with the error buffers unchanged: onebit_prepare
// checks the input and runs phase 1's first pass (signs and scales of every chunk, reading only;
// the NaN/Inf check is fused into it), then, once every rank has agreed to go on,
// compressed_allreduce_prepared does the rest. The call keeps the phase-1 blocks in between, so
// the buffer and the worker error are read once less than with a separate check.
// When and in what pieces compressed_allreduce_prepared pipelines (see above).
struct OneBitPipeline {
  int64_t piece = int64_t{1} << 17;      // elements per piece, rounded down to a multiple of 32;
                                         // 0: never pipeline; enlarged where S would exceed
                                         // the tags (Communicator::kMaxTag / 2 pieces)
  int64_t min_numel = int64_t{1} << 20;  // smaller buffers run unpipelined
};

// The unpipelined run reaches the tensors only through `device` (hvdc/device.h): kernels, copies
// of the wire blocks between device and host, waits. The pipelined run is the CPU's alone (it
// calls the CPU kernels between the transfers): on another device the call runs unpipelined.
struct OneBitCall {
  TensorView buffer, worker_error, server_error;
  int world_size = 0;
  int64_t chunk = 0;  // C: elements per chunk (padded)
  size_t block = 0;   // bytes of one wire block: float32 scale + C / 8 bytes of bits
  DeviceTable* device = nullptr;  // the tensors' device; null: cpu_device(kernels)
  // Device memory, block j: [worker scale of chunk j][bits of chunk j]; the host reads the
  // blocks at `send_host` (their host copy in `host_send`, or the blocks themselves on the CPU).
  std::unique_ptr<DeviceBuffer> send;
  std::unique_ptr<HostStaging> host_send;
  const uint8_t* send_host = nullptr;
  bool prepared = false;
  KernelChoice kernels = KernelChoice::kAuto;  // set before onebit_prepare (the runtime's setting)
  OneBitPipeline pipeline;
};

// The checks of onebit_check_input and, if they pass, phase 1's first pass into `call`. Returns
// "" when the call can run, else why not (the same messages as onebit_check_input). Reads the
// tensors only.
std::string onebit_prepare(const TensorView& buffer, const TensorView& worker_error,
                           const TensorView& server_error, int world_size, OneBitCall& call);

// The rest of a call that onebit_prepare accepted on this rank (and every rank agreed to run):
// alltoall, server step, allgather, result with the worker error update (pipelined or not, as
// call.pipeline says: the same results either way). comm.size() must be the world_size given to
// onebit_prepare.
void compressed_allreduce_prepared(Communicator& comm, OneBitCall& call);

// In place: `buffer` becomes the error-compensated 1-bit average over all ranks; `worker_error`
// (numel float32) and `server_error` (padded numel / size float32) are updated. Every rank must
// call it with the same numel and dtype (the caller agrees on a signature first) and with input
// that passes onebit_check_input (throws UsageError otherwise, before communicating).
// `device`: the tensors' device table (null: the CPU's).
void compressed_allreduce(Communicator& comm, const TensorView& buffer,
                          const TensorView& worker_error, const TensorView& server_error,
                          KernelChoice kernels = KernelChoice::kAuto,
                          OneBitPipeline pipeline = OneBitPipeline{}, DeviceTable* device = nullptr);

}  // namespace hvdc
