// Adasum allreduce by recursive vector halving (ADASUMRVH), paper 002 (shared/papers/002_*.txt),
// Algorithm 1 (lines 1-25 of its algorithm box) and Section 4.2, for any number of ranks:
//
//   fold-in    (DESIGN.md): with p the largest power of two <= n, rank r >= p sends its vector to
//              rank r - p, which replaces its own with Adasum(g[r-p], g[r]).
//   levels     (Algorithm 1, lines 2-18): at distance d = 1, 2, 4, ... < p each rank keeps one half
//              of its current slice and swaps the other half with rank ^ d (lines 2-13); the lower
//              rank keeps the first floor(len/2) elements, as Horovod's adasum.h does. Per tensor
//              of the fused buffer, partial dot product and squared norms (line 15) are summed by
//              ONE allreduce of 3 doubles per tensor within the 2d ranks that share the slice
//              (lines 16-17), then the pair is combined (line 18):
//              x' = (1 - dot/(2|a|^2)) a + (1 - dot/(2|b|^2)) b, a = lower rank's half.
//   allgather  (lines 22-24): the halvings are undone in reverse order.
//   fold-out   (DESIGN.md): rank r - p sends the result to rank r >= p.
//
// Everything is written over the Communicator interface (no MPI here), so it runs against an
// in-process communicator in cpp/tests. The NumPy mirror is hvd_compress/reference/adasum.py,
// with the same step names.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "hvdc/comm_stats.h"
#include "hvdc/communicator.h"
#include "hvdc/device.h"
#include "hvdc/tensor.h"

namespace hvdc {

// What adasum_rvh needs besides the data: the group communicators of every level, split once and
// reused by every call (a split is a collective costing a round trip), and a receive buffer that
// grows to the largest call seen.
class AdasumPlan {
 public:
  // Collective over `comm` (every rank must construct it at the same point). `comm` is borrowed
  // and must outlive the plan: the pair exchanges of the levels and the fold use it directly.
  explicit AdasumPlan(Communicator& comm);
  AdasumPlan(const AdasumPlan&) = delete;
  AdasumPlan& operator=(const AdasumPlan&) = delete;

  Communicator& comm() const { return comm_; }
  // The largest power of two <= comm().size(): ranks below it run the levels.
  int pow2() const { return pow2_; }
  // Level i (distance 2^i): the 2^(i+1) ranks r with the same r >> (i+1). Empty for ranks >= pow2.
  Communicator& level_group(size_t i) const { return *levels_[i]; }
  size_t levels() const { return levels_.size(); }

  // Bytes that the level groups moved since the last call (the pair exchanges are counted on
  // comm() itself), and resets them.
  CommStats take_stats();
  // At least `bytes` of scratch, kept between calls.
  unsigned char* scratch(size_t bytes);

 private:
  Communicator& comm_;
  int pow2_ = 1;
  std::vector<std::unique_ptr<Communicator>> levels_;
  std::vector<unsigned char> scratch_;
};

// In place: every rank's `fused` becomes the Adasum of all ranks' `fused`, with dot products and
// coefficients per tensor; `tensor_sizes` (sum = fused.numel) cut the fused buffer into tensors.
// Identical arguments on every rank are the caller's job (Runtime exchanges a signature first).
// `dev`: the device whose memory `fused` is in (hvdc/device.h; null: the CPU's); every kernel, and
// every byte that crosses the wire, goes through it (a device's halves are staged in host buffers).
void adasum_rvh(AdasumPlan& plan, const TensorView& fused, const std::vector<int64_t>& tensor_sizes,
                DeviceTable* dev = nullptr);

// Hierarchical Adasum: the ranks of a node average their vectors (sum in double, divided by the
// node size, rounded to the storage dtype), the node leaders (local rank 0) run adasum_rvh over
// the nodes in leader rank order, and each leader broadcasts the result within its node. Other
// local ranks idle during the cross-node step: it keeps one copy of the result per node, so
// every rank of a node ends bit-identical.
class HierarchicalAdasumPlan {
 public:
  // Collective over `world`. `node` holds the ranks of this rank's node, ordered by world rank.
  HierarchicalAdasumPlan(Communicator& world, std::unique_ptr<Communicator> node);
  HierarchicalAdasumPlan(const HierarchicalAdasumPlan&) = delete;
  HierarchicalAdasumPlan& operator=(const HierarchicalAdasumPlan&) = delete;

  Communicator& node() const { return *node_; }
  bool is_leader() const { return node_->rank() == 0; }
  // Only on leaders.
  AdasumPlan& cross() const { return *cross_; }

  CommStats take_stats();

 private:
  std::unique_ptr<Communicator> node_;
  std::unique_ptr<Communicator> leaders_;  // leaders: one rank per node; others: unused
  std::unique_ptr<AdasumPlan> cross_;      // over leaders_, on leaders only
};

void adasum_hierarchical(HierarchicalAdasumPlan& plan, const TensorView& fused,
                         const std::vector<int64_t>& tensor_sizes);

}  // namespace hvdc
