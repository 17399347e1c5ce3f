// The one object that holds the core's mutable state: the world communicator and the settings
// that apply to every collective. Python holds exactly one per process (hvd_compress.ops.runtime).
#pragma once
#include <memory>
#include <string>

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

  // Joins the signature exchange of a collective whose input this rank rejected (`why`), so that
  // every rank raises instead of the others waiting for a peer that never arrives. Always throws.
  [[noreturn]] void reject(int collective, const std::string& why, const std::string& name);

  // Bytes on the wire by this rank, signature exchanges included.
  CommStats stats() const { return world_->stats(); }
  void reset_stats() { world_->stats() = CommStats{}; }

 private:
  void agree(CallSignature sig, const std::string& name);

  std::unique_ptr<MpiCommunicator> world_;
  double timeout_s_;
  bool broken_ = false;  // set after a timeout: a pending request makes the communicator unusable
};

}  // namespace hvdc
