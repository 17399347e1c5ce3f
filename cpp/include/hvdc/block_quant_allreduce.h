// Block-quantized allreduce (int8 / int4 with a float32 scale per block of 64: hvdc/elementwise/block_quant.h)
// with worker error feedback: the outer gradients of op=DiLoCo's outer_compression (Streaming DiLoCo, arXiv
// 2501.18512, Section 2.4), in the shape of the 1-bit compressed allreduce (compressed_allreduce.h): every rank
// is the server of one chunk. Written over the Communicator interface only.
//
// With n ranks the buffer of `numel` float32 elements is padded (virtually) to n chunks of C elements, C =
// ceil(numel / n) rounded up to a multiple of 64; padding is zero, never data, and its error is neither read
// nor written.
//   compress: c = x + error (error: float32, numel; absent: none), each block of each chunk quantized;
//     error = c - value(code), in the same pass;
//   reduce-scatter: alltoall, chunk j's blocks go to rank j;
//   server: rank j decodes the n chunks it received and sums them in float32 in rank order (from 0), divides
//     by n for Average (one float32 division), and quantizes the result once (no server error);
//   allgather of the server chunks; every rank decodes all of them into x: identical bits everywhere.
// Bytes per rank and direction: (n - 1) * C / 64 blocks of block_quant_block_bytes(bits), twice.
#pragma once
#include <cstdint>
#include <string>

#include "hvdc/communicator.h"
#include "hvdc/device.h"
#include "hvdc/reduce_op.h"
#include "hvdc/tensor.h"

namespace hvdc {

// Why this rank cannot run the call ("" if it can): bits (4 or 8), op (Average or Sum), a contiguous
// float32 buffer on `device`'s memory (null: the CPU's), an error buffer (if given) of the same numel there, and
// finite compensated values (found by the device's kernel).
std::string block_quant_check_input(const TensorView& buffer, const TensorView& error, int bits, ReduceOp op,
                                    DeviceTable* device = nullptr);

// The call, once every rank accepted its input (Runtime::block_quant_allreduce), on `dev`: its kernels on its
// memory, only the quantized blocks copied to and from host memory ((3n + 1) chunks of blocks per call on a
// device whose memory is not the host's).
void block_quant_allreduce_prepared(Communicator& comm, DeviceTable& dev, const TensorView& buffer,
                                    const TensorView& error, int bits, ReduceOp op);

// The CPU kernels (the CPU's and the staged device's table), for a caller (and a test) without the exchange:
// quantize `count` elements of x + error (a multiple of 64; error may be null; only the first `valid` are
// read, the rest are zero padding) into `out` (count / 64 blocks), writing error = c - value; decode `count`
// elements of `in` into `x`; and the server's sum of `nranks` chunks of `count` elements `stride` bytes apart
// (block_quant_reduce_at) into `out`.
void block_quant_compress(const float* x, float* error, int64_t count, int64_t valid, int bits, uint8_t* out);
void block_quant_decompress(const uint8_t* in, int64_t count, int bits, float* x);
void block_quant_reduce(const uint8_t* chunks, size_t stride, int nranks, int64_t count, int bits, bool average,
                        float* out);

}  // namespace hvdc
