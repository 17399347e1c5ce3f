// The one object that holds the core's mutable state: the world communicator and the settings
// that apply to every collective. Python holds exactly one per process (hvd_compress.ops.runtime).
#pragma once
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "hvdc/adasum.h"
#include "hvdc/mpi_communicator.h"
#include "hvdc/reduce_op.h"
#include "hvdc/signature.h"
#include "hvdc/tensor.h"

namespace hvdc {

class Runtime {
 public:
  // `world` is borrowed from mpi4py (or Horovod's world) and duplicated.
  Runtime(MPI_Comm world, double timeout_s);

  int rank() const { return world_->rank(); }
  int size() const { return world_->size(); }
  double timeout() const { return timeout_s_; }
  void set_timeout(double s) { timeout_s_ = s; }

  void allreduce(const TensorView& t, ReduceOp op, const std::string& name);
  void broadcast(const TensorView& t, int root, const std::string& name);
  // In-place Adasum of a fused buffer whose tensors have `tensor_sizes` elements (dot products
  // and coefficients per tensor; see hvdc/adasum.h). `hierarchical`: average within each node
  // (MPI shared-memory node, or blocks of HVDC_LOCAL_SIZE consecutive ranks), Adasum across
  // nodes. Sizes that do not add up to fused.numel are rejected on every rank.
  void adasum(const TensorView& fused, const std::vector<int64_t>& tensor_sizes, bool hierarchical,
              const std::string& name);

  // Joins the signature exchange of a collective whose input this rank rejected (`why`), so that
  // every rank raises instead of the others waiting for a peer that never arrives. Always throws.
  [[noreturn]] void reject(int collective, const std::string& why, const std::string& name);

  // For collectives defined outside this class (e.g. onebit_bindings.cc): hold serialize() for the
  // whole call, exchange the signature with agree(), then communicate on world().
  [[nodiscard]] std::unique_lock<std::mutex> serialize() { return std::unique_lock<std::mutex>(mu_); }
  // Throws on every rank if the ranks' signatures differ or some rank rejected its input; a
  // timeout marks the runtime broken. The caller holds serialize().
  void agree(CallSignature sig, const std::string& name);
  Communicator& world() { return *world_; }

  // Bytes on the wire by this rank, signature exchanges included.
  CommStats stats() const { return world_->stats(); }
  void reset_stats() { world_->stats() = CommStats{}; }

 private:
  // Collectives may be called from several threads (the Adasum optimizer reduces on a worker
  // thread while the main thread may reduce a loss); the communicators and scratch buffers are
  // shared, so one collective runs at a time. Taken with the GIL released.
  std::mutex mu_;
  [[noreturn]] void reject_unlocked(int collective, const std::string& why, const std::string& name);
  std::unique_ptr<MpiCommunicator> world_;
  double timeout_s_;
  bool broken_ = false;  // set after a timeout: a pending request makes the communicator unusable
  // Built by the first Adasum call (collectively: every rank is in that call) and kept, so the
  // per-level group communicators are split once. Declared after world_: destroyed before it.
  std::unique_ptr<AdasumPlan> adasum_plan_;
  std::unique_ptr<HierarchicalAdasumPlan> hierarchical_plan_;
};

}  // namespace hvdc
