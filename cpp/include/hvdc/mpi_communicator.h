// Communicator over MPI. Owns a duplicate of the communicator it is given, so that its traffic
// never matches Horovod's messages on the same world, and frees it on destruction.
//
// Waiting: every transfer (sendrecv, allgather, alltoall, broadcast, allreduces as MPI_Iallreduce,
// the large float sums as a ring of non-blocking sends and receives from 64 KiB per rank,
// isend/irecv) posts non-blocking requests and polls them, yielding the core between polls and
// sleeping between polls once a wait passes 5 ms, instead of Open MPI's blocking calls, which spin
// without yielding. On a node with more busy threads than cores (several ranks per node, Horovod's
// background thread) a spinning waiter otherwise takes the core from the very peer it waits for.
//
// Stalls: a wait inside a collective that every rank has joined (the signatures agreed) that lasts
// longer than the stall timeout (the runtime's HVDC_TIMEOUT) aborts the whole job with a message
// naming the rank and the transfer. Why abort and not raise: the pending MPI requests of such a
// transfer can be neither cancelled (nonblocking collectives) nor left to write into buffers that
// an exception would free, and a rank that raised would leave its peers waiting forever; seen once
// on the emulated two-node network (tools/two_nodes.sh), where two ranks waited in an alltoall
// whose peers had already finished it.
//
// Peers that leave: a rank whose process exits normally (its script ends, or calls sys.exit) while
// another waits for it would otherwise leave that rank waiting until the timeout, and then in
// MPI_Finalize. So each rank says goodbye before MPI is finalized (PeerWatch::leave, from an atexit
// hook in Python), and every wait polls for a goodbye: a wait for a rank that has left ends with
// PeerExitedError naming it (in the signature exchange, at once: a rank that left is in no exchange)
// or, after kGoodbyeGraceS, an abort naming it (inside an agreed collective, as a stall; the grace
// lets what the leaving rank sent before it left still arrive, so a peer that finished its last
// collective and exited never fails the others).
#pragma once
#include <mpi.h>

#include <atomic>
#include <memory>
#include <mutex>
#include <vector>

#include "hvdc/communicator.h"

namespace hvdc {

// Seconds a wait goes on after a peer said goodbye, for what that peer sent before it left.
constexpr double kGoodbyeGraceS = 10.0;

// The goodbye messages of ranks that leave the job, on a duplicate of the world of their own. Each
// rank keeps a receive from every peer posted from the start, so that a goodbye is matched wherever
// its receiver is (in a wait, or in MPI_Finalize); departed() tests them, from any thread.
class PeerWatch {
 public:
  explicit PeerWatch(MPI_Comm world);  // collective: duplicates `world`
  ~PeerWatch();
  PeerWatch(const PeerWatch&) = delete;
  PeerWatch& operator=(const PeerWatch&) = delete;

  // The world rank of the first peer that said goodbye, or -1.
  int departed();
  // Says goodbye to every peer not known to have left, waiting at most `timeout_s` until each has
  // matched it (synchronous sends: when this returns, a peer waiting for this rank knows). Once only.
  void leave(double timeout_s);

 private:
  std::mutex mu_;
  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  std::vector<MPI_Request> recvs_;  // from each rank (this rank's own: MPI_REQUEST_NULL)
  std::vector<int> from_;           // their buffers
  std::vector<char> gone_;          // ranks whose goodbye arrived
  bool left_ = false;
  std::atomic<int> departed_{-1};
};

class MpiCommunicator final : public Communicator {
 public:
  // Duplicates `comm`; MPI must be initialized (by mpi4py or Horovod) before this.
  explicit MpiCommunicator(MPI_Comm comm);
  ~MpiCommunicator() override;
  MpiCommunicator(const MpiCommunicator&) = delete;
  MpiCommunicator& operator=(const MpiCommunicator&) = delete;

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

  // Ranks that share memory with this one (MPI_Comm_split_type SHARED).
  std::unique_ptr<Communicator> split_shared() const;

  static bool mpi_initialized();
  // MPIX_Query_cuda_support(): 1 where this MPI takes device pointers, 0 where it does not, -1
  // where it has no such query (an MPI other than Open MPI).
  static int cuda_support();

  // A wait inside an agreed collective that outlasts the stall timeout aborts the job (see above).
  void set_stall_timeout(double s) override { stall_->store(s); }
  // Waits of this communicator and of those split from it later end when a peer has left (see
  // above). Null: they do not watch.
  void set_peer_watch(std::shared_ptr<PeerWatch> watch) { watch_ = std::move(watch); }
  // Says goodbye through the peer watch, if any (PeerWatch::leave).
  void leave(double timeout_s) override;

 private:
  struct Adopt {};
  MpiCommunicator(MPI_Comm owned, Adopt, std::shared_ptr<std::atomic<double>> stall,
                  std::shared_ptr<PeerWatch> watch);
  // wait_yielding() for the requests of an agreed collective, under the stall timeout.
  void wait(int n, MPI_Request* reqs, const char* what) const;
  // allreduce_sum of float buffers large enough for a ring (mpi_communicator.cc).
  void ring_allreduce_sum(void* buf, int64_t count, DType dtype);
  // Every other allreduce: MPI_Iallreduce in place, chunk by chunk, each under wait().
  void iallreduce_chunks(char* p, int64_t count, size_t esize, MPI_Datatype type, MPI_Op op);

  MPI_Comm comm_ = MPI_COMM_NULL;
  int rank_ = 0;
  int size_ = 1;
  std::shared_ptr<std::atomic<double>> stall_ = std::make_shared<std::atomic<double>>(0.0);
  std::shared_ptr<PeerWatch> watch_;
  // The ring's receive buffer, grown to the largest chunk seen up to kRingScratchKeepBytes (calls on
  // one communicator are serial).
  std::unique_ptr<char[]> ring_scratch_;
  size_t ring_scratch_bytes_ = 0;
  // allgather_timed's block as sent (see there).
  std::vector<char> join_send_;
};

// The world communicator of a Runtime: a duplicate of `world` that watches for departed peers, set
// before any split so that the communicators split from it watch too. Collective.
std::unique_ptr<MpiCommunicator> watched_world(MPI_Comm world);

}  // namespace hvdc
