// The only way collectives in this core talk to other ranks. Algorithms (allreduce, Adasum, 1-bit)
// are written against this interface so that they can run over MPI in production and over an
// in-process implementation in C++ tests.
#pragma once
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "hvdc/comm_stats.h"
#include "hvdc/dtype.h"
#include "hvdc/reduce_op.h"

namespace hvdc {

// One non-blocking point-to-point transfer (Communicator::isend / irecv). The buffer it was given
// must stay alive and untouched until it completes; the destructor makes sure it does not outlive
// it: a pending send is waited for, a pending receive is cancelled (or, where the transport cannot
// cancel, waited for). Declare requests after the buffers they use, so they are destroyed first.
class CommRequest {
 public:
  virtual ~CommRequest() = default;
  // true once complete (then the buffer is free again). Also advances the transport: with MPI's
  // TCP transport a transfer moves only inside MPI calls, so a rank that computes between
  // transfers calls test() between pieces of its work.
  virtual bool test() = 0;
  // Until complete. Waits as the blocking calls of the implementation do (yielding the core).
  virtual void wait() = 0;
};
using Request = std::unique_ptr<CommRequest>;

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
  // What allgather_timed tells its caller while some rank has not joined: every `every_s` seconds
  // (> 0; 0: never), the seconds waited and the ranks whose block has not arrived yet, in rank order.
  struct JoinWatch {
    double every_s = 0;
    std::function<void(double waited_s, const std::vector<int>& missing)> report;
  };
  // As allgather, but gives up with CommTimeoutError naming the ranks that have not joined when some
  // rank has not within `timeout_s` seconds (a non-positive timeout waits forever). Each rank's block
  // travels on its own, so the wait knows which ranks it still waits for (`watch`).
  virtual void allgather_timed(const void* send, void* recv, size_t bytes, double timeout_s,
                               const JoinWatch& watch) = 0;
  void allgather_timed(const void* send, void* recv, size_t bytes, double timeout_s) {
    allgather_timed(send, recv, bytes, timeout_s, JoinWatch{});
  }
  // Send to `dst` and receive from `src` at once; either may equal rank() only if both do.
  virtual void sendrecv(const void* send, size_t send_bytes, int dst, void* recv, size_t recv_bytes,
                        int src) = 0;
  // Block j of `send` (bytes each) goes to rank j; block i of `recv` comes from rank i.
  virtual void alltoall(const void* send, void* recv, size_t bytes) = 0;
  virtual void broadcast(void* buf, size_t bytes, int root) = 0;
  // Non-blocking send of `bytes` to `dst` / receive of exactly `bytes` from `src` (not this rank),
  // matched by `tag` (0 <= tag < kMaxTag) in posting order per (source, tag), apart from every
  // other call's traffic. Every rank must post matching sends and receives; bytes count in stats()
  // when posted. The collective that uses them completes all its requests before it returns.
  static constexpr int kMaxTag = 1 << 14;
  virtual Request isend(const void* buf, size_t bytes, int dst, int tag) = 0;
  virtual Request irecv(void* buf, size_t bytes, int src, int tag) = 0;
  // Ranks with the same color form a new communicator, ordered by (key, rank).
  virtual std::unique_ptr<Communicator> split(int color, int key) const = 0;

  // Seconds a wait inside a collective that every rank has joined may last (<= 0: forever), shared
  // with the communicators split from this one later. The runtime sets its timeout here; a
  // transport that detects hangs by other means ignores it.
  virtual void set_stall_timeout(double /*s*/) {}
  // This process is exiting: tell every peer, so that one waiting for this rank stops waiting
  // (mpi_communicator.h, PeerWatch). Waits at most `timeout_s`. Nothing to do where ranks cannot
  // outlive each other (the threads of one process).
  virtual void leave(double /*timeout_s*/) {}

  CommStats& stats() { return stats_; }
  const CommStats& stats() const { return stats_; }

 protected:
  CommStats stats_;
};

// "rank 0", "ranks 0 and 2", "ranks 0, 1 and 3": ranks for a message.
inline std::string rank_list(const std::vector<int>& ranks) {
  std::string out = ranks.size() == 1 ? "rank " : "ranks ";
  for (size_t i = 0; i < ranks.size(); ++i)
    out += (i == 0 ? "" : i + 1 == ranks.size() ? " and " : ", ") + std::to_string(ranks[i]);
  return out;
}

}  // namespace hvdc
