// The compressed reductions of the dense path: Horovod's `compression=` (fp16) plus bf16, top-k and
// random-k with error feedback, as one core collective (Collective kSparseAllreduce, one runtime
// entry: Runtime::sparse_allreduce). Written over the Communicator interface only; the NumPy mirror
// is hvd_compress/reference/compression.py (same names for the same steps).
//
// kFloat16 / kBFloat16 (Horovod's FP16Compressor: compress before the reduction, decompress after,
// the compressed value is what is reduced): every rank rounds its buffer to the 16-bit type (through
// float32, as every narrowing in the core does), the buffer is cut into n chunks of C = ceil(numel / n)
// elements (the last padded with zeros that are never data), chunk j goes to rank j by alltoall
// (16-bit on the wire), rank j sums its n chunks in float32 in rank order, divides by n for Average,
// rounds the result to 16 bits once, and the 16-bit chunks are allgathered and widened into the buffer's
// dtype. About half the bytes of a float32 ring allreduce; identical bits on every rank.
//
// kTopK and kRandomK keep a float32 error `e` (numel elements) per buffer; c = float32(x) + e is the
// compensated value, k = sparse_k(numel, ratio) elements of it are sent, and afterwards e = c with the
// sent elements set to 0 (residual = input + error - what was sent; sent values are exactly c's).
//   kTopK: the k elements of largest |c| (ties: lower index first) travel as (uint32 index, float32
//     value) pairs by allgather; every rank adds the n * k pairs, rank by rank, into a zero float32
//     buffer (then / n for Average): identical bits on every rank, elements no rank chose become 0.
//   kRandomK: the k indices are those of the k smallest Philox words of (seed, step, kRandomKStream,
//     i), i < numel (ties: lower index first): the same on every rank with no index on the wire; the
//     k values c[idx] are allreduced as one dense float32 buffer (/ n for Average) and scattered into
//     a zero buffer.
//   kTopK with momentum mu > 0 (Deep Gradient Compression, Lin et al., ICLR 2018, Section 3.2:
//     momentum correction and momentum factor masking): a float32 velocity `u` (numel elements) per
//     buffer too; in the same pass u = mu * u + x, then e = e + u (e is DGC's accumulator v), and
//     c = e is what top-k selects from and sends; afterwards e is 0 at the sent elements and, with
//     momentum_masking (the paper's rule, the default), so is u (at the exact indices this rank
//     selected; without it u keeps its momentum there). The caller applies the result without
//     momentum (plain SGD): the momentum lives here. float32 arithmetic, mu rounded to float32 once, no
//     fused multiply-add: u = float32(float32(mu * u) + x).
//   kTopK whose n selections could cover the buffer (n * k >= numel, k summed over the segments) sends
//     every element instead (topk_sends_dense): c goes through kinds 1 and 2's chunked reduction with a
//     float32 wire (2 (n - 1) ceil(numel / n) floats per rank, no more than the (n - 1) k pairs of 8
//     bytes the allgather would cost), summed in rank order as the pairs are; e becomes 0 everywhere and, with momentum_masking, so does u.
//     The result is what top-k at ratio 1 gives, for fewer bytes than the pairs of a lower ratio.
// Selected indices are kept in ascending order (memory order for the gather and scatter). With
// segments (a fused buffer of several tensors), each tensor selects its own k of its own elements.
#pragma once
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "hvdc/communicator.h"
#include "hvdc/device.h"
#include "hvdc/elementwise/select.h"
#include "hvdc/reduce_op.h"
#include "hvdc/tensor.h"

namespace hvdc {

enum class SparseKind : int32_t { kFloat16 = 1, kBFloat16 = 2, kTopK = 3, kRandomK = 4 };

const char* sparse_kind_name(SparseKind kind);

// kRandomKStream, random-k's Philox stream, and the keys and tie rule of the selections are in
// hvdc/elementwise/select.h (the CUDA kernels share them).

struct SparseSpec {
  SparseKind kind = SparseKind::kTopK;
  ReduceOp op = ReduceOp::kAverage;
  double ratio = 1.0;  // top-k/random-k: fraction of the elements sent, in (0, 1]
  uint64_t seed = 0;   // random-k
  uint32_t step = 0;   // random-k: the call's step (the caller's counter, mod 2^32)
  double momentum = 0.0;  // top-k: DGC momentum correction in [0, 1) (0: off, no velocity buffer)
  bool momentum_masking = true;  // with momentum: zero the velocity where this rank sent (DGC's rule)
  // Top-k/random-k: the buffer is these consecutive tensors (elements each; empty: one tensor), and each
  // sends its own k = sparse_k(size, ratio), as Horovod compresses each gradient tensor on its own.
  std::vector<int64_t> segments;
};

// Elements sent of `numel` at `ratio`: floor(ratio * numel + 0.5), at least 1 (0 for an empty buffer),
// at most numel. The same double arithmetic as the reference, so both agree on every rank.
// Inline: the CUDA table (hvd_compress._cuda, which links no core source) counts with it too.
inline int64_t sparse_k(int64_t numel, double ratio) {
  if (numel <= 0) return 0;
  const double k = std::floor(ratio * static_cast<double>(numel) + 0.5);
  return std::clamp<int64_t>(static_cast<int64_t>(std::min(k, 9.0e18)), 1, numel);
}

// Why this rank cannot run the call ("" if it can): op, kind, ratio, buffer dtype and device, the
// error buffer (float32, numel elements, for top-k/random-k), the momentum and its velocity buffer
// (float32, numel elements, when momentum > 0; ignored otherwise), and non-finite inputs (x, or the
// c = x + e, or c = e + mu * u + x, the call would send from), naming the first bad element. Reads only.
std::string sparse_check_input(const TensorView& buffer, const TensorView& error, const TensorView& velocity,
                               const SparseSpec& spec, DeviceTable* device = nullptr);

// Whether a top-k call sends its whole buffer (n * k >= numel, k summed over the segments; see above).
bool topk_sends_dense(int64_t numel, const SparseSpec& spec, int n);

// Ascending indices of the k elements of largest |c| (ties: lower index), c finite.
void topk_select(const float* c, int64_t numel, int64_t k, uint32_t* idx);
// Ascending indices of the k smallest words [offset, offset + numel) of (seed, step, kRandomKStream),
// counted from 0 (the word of element i of a fused buffer is word i: a tensor at `offset` draws its own).
void randomk_select(int64_t numel, int64_t k, uint64_t seed, uint32_t step, uint32_t* idx, uint64_t offset = 0);
// The ascending indices every segment of `spec` sends (top-k of c, or random-k), into `idx`.
void sparse_select(const float* c, int64_t numel, const SparseSpec& spec, std::vector<uint32_t>& idx);

// In place: `buffer` becomes the compressed reduction over all ranks; `error` is updated (top-k and
// random-k), and `velocity` (top-k with momentum > 0; an empty view otherwise). Every rank must call
// it with the same numel, dtype and spec (the runtime agrees on a signature first) and with input that
// passes sparse_check_input (throws UsageError otherwise, before communicating).
void sparse_allreduce(Communicator& comm, const TensorView& buffer, const TensorView& error,
                      const TensorView& velocity, const SparseSpec& spec);
// The same for input that sparse_check_input already accepted on this rank (the runtime checks once,
// before the ranks agree, so that a rejected call leaves every buffer unchanged).
// `device`: the tensors' device (null: the CPU's); top-k and random-k compute on it, only the pairs
// (or values) cross to the host; the 16-bit kinds and a top-k that sends dense copy the buffers.
void sparse_allreduce_prepared(Communicator& comm, const TensorView& buffer, const TensorView& error,
                               const TensorView& velocity, const SparseSpec& spec,
                               DeviceTable* device = nullptr);
// How many elements top-k/random-k sends of a buffer of `numel`: the sum of its segments' sparse_k.
int64_t sparse_total_k(int64_t numel, const SparseSpec& spec);

}  // namespace hvdc
