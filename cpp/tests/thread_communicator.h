// The in-process Communicator that communicator.h promises: n ranks are n threads of one process,
// sharing one mailbox per group. It lets the collectives in cpp/src (written over Communicator
// only) run in a plain C++ test under AddressSanitizer/UndefinedBehaviorSanitizer, without MPI.
//
// Semantics follow MpiCommunicator (hvdc/mpi_communicator.h) call for call:
//   - point-to-point messages (sendrecv) match in order per (source, destination) pair, as MPI's
//     non-overtaking rule does for one tag; collectives travel on a channel of their own, as MPI
//     keeps collective traffic apart from point-to-point traffic;
//   - allreduce_sum sums float32/float64 in rank order on every rank, so every rank holds the same
//     bits (and throws UsageError for other dtypes, as MpiCommunicator does);
//   - allgather_timed throws CommTimeoutError naming the ranks that have not joined within the
//     timeout, and reports them to its JoinWatch meanwhile; the communicator must not be used again
//     afterwards (its late messages stay queued);
//   - split(color, key) is collective and orders each new group by (key, rank);
//   - stats() counts the same bytes as MpiCommunicator for every call (hvdc/comm_stats.h model
//     for allreduce_sum); the exchange inside split() is not counted, as MPI_Comm_split's is not.
// Sends are buffered (copied into the mailbox), so a sendrecv never waits for its peer's receive,
// and an isend is complete when posted. isend/irecv travel on one channel per tag; an irecv takes
// its message in test()/wait(), so receives with the same (source, tag) must complete in posting
// order (as the pipelined collective's, which use each tag once per call, do).
//
// Not part of the Python extension: it exists for cpp/tests (Makefile target `cpptest`).
#pragma once
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "hvdc/communicator.h"

namespace hvdc {

class ThreadMailbox;  // shared state of one group of ranks (thread_communicator.cc)

// One rank's handle on its group's mailbox. Use it from one thread at a time (the thread of that
// rank), as an MPI communicator is used.
class ThreadCommunicator final : public Communicator {
 public:
  ThreadCommunicator(std::shared_ptr<ThreadMailbox> box, int rank);
  ~ThreadCommunicator() override;
  ThreadCommunicator(const ThreadCommunicator&) = delete;
  ThreadCommunicator& operator=(const ThreadCommunicator&) = delete;

  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void allreduce_sum(void* buf, int64_t count, DType dtype) override;
  void allreduce_op(void* buf, int64_t count, DType dtype, ReduceOp op) override;
  void allgather(const void* send, void* recv, size_t bytes) override;
  using Communicator::allgather_timed;
  void allgather_timed(const void* send, void* recv, size_t bytes, double timeout_s,
                       const JoinWatch& join) override;
  void sendrecv(const void* send, size_t send_bytes, int dst, void* recv, size_t recv_bytes,
                int src) override;
  void alltoall(const void* send, void* recv, size_t bytes) override;
  void broadcast(void* buf, size_t bytes, int root) override;
  Request isend(const void* buf, size_t bytes, int dst, int tag) override;
  Request irecv(void* buf, size_t bytes, int src, int tag) override;
  std::unique_ptr<Communicator> split(int color, int key) const override;

 private:
  // allgather on the collective channel, uncounted.
  void gather_blocks(const void* send, void* recv, size_t bytes) const;

  std::shared_ptr<ThreadMailbox> box_;
  int rank_ = 0;
  int size_ = 1;
  // split() is const in the interface but collective: every rank of a group counts its splits,
  // and the count (the same on every rank, since splits are collective) names the child group.
  mutable uint64_t splits_ = 0;
};

// A world of `size` ranks: owns the world group's mailbox and runs one thread per rank.
class ThreadWorld {
 public:
  // `hang_s` > 0: a wait that has no time limit of its own (everything but allgather_timed)
  // throws CommTimeoutError after `hang_s` seconds instead of waiting forever as MPI would, so
  // that a test that deadlocks fails with a message. 0 waits forever.
  explicit ThreadWorld(int size, double hang_s = 0);
  ~ThreadWorld();
  ThreadWorld(const ThreadWorld&) = delete;
  ThreadWorld& operator=(const ThreadWorld&) = delete;

  int size() const { return size_; }
  // Rank `rank`'s communicator on the world group.
  std::unique_ptr<ThreadCommunicator> communicator(int rank) const;

  // Makes every wait in this world and in every group split from it throw CommError(`why`): a
  // rank that failed will never send what its peers wait for.
  void abort(const std::string& why);

  // Runs `body` on one thread per rank with that rank's world communicator and joins them all.
  // Returns one entry per rank: "" when `body` returned, else the text of the exception that
  // escaped it (which also aborts the world, so that the other ranks stop waiting for this one).
  std::vector<std::string> run(const std::function<void(Communicator&)>& body);

 private:
  int size_;
  std::shared_ptr<ThreadMailbox> box_;
};

}  // namespace hvdc
