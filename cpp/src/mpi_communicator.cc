#include "hvdc/mpi_communicator.h"

#if defined(OPEN_MPI) && OPEN_MPI && __has_include(<mpi-ext.h>)
#include <mpi-ext.h>  // MPIX_Query_cuda_support
#endif

#include <sched.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <memory>
#include <string>
#include <thread>
#include <vector>

#include "hvdc/errors.h"

namespace hvdc {
namespace {

// MPI counts are int; every transfer is cut into pieces below 2^31 bytes.
constexpr size_t kMaxChunkBytes = size_t{1} << 30;

void check(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return;
  char msg[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, msg, &len);
  throw CommError(std::string(what) + " failed: " + std::string(msg, len));
}

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::kFloat32: return MPI_FLOAT;
    case DType::kFloat64: return MPI_DOUBLE;
    default: throw UsageError(std::string("MPI sum is not defined for ") + dtype_name(t));
  }
}

// The MPI type of every dtype allreduce_op takes (the half types are widened by the caller).
MPI_Datatype mpi_numeric_type(DType t) {
  switch (t) {
    case DType::kFloat32: return MPI_FLOAT;
    case DType::kFloat64: return MPI_DOUBLE;
    case DType::kUInt8: return MPI_UINT8_T;
    case DType::kInt8: return MPI_INT8_T;
    case DType::kInt16: return MPI_INT16_T;
    case DType::kInt32: return MPI_INT32_T;
    case DType::kInt64: return MPI_INT64_T;
    default: throw UsageError(std::string("MPI reductions are not defined for ") + dtype_name(t));
  }
}

MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return MPI_SUM;
    case ReduceOp::kMin: return MPI_MIN;
    case ReduceOp::kMax: return MPI_MAX;
    case ReduceOp::kProduct: return MPI_PROD;
    default: throw UsageError(std::string("no element-wise MPI op for ") + reduce_op_name(op));
  }
}

// A float sum whose chunk per rank (bytes / size) is at least this large runs as a ring
// (reduce-scatter, then allgather) over non-blocking point-to-point messages with the yielding
// wait. Why not MPI: its blocking allreduce spins, and on a node with more busy threads than cores
// (a background reduction overlapping backward) the spin takes the core from backward and from
// the peer it waits for; Open MPI's non-blocking MPI_Iallreduce does not spin in our wait, but
// in place it always runs a binomial tree, which sends the whole buffer log2(n) times. The ring
// is bandwidth-optimal (2 (n - 1) / n of the buffer each way per rank, the ring_allreduce_bytes
// the stats count anyway), which is what MPI's tuned algorithms also pick for buffers this large;
// below it the ring's 2 (n - 1) latencies would cost more than they save.
constexpr size_t kRingChunkBytes = size_t{64} << 10;
// The largest ring receive buffer a communicator keeps between calls (bucket_mb's default of 25 MiB
// gives chunks of 12.5 MiB at 2 ranks).
constexpr size_t kRingScratchKeepBytes = size_t{64} << 20;
// Tag of the ring's messages, apart from sendrecv (7) and isend/irecv (kRequestTagBase and up).
constexpr int kRingTag = 9;

// How a rank waits for its peers. Open MPI's blocking calls spin in the progress engine without
// ever giving up the core; on a machine with fewer cores than busy threads (Horovod's background
// thread polls every HOROVOD_CYCLE_TIME; several ranks per node) the spin can keep off the core
// exactly the peer thread it waits for. So every wait polls MPI_Testall and calls sched_yield()
// between polls: on an idle core the yield returns at once (no added latency); on a busy one the
// runnable thread goes first. After a long wait (a late peer, a slow network) it also sleeps briefly
// between polls, so a waiting rank stops burning a core.
double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// A wait longer than this (seconds) sleeps between polls.
constexpr double kYieldOnlyS = 0.005;

enum class Waited { kDone, kTimedOut, kPeerLeft };

// How often a wait asks the watch whether a peer left (seconds).
constexpr double kWatchEveryS = 0.001;

// kDone when all completed; kTimedOut (requests still pending) when `timeout_s` > 0 ran out;
// kPeerLeft (pending) when `watch` saw a peer's goodbye `grace_s` ago, that rank in `*gone`.
Waited wait_yielding(int n, MPI_Request* reqs, double timeout_s, double* waited_s,
                     PeerWatch* watch = nullptr, int* gone = nullptr, double grace_s = kGoodbyeGraceS) {
  const double start = now_s();
  bool patient = false;   // past kYieldOnlyS: sleep between polls
  double gone_at = -1;    // when the watch first reported a departed peer
  double watched = start;  // when the watch was last asked
  for (unsigned polls = 1;; ++polls) {
    int done = 0;
    check(MPI_Testall(n, reqs, &done, MPI_STATUSES_IGNORE), "MPI_Testall");
    if (done) return Waited::kDone;
    // While yielding, the clock is read every 64 polls only (a poll is far below a microsecond).
    if (patient || polls % 64 == 0) {
      const double t = now_s();
      const double waited = t - start;
      if (waited_s != nullptr) *waited_s = waited;
      if (timeout_s > 0 && waited > timeout_s) return Waited::kTimedOut;
      patient = waited > kYieldOnlyS;
      if (watch != nullptr && gone_at < 0 && t - watched >= kWatchEveryS) {
        watched = t;
        const int g = watch->departed();
        if (g >= 0) {
          gone_at = t;
          if (gone != nullptr) *gone = g;
          continue;  // poll the requests once more: what the peer sent before it left counts
        }
      } else if (gone_at >= 0 && t - gone_at >= grace_s) {
        return Waited::kPeerLeft;
      }
    }
    if (patient)
      std::this_thread::sleep_for(std::chrono::microseconds(20));
    else
      sched_yield();
  }
}

// A transfer of an agreed collective made no progress for `waited` seconds: every rank had joined,
// so a peer is stopped or its transport is stuck. Ends the job (see mpi_communicator.h, Stalls).
[[noreturn]] void abort_stalled(const char* what, double waited) {
  int world_rank = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  std::fprintf(stderr,
               "hvd_compress: rank %d waited %.0f s inside %s, a collective every rank had joined; a "
               "peer stopped or the MPI transport is stuck. Aborting the job instead of hanging "
               "(HVDC_TIMEOUT sets the limit).\n",
               world_rank, waited, what);
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::abort();  // MPI_Abort does not return; if it did, this process must still not go on
}

// A peer left the job while this rank waited for it inside an agreed collective. Ends the job as a
// stall does (the pending requests can be neither cancelled nor abandoned).
[[noreturn]] void abort_left(const char* what, int gone) {
  int world_rank = -1;
  MPI_Comm_rank(MPI_COMM_WORLD, &world_rank);
  std::fprintf(stderr,
               "hvd_compress: rank %d left the job (its process exited) while rank %d waited for it inside "
               "%s, a collective every rank had joined. Aborting the job instead of hanging.\n",
               gone, world_rank, what);
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 1);
  std::abort();
}

// wait_yielding() under a stall timeout (<= 0: none), watching for peers that leave.
void wait_or_abort(int n, MPI_Request* reqs, double stall_s, const char* what, PeerWatch* watch) {
  double waited = 0;
  int gone = -1;
  switch (wait_yielding(n, reqs, stall_s, &waited, watch, &gone)) {
    case Waited::kDone: return;
    case Waited::kTimedOut: abort_stalled(what, waited);
    case Waited::kPeerLeft: abort_left(what, gone);
  }
}

// The goodbye's tag on the watch's own communicator.
constexpr int kGoodbyeTag = 11;

}  // namespace

PeerWatch::PeerWatch(MPI_Comm world) {
  check(MPI_Comm_dup(world, &comm_), "MPI_Comm_dup");
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
  recvs_.assign(size_, MPI_REQUEST_NULL);
  from_.assign(size_, -1);
  gone_.assign(size_, 0);
  for (int r = 0; r < size_; ++r)
    if (r != rank_)
      check(MPI_Irecv(&from_[r], 1, MPI_INT, r, kGoodbyeTag, comm_, &recvs_[r]), "MPI_Irecv");
}

PeerWatch::~PeerWatch() {
  if (!MpiCommunicator::mpi_initialized()) return;  // after MPI_Finalize the handles are gone
  for (MPI_Request& req : recvs_) {
    if (req == MPI_REQUEST_NULL) continue;
    MPI_Cancel(&req);
    MPI_Wait(&req, MPI_STATUS_IGNORE);
  }
  MPI_Comm_free(&comm_);
}

int PeerWatch::departed() {
  const int seen = departed_.load();
  if (seen >= 0) return seen;
  // One thread tests the receives at a time; another (a collective on the background thread) reads
  // what it found on a later poll.
  std::unique_lock<std::mutex> lock(mu_, std::try_to_lock);
  if (!lock.owns_lock() || !MpiCommunicator::mpi_initialized()) return departed_.load();
  int count = 0;
  std::vector<int> done(size_);
  if (MPI_Testsome(size_, recvs_.data(), &count, done.data(), MPI_STATUSES_IGNORE) != MPI_SUCCESS ||
      count == MPI_UNDEFINED)
    return -1;
  for (int i = 0; i < count; ++i) gone_[done[i]] = 1;
  for (int r = 0; r < size_; ++r)
    if (gone_[r]) {
      departed_.store(r);
      return r;
    }
  return -1;
}

void PeerWatch::leave(double timeout_s) {
  departed();  // who has left already: no goodbye to them
  const std::lock_guard<std::mutex> lock(mu_);
  if (left_ || !MpiCommunicator::mpi_initialized()) return;
  left_ = true;
  std::vector<MPI_Request> sends;
  for (int r = 0; r < size_; ++r) {
    MPI_Request req;
    if (r != rank_ && !gone_[r] && MPI_Issend(&rank_, 1, MPI_INT, r, kGoodbyeTag, comm_, &req) == MPI_SUCCESS)
      sends.push_back(req);
  }
  // A peer that does not match it in time (stopped, or gone without a word) leaves its request to
  // MPI_Finalize; the receives stay posted, so that the peers' goodbyes are matched too.
  if (!sends.empty()) wait_yielding(static_cast<int>(sends.size()), sends.data(), timeout_s, nullptr);
}

int MpiCommunicator::cuda_support() {
#if defined(MPIX_CUDA_AWARE_SUPPORT)
  return MPIX_Query_cuda_support() ? 1 : 0;
#else
  return -1;
#endif
}

bool MpiCommunicator::mpi_initialized() {
  int init = 0, fin = 0;
  MPI_Initialized(&init);
  MPI_Finalized(&fin);
  return init && !fin;
}

MpiCommunicator::MpiCommunicator(MPI_Comm comm) {
  if (!mpi_initialized()) throw UsageError("MPI is not initialized");
  check(MPI_Comm_dup(comm, &comm_), "MPI_Comm_dup");
  // Errors come back as return codes and become C++ exceptions instead of aborting the job.
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
}

MpiCommunicator::MpiCommunicator(MPI_Comm owned, Adopt, std::shared_ptr<std::atomic<double>> stall,
                                 std::shared_ptr<PeerWatch> watch)
    : comm_(owned), stall_(std::move(stall)), watch_(std::move(watch)) {
  MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  MPI_Comm_rank(comm_, &rank_);
  MPI_Comm_size(comm_, &size_);
}

MpiCommunicator::~MpiCommunicator() {
  // After MPI_Finalize (interpreter shutdown) the handle is gone with the library state.
  if (comm_ != MPI_COMM_NULL && mpi_initialized()) MPI_Comm_free(&comm_);
}

void MpiCommunicator::wait(int n, MPI_Request* reqs, const char* what) const {
  wait_or_abort(n, reqs, stall_->load(), what, watch_.get());
}

namespace {

template <typename T>
void add_into(T* dst, const T* src, int64_t n) {
  for (int64_t i = 0; i < n; ++i) dst[i] += src[i];
}

}  // namespace

// The ring of kRingChunkBytes: chunk c (c = 0..n-1, the first count % n chunks one element longer)
// is summed along the ring ending at rank c, whose sum every rank then receives unchanged, so all
// ranks hold the same bits. Each step sends one chunk to the next rank and receives one from the
// previous; a received partial sum is added into the rank's own copy of that chunk.
void MpiCommunicator::ring_allreduce_sum(void* buf, int64_t count, DType dtype) {
  const size_t esize = dtype_size(dtype);
  const MPI_Datatype type = mpi_type(dtype);
  const int n = size_;
  const int next = (rank_ + 1) % n, prev = (rank_ + n - 1) % n;
  const int64_t base = count / n, extra = count % n;
  const auto start = [&](int c) { return c * base + std::min<int64_t>(c, extra); };
  const auto length = [&](int c) { return base + (c < extra ? 1 : 0); };
  auto* p = static_cast<char*>(buf);
  // The receive buffer: kept across calls up to kRingScratchKeepBytes (a buffer this large comes
  // from mmap, and a fresh one takes a page fault per 4 KiB on every call); a larger chunk gets its
  // own for the call, so that one huge allreduce does not pin memory for the process's life. Left
  // uninitialized: every byte used is received first.
  const size_t need = static_cast<size_t>(base + 1) * esize;
  std::unique_ptr<char[]> once;
  char* incoming = nullptr;
  if (need > kRingScratchKeepBytes) {
    once.reset(new char[need]);
    incoming = once.get();
  } else {
    if (ring_scratch_bytes_ < need) {
      ring_scratch_.reset(new char[need]);
      ring_scratch_bytes_ = need;
    }
    incoming = ring_scratch_.get();
  }
  const auto exchange = [&](int send_c, void* recv_to, int recv_c) {
    MPI_Request reqs[2];
    check(MPI_Irecv(recv_to, static_cast<int>(length(recv_c)), type, prev, kRingTag, comm_, &reqs[0]),
          "MPI_Irecv");
    check(MPI_Isend(p + start(send_c) * esize, static_cast<int>(length(send_c)), type, next, kRingTag, comm_,
                    &reqs[1]),
          "MPI_Isend");
    wait(2, reqs, "a ring allreduce");
  };
  // Reduce-scatter: at step s this rank sends its partial sum of chunk (rank - s) and adds the
  // previous rank's partial sum of chunk (rank - s - 1) into its own; after n - 1 steps it holds
  // the whole sum of chunk (rank + 1).
  for (int s = 0; s < n - 1; ++s) {
    const int send_c = (rank_ - s + 2 * n) % n, recv_c = (rank_ - s - 1 + 2 * n) % n;
    exchange(send_c, incoming, recv_c);
    char* own = p + start(recv_c) * esize;
    if (dtype == DType::kFloat32)
      add_into(reinterpret_cast<float*>(own), reinterpret_cast<const float*>(incoming), length(recv_c));
    else
      add_into(reinterpret_cast<double*>(own), reinterpret_cast<const double*>(incoming), length(recv_c));
  }
  // Allgather: the finished chunks travel on around the ring, each received straight into place.
  for (int s = 0; s < n - 1; ++s) {
    const int send_c = (rank_ + 1 - s + 2 * n) % n, recv_c = (rank_ - s + 2 * n) % n;
    exchange(send_c, p + start(recv_c) * esize, recv_c);
  }
}

void MpiCommunicator::allreduce_sum(void* buf, int64_t count, DType dtype) {
  const size_t esize = dtype_size(dtype);
  const MPI_Datatype type = mpi_type(dtype);
  auto* p = static_cast<char*>(buf);
  if (size_ > 1 && static_cast<size_t>(count) * esize / size_ >= kRingChunkBytes &&
      static_cast<size_t>(count / size_ + 1) * esize < kMaxChunkBytes) {
    ring_allreduce_sum(buf, count, dtype);
  } else {
    iallreduce_chunks(p, count, esize, type, MPI_SUM);
  }
  const uint64_t b = ring_allreduce_bytes(static_cast<size_t>(count) * esize, size_);
  stats_.add(b, b);
}

// Every allreduce but the float sums that take the ring: MPI_Iallreduce and the yielding wait under the
// stall limit, in chunks below kMaxChunkBytes. The blocking MPI_Allreduce's tuned algorithms would send
// fewer bytes for the large ones (float sums of 64 KB to 64 KB x ranks, Min/Max/Product and integer
// sums), but it spins and has no time limit: a stopped peer would hang the job there.
void MpiCommunicator::iallreduce_chunks(char* p, int64_t count, size_t esize, MPI_Datatype type, MPI_Op op) {
  const int64_t chunk = static_cast<int64_t>(kMaxChunkBytes / esize);
  for (int64_t off = 0; off < count; off += chunk) {
    MPI_Request req;
    const int n = static_cast<int>(std::min(chunk, count - off));
    check(MPI_Iallreduce(MPI_IN_PLACE, p + off * esize, n, type, op, comm_, &req), "MPI_Iallreduce");
    wait(1, &req, "an allreduce");
  }
}

void MpiCommunicator::allreduce_op(void* buf, int64_t count, DType dtype, ReduceOp op) {
  const size_t esize = dtype_size(dtype);
  const MPI_Datatype type = mpi_numeric_type(dtype);
  const MPI_Op mop = mpi_op(op);
  iallreduce_chunks(static_cast<char*>(buf), count, esize, type, mop);
  const uint64_t b = ring_allreduce_bytes(static_cast<size_t>(count) * esize, size_);
  stats_.add(b, b);
}

void MpiCommunicator::allgather(const void* send, void* recv, size_t bytes) {
  if (bytes >= kMaxChunkBytes) throw UsageError("allgather block too large");
  // Non-blocking + yielding wait, as sendrecv: a spinning wait holds the core a peer needs.
  MPI_Request req;
  check(MPI_Iallgather(send, static_cast<int>(bytes), MPI_BYTE, recv, static_cast<int>(bytes),
                       MPI_BYTE, comm_, &req),
        "MPI_Iallgather");
  wait(1, &req, "an allgather");
  stats_.add(bytes * (size_ - 1), bytes * (size_ - 1));
}

namespace {

// Tag of allgather_timed's blocks, apart from sendrecv (7), the ring (9) and isend/irecv (64 and up).
constexpr int kJoinTag = 8;

}  // namespace

// Point to point, not MPI_Iallgather: a receive per peer tells which ranks have joined (a collective
// request tells only that some rank has not), for the warnings and the timeout's message. The
// blocks are a call's signature (256 bytes), so n - 1 small messages each way cost no more than
// the collective's rounds.
void MpiCommunicator::allgather_timed(const void* send, void* recv, size_t bytes, double timeout_s,
                                      const JoinWatch& join) {
  if (bytes >= kMaxChunkBytes) throw UsageError("allgather block too large");
  auto* out = static_cast<char*>(recv);
  if (bytes > 0) std::memmove(out + bytes * rank_, send, bytes);
  // The block sent is this communicator's own copy: a failed call leaves sends it cannot cancel,
  // which must not read the caller's freed buffer. One call at a time per communicator.
  join_send_.assign(static_cast<const char*>(send), static_cast<const char*>(send) + bytes);
  std::vector<MPI_Request> recvs(size_, MPI_REQUEST_NULL), sends;
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;
    check(MPI_Irecv(out + bytes * r, static_cast<int>(bytes), MPI_BYTE, r, kJoinTag, comm_, &recvs[r]),
          "MPI_Irecv");
    sends.emplace_back();
    check(MPI_Isend(join_send_.data(), static_cast<int>(bytes), MPI_BYTE, r, kJoinTag, comm_, &sends.back()),
          "MPI_Isend");
  }
  std::vector<MPI_Request> all(recvs);
  all.insert(all.end(), sends.begin(), sends.end());
  // The ranks whose block has not arrived (a completed receive is set to MPI_REQUEST_NULL by MPI_Test).
  const auto missing = [&] {
    std::vector<int> late;
    for (int r = 0; r < size_; ++r) {
      int done = 1;
      if (all[r] != MPI_REQUEST_NULL) check(MPI_Test(&all[r], &done, MPI_STATUS_IGNORE), "MPI_Test");
      if (!done) late.push_back(r);
    }
    return late;
  };
  const double start = now_s();
  const double forever = std::numeric_limits<double>::infinity();
  const double limit = timeout_s > 0 ? timeout_s : forever;
  double next_report = join.every_s > 0 ? join.every_s : forever;
  Waited result = Waited::kDone;
  int gone = -1;
  for (;;) {
    // Until the next report or the timeout, whichever comes first (neither: no limit).
    const double until = std::min(limit, next_report);
    const double slice = until == forever ? 0 : std::max(until - (now_s() - start), 1e-6);
    double waited = 0;
    result = wait_yielding(static_cast<int>(all.size()), all.data(), slice, &waited, watch_.get(), &gone, 0.0);
    if (result != Waited::kTimedOut) break;
    waited = now_s() - start;
    if (waited >= limit) break;
    if (waited >= next_report) {
      const std::vector<int> late = missing();
      if (!late.empty() && join.report) join.report(waited, late);
      next_report += join.every_s;
    }
  }
  if (result == Waited::kDone) {
    stats_.add(bytes * (size_ - 1), bytes * (size_ - 1));
    return;
  }
  // Failed: the late ranks' receives are cancelled (their blocks must not land in the caller's freed
  // buffer); sends that cannot complete are left to MPI. The caller must not use this communicator
  // again (a late block would match a later call's receive), and turns this into an error.
  const std::vector<int> late = missing();
  for (int r : late) {
    MPI_Cancel(&all[r]);
    MPI_Wait(&all[r], MPI_STATUS_IGNORE);
  }
  for (size_t i = size_; i < all.size(); ++i)
    if (all[i] != MPI_REQUEST_NULL) MPI_Request_free(&all[i]);
  if (result == Waited::kPeerLeft)
    throw PeerExitedError("rank " + std::to_string(gone) +
                          " left the job (its process exited: its script ended or called sys.exit) while rank " +
                          std::to_string(rank_) +
                          " waited for it to join this collective; every rank must make the same collective calls "
                          "until all are done");
  throw CommTimeoutError("rank " + std::to_string(rank_) + " waited " +
                         std::to_string(static_cast<int>(now_s() - start)) + " s for " +
                         (late.empty() ? std::string("the other ranks") : rank_list(late)) +
                         " to join a collective; a peer is dead or running different code (HVDC_TIMEOUT sets "
                         "the limit)");
}

void MpiCommunicator::sendrecv(const void* send, size_t send_bytes, int dst, void* recv,
                               size_t recv_bytes, int src) {
  const auto* s = static_cast<const char*>(send);
  auto* r = static_cast<char*>(recv);
  size_t so = 0, ro = 0;
  // Both sides cut the stream at the same offsets, so pieces match one to one.
  while (so < send_bytes || ro < recv_bytes) {
    const int sn = static_cast<int>(std::min(kMaxChunkBytes, send_bytes - so));
    const int rn = static_cast<int>(std::min(kMaxChunkBytes, recv_bytes - ro));
    MPI_Request reqs[2];
    check(MPI_Irecv(r + ro, rn, MPI_BYTE, src, 7, comm_, &reqs[0]), "MPI_Irecv");
    check(MPI_Isend(s + so, sn, MPI_BYTE, dst, 7, comm_, &reqs[1]), "MPI_Isend");
    wait(2, reqs, "a send/receive");
    so += sn;
    ro += rn;
  }
  stats_.add(send_bytes, recv_bytes);
}

void MpiCommunicator::alltoall(const void* send, void* recv, size_t bytes) {
  if (bytes >= kMaxChunkBytes) throw UsageError("alltoall block too large");
  MPI_Request req;
  check(MPI_Ialltoall(send, static_cast<int>(bytes), MPI_BYTE, recv, static_cast<int>(bytes),
                      MPI_BYTE, comm_, &req),
        "MPI_Ialltoall");
  wait(1, &req, "an alltoall");
  stats_.add(bytes * (size_ - 1), bytes * (size_ - 1));
}

void MpiCommunicator::broadcast(void* buf, size_t bytes, int root) {
  auto* p = static_cast<char*>(buf);
  for (size_t off = 0; off < bytes; off += kMaxChunkBytes) {
    const int n = static_cast<int>(std::min(kMaxChunkBytes, bytes - off));
    MPI_Request req;
    check(MPI_Ibcast(p + off, n, MPI_BYTE, root, comm_, &req), "MPI_Ibcast");
    wait(1, &req, "a broadcast");
  }
  if (rank_ == root)
    stats_.add(bytes * (size_ - 1), 0);
  else
    stats_.add(0, bytes);
}

namespace {

// isend/irecv tags sit above the point-to-point tag of sendrecv (7), so that the two never match.
constexpr int kRequestTagBase = 64;

class MpiRequest final : public CommRequest {
 public:
  MpiRequest(MPI_Request req, bool receive, std::shared_ptr<std::atomic<double>> stall,
             std::shared_ptr<PeerWatch> watch)
      : req_(req), receive_(receive), stall_(std::move(stall)), watch_(std::move(watch)) {}
  ~MpiRequest() override {
    if (req_ == MPI_REQUEST_NULL || !MpiCommunicator::mpi_initialized()) return;
    // Only on an error path (the collective completes its requests): a receive is cancelled, a
    // send (Open MPI cannot cancel one) is waited for, so that MPI never touches a freed buffer.
    if (receive_) MPI_Cancel(&req_);
    MPI_Wait(&req_, MPI_STATUS_IGNORE);
  }
  bool test() override {
    if (req_ == MPI_REQUEST_NULL) return true;
    int done = 0;
    check(MPI_Test(&req_, &done, MPI_STATUS_IGNORE), receive_ ? "MPI_Test (irecv)" : "MPI_Test (isend)");
    return done != 0;  // MPI_Test set req_ to MPI_REQUEST_NULL when done
  }
  void wait() override {
    if (req_ != MPI_REQUEST_NULL) wait_or_abort(1, &req_, stall_->load(), "a pipelined transfer", watch_.get());
  }

 private:
  MPI_Request req_;
  bool receive_;
  std::shared_ptr<std::atomic<double>> stall_;
  std::shared_ptr<PeerWatch> watch_;
};

void check_request(size_t bytes, int peer, int size, int tag, const char* what) {
  if (bytes >= kMaxChunkBytes) throw UsageError(std::string(what) + ": message too large");
  if (peer < 0 || peer >= size)
    throw CommError(std::string(what) + ": rank " + std::to_string(peer) + " is not in a group of " +
                    std::to_string(size));
  if (tag < 0 || tag >= Communicator::kMaxTag)
    throw UsageError(std::string(what) + ": tag " + std::to_string(tag) + " out of range");
}

}  // namespace

Request MpiCommunicator::isend(const void* buf, size_t bytes, int dst, int tag) {
  check_request(bytes, dst, size_, tag, "isend");
  MPI_Request req;
  check(MPI_Isend(buf, static_cast<int>(bytes), MPI_BYTE, dst, kRequestTagBase + tag, comm_, &req),
        "MPI_Isend");
  stats_.add(bytes, 0);
  return Request(new MpiRequest(req, false, stall_, watch_));
}

Request MpiCommunicator::irecv(void* buf, size_t bytes, int src, int tag) {
  check_request(bytes, src, size_, tag, "irecv");
  MPI_Request req;
  check(MPI_Irecv(buf, static_cast<int>(bytes), MPI_BYTE, src, kRequestTagBase + tag, comm_, &req),
        "MPI_Irecv");
  stats_.add(0, bytes);
  return Request(new MpiRequest(req, true, stall_, watch_));
}

std::unique_ptr<Communicator> MpiCommunicator::split(int color, int key) const {
  MPI_Comm out;
  check(MPI_Comm_split(comm_, color, key, &out), "MPI_Comm_split");
  return std::unique_ptr<Communicator>(new MpiCommunicator(out, Adopt{}, stall_, watch_));
}

std::unique_ptr<Communicator> MpiCommunicator::split_shared() const {
  MPI_Comm out;
  check(MPI_Comm_split_type(comm_, MPI_COMM_TYPE_SHARED, rank_, MPI_INFO_NULL, &out),
        "MPI_Comm_split_type");
  return std::unique_ptr<Communicator>(new MpiCommunicator(out, Adopt{}, stall_, watch_));
}

void MpiCommunicator::leave(double timeout_s) {
  if (watch_) watch_->leave(timeout_s);
}

std::unique_ptr<MpiCommunicator> watched_world(MPI_Comm world) {
  std::unique_ptr<MpiCommunicator> comm(new MpiCommunicator(world));
  comm->set_peer_watch(std::make_shared<PeerWatch>(world));
  return comm;
}

}  // namespace hvdc
