// The only way collectives in this core talk to other ranks. Algorithms (allreduce, Adasum, 1-bit)
// are written against this interface so that they can run over MPI in production and over an
// in-process implementation in C++ tests.
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>

#include "hvdc/comm_stats.h"
#include "hvdc/dtype.h"
#include "hvdc/reduce_op.h"

namespace hvdc {

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;

  // Element-wise sum over all ranks, in place; dtype is float32 or float64.
  virtual void allreduce_sum(void* buf, int64_t count, DType dtype) = 0;
  // Element-wise `op` (Sum, Min, Max or Product: is_elementwise_op) over all ranks, in place;
  // dtype is float32, float64 or an integer type (integers wrap around as in MPI).
  virtual void allreduce_op(void* buf, int64_t count, DType dtype, ReduceOp op) = 0;
  // Every rank contributes `bytes` and receives size() * bytes, ordered by rank.
  virtual void allgather(const void* send, void* recv, size_t bytes) = 0;
  // As allgather, but gives up with CommTimeoutError when some rank has not joined within
  // `timeout_s` seconds (a non-positive timeout waits forever).
  virtual void allgather_timed(const void* send, void* recv, size_t bytes, double timeout_s) = 0;
  // Send to `dst` and receive from `src` at once; either may equal rank() only if both do.
  virtual void sendrecv(const void* send, size_t send_bytes, int dst, void* recv, size_t recv_bytes,
                        int src) = 0;
  // Block j of `send` (bytes each) goes to rank j; block i of `recv` comes from rank i.
  virtual void alltoall(const void* send, void* recv, size_t bytes) = 0;
  virtual void broadcast(void* buf, size_t bytes, int root) = 0;
  // Ranks with the same color form a new communicator, ordered by (key, rank).
  virtual std::unique_ptr<Communicator> split(int color, int key) const = 0;

  CommStats& stats() { return stats_; }
  const CommStats& stats() const { return stats_; }

 protected:
  CommStats stats_;
};

}  // namespace hvdc
