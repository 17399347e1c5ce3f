// Hierarchical-1-bit-All-Reduce: paper 004 (Birder), Section 4, as specs/birder.md section 4 fixes
// it. N = n nodes x m_loc ranks; rank (j, l) is the l-th rank of node j. Written over the
// Communicator interface only (node group, "cross" group of the ranks with the same l).
//
// The buffer of d float32s is zero-padded (virtually) to d_pad = hierarchical_padded_numel(d, N), a
// multiple of 8 * N (spec B7; 8 so that every piece is whole bytes), c1 = d_pad / m_loc, c2 =
// d_pad / N. Rank (j, l) owns chunk C_l = [l c1, (l + 1) c1) and serves S_{l,j} = [l c1 + j c2,
// l c1 + (j + 1) c2).
//   1. intra-node reduce-scatter, full precision, MEAN (spec B6): a = (x_{j,0}[C_l] + ... +
//      x_{j,m-1}[C_l]) / m, float32 sum in local-rank order, one float32 division;
//   2. worker: y = a + e_w (or, with Birder's moments, the ratio m / (b + eps) of the updated
//      moments of a, "grad" mode, spec B5) plus e_w; q = Q(y); e_w = y - q (c1 entries per rank);
//   3. inter-node alltoall among the same-l ranks: piece j (c2 / 8 bytes) to node j;
//   4. server: s = mean over nodes + e_s; u = Q(s); e_s = s - u (c2 entries per rank); inter-node
//      allgather gives u[C_l];
//   5. intra-node allgather gives u (d_pad bits); `buffer` gets the first d as +/-1.0f.
// Worker draws are keyed (seed, step, stream = j, element) and server draws (seed, step, stream =
// kServerStream, element), with `element` the index in the padded buffer: the result depends on
// the nodes (the workers) but not on how a node shards its chunk (hvdc/stochastic_kernels.h).
// Padding is never data: its bits are 0 and decode to nothing, its errors are never touched.
//
// The same collective carries the scaled 1-bit payload of 1-bit Adam/LAMB (paper 003 Alg. 1 lines
// 7-13): stages 2-4 are then compressed_allreduce (hvdc/compressed_allreduce.h, one float32 scale
// per piece) over the cross group on this rank's c1 chunk, with its real elements only, and stage
// 5 gathers the float32 chunk (the intra-node stages move float32 both ways; the inter-node ones
// move 1 bit per element plus the scales). Stages 1 and 5 work in place in `buffer` (the mean of C_l
// lands in x[C_l]) over sendrecv rounds that carry real elements only, so no padded staging copy is
// made; nodes of more than 2 ranks with a padded buffer fall back to an alltoall of padded chunks.
// Flat mode (node == nullptr): every rank is its own node (m_loc = 1): the plain Birder allreduce.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

#include "hvdc/comm_stats.h"
#include "hvdc/communicator.h"
#include "hvdc/compressed_allreduce.h"
#include "hvdc/kernel_isa.h"
#include "hvdc/stochastic_kernels.h"
#include "hvdc/tensor.h"

namespace hvdc {

// Philox stream of the server draws; worker j draws from stream j (0 <= j < 2^31).
constexpr uint32_t kServerStream = 0xFFFFFFFFu;

enum class HierarchicalPayload : int32_t {
  kSign = 1,    // Birder: +/-1, 1 bit per element, no scale
  kScaled = 2,  // 1-bit Adam/LAMB: sign bits and one float32 scale per piece
};

// d rounded up to a multiple of 8 * world_size (0 stays 0).
int64_t hierarchical_padded_numel(int64_t numel, int world_size);

// The groups of one call: `node` (nullptr: flat, every rank its own node), `cross` (the ranks with
// this rank's local index, ordered by node) and this rank's node index (== cross.rank()).
struct HierarchicalGroups {
  Communicator* node = nullptr;
  Communicator* cross = nullptr;
};

struct HierarchicalCall {
  TensorView buffer;        // float32, d: the input; the result on return
  TensorView worker_error;  // float32, c1
  TensorView server_error;  // float32, c2
  HierarchicalPayload payload = HierarchicalPayload::kSign;
  // kSign only:
  PhiloxKey key;                          // seed and step; the stream is set per stage
  // Injected uniforms (tests), or both empty (data == nullptr) to draw from `key`:
  TensorView worker_uniforms;  // float32 (n_nodes, d_pad): row j for node j's worker
  TensorView server_uniforms;  // float32 (d_pad)
  bool has_moments = false;                // Birder "grad" mode: m, b of c1 entries each
  TensorView m, b;
  float beta = 0.95f, one_minus_beta = 0.05f, eps = 1e-8f;
  KernelChoice kernels = KernelChoice::kAuto;  // the runtime's setting (hvdc/kernel_isa.h)
  // kScaled only: how the inter-node 1-bit stage pipelines (the runtime's HVDC_ONEBIT_PIPELINE).
  OneBitPipeline pipeline;
  // The tensors' device (hvdc/device.h); null: cpu_device(kernels). Only the payload (bits, and
  // the float32 chunks of the node stages) crosses to the host.
  DeviceTable* device = nullptr;
};

// Why this rank cannot run `call` on `groups` ("" if it can): dtypes (float32), devices, the sizes
// of the errors, moments and injected uniforms, and non-finite input. Reads only.
std::string hierarchical_check(const HierarchicalGroups& groups, const HierarchicalCall& call);

// The collective (see the top). Every rank must call it with the same d, payload and groups of
// equal-size nodes, after hierarchical_check passed everywhere (the caller agrees first).
void hierarchical_compressed_allreduce(const HierarchicalGroups& groups, const HierarchicalCall& call);

// The cross groups of a world whose nodes are `node` groups, built once (collective over `world`):
// nodes are numbered by their lowest world rank; `invalid()` says why the world cannot run the
// hierarchical collective (nodes of unequal size), the same text on every rank.
class HierarchicalOneBitPlan {
 public:
  HierarchicalOneBitPlan(Communicator& world, Communicator& node);
  HierarchicalOneBitPlan(const HierarchicalOneBitPlan&) = delete;
  HierarchicalOneBitPlan& operator=(const HierarchicalOneBitPlan&) = delete;

  HierarchicalGroups groups() const { return {&node_, cross_.get()}; }
  const std::string& invalid() const { return invalid_; }
  // What the cross group moved since the last call (the node group is counted by its owner).
  CommStats take_stats();

 private:
  Communicator& node_;
  std::unique_ptr<Communicator> cross_;
  std::string invalid_;
};

}  // namespace hvdc
