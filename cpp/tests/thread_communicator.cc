#include "thread_communicator.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <exception>
#include <limits>
#include <map>
#include <mutex>
#include <thread>
#include <tuple>
#include <type_traits>
#include <utility>

#include "hvdc/errors.h"

namespace hvdc {
namespace {

using Clock = std::chrono::steady_clock;

// Point-to-point and collective messages never match each other (MPI keeps them apart too), so a
// sendrecv left over by one rank cannot be taken for a block of the next collective.
// isend/irecv with tag t travel on channel kTagged + t.
enum Channel : int { kPointToPoint = 0, kCollective = 1, kTagged = 2 };

// A waiter re-checks the abort flag at least this often: abort() does not know which mailboxes
// (world or split groups) have waiters, so it does not notify them.
constexpr auto kAbortPoll = std::chrono::milliseconds(5);

double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// Sums `n` rank contributions of `count` T's, stored one after the other in `all`, into `out`, in
// rank order: every rank runs this same loop on the same bytes and gets the same bits.
template <typename T>
void sum_in_rank_order(const unsigned char* all, int n, int64_t count, void* out) {
  auto* o = static_cast<T*>(out);
  const auto* in = reinterpret_cast<const T*>(all);
  std::copy(in, in + count, o);
  for (int r = 1; r < n; ++r)
    for (int64_t i = 0; i < count; ++i) o[i] += in[r * count + i];
}

// a op b for one element: integer Sum and Product wrap around as MPI's do (computed in uint64,
// so there is no signed overflow and no promotion of uint16 * uint16 to int).
template <typename T>
T combine(T a, T b, ReduceOp op) {
  switch (op) {
    case ReduceOp::kMin: return std::min(a, b);
    case ReduceOp::kMax: return std::max(a, b);
    case ReduceOp::kSum:
      if constexpr (std::is_integral_v<T>)
        return static_cast<T>(static_cast<uint64_t>(a) + static_cast<uint64_t>(b));
      else
        return a + b;
    case ReduceOp::kProduct:
      if constexpr (std::is_integral_v<T>)
        return static_cast<T>(static_cast<uint64_t>(a) * static_cast<uint64_t>(b));
      else
        return a * b;
    default: throw UsageError(std::string("ThreadCommunicator: op ") + reduce_op_name(op));
  }
}

// Reduces `n` rank contributions of `count` T's with `op` into `out`, in rank order, as
// sum_in_rank_order: every rank gets the same bits.
template <typename T>
void reduce_in_rank_order(const unsigned char* all, int n, int64_t count, void* out, ReduceOp op) {
  auto* o = static_cast<T*>(out);
  const auto* in = reinterpret_cast<const T*>(all);
  std::copy(in, in + count, o);
  for (int r = 1; r < n; ++r)
    for (int64_t i = 0; i < count; ++i) o[i] = combine(o[i], in[r * count + i], op);
}

}  // namespace

// Shared by every mailbox of one world: what abort() sets.
struct ThreadAbort {
  std::atomic<bool> aborted{false};
  std::mutex mu;
  std::string why;  // under mu
};

// The shared state of one group: a FIFO of messages per (channel, source, destination), and the
// child groups that a split is creating.
class ThreadMailbox {
 public:
  ThreadMailbox(int size, double hang_s, std::shared_ptr<ThreadAbort> abort)
      : size_(size), hang_s_(hang_s), abort_(std::move(abort)) {}

  int size() const { return size_; }
  double hang_s() const { return hang_s_; }
  const std::shared_ptr<ThreadAbort>& abort_state() const { return abort_; }

  // Copies `bytes` from `data` into the queue src -> dst: the sender never waits.
  void post(int ch, int src, int dst, const void* data, size_t bytes) {
    const auto* p = static_cast<const unsigned char*>(data);
    std::vector<unsigned char> msg(p, p + bytes);
    {
      std::lock_guard<std::mutex> lock(mu_);
      queue(ch, src, dst).push_back(std::move(msg));
    }
    cv_.notify_all();
  }

  // Moves the oldest message src -> dst into `out` (at most `capacity` bytes; a longer message
  // is an error, as MPI_ERR_TRUNCATE). Waits until `deadline` when `timed`, else at most hang_s
  // (forever when 0). Returns false when the deadline passed, throws CommTimeoutError when the
  // hang limit did and CommError when the world was aborted.
  // With `poll`, returns false at once when no message is there (an irecv's test()).
  bool take(int ch, int src, int dst, void* out, size_t capacity, bool timed,
            Clock::time_point deadline, const char* what, bool poll = false) {
    const Clock::time_point start = Clock::now();
    std::unique_lock<std::mutex> lock(mu_);
    std::deque<std::vector<unsigned char>>& q = queue(ch, src, dst);
    while (q.empty()) {
      if (poll) return false;
      if (abort_->aborted.load()) {
        std::lock_guard<std::mutex> why_lock(abort_->mu);
        throw CommError(std::string(what) + " on rank " + std::to_string(dst) +
                        ": the world was aborted: " + abort_->why);
      }
      if (timed && Clock::now() >= deadline) return false;
      if (!timed && hang_s_ > 0 && seconds_since(start) > hang_s_)
        throw CommTimeoutError(std::string(what) + ": rank " + std::to_string(dst) +
                               " waited more than " + std::to_string(hang_s_) + " s for rank " +
                               std::to_string(src) + " (ThreadWorld hang limit: a deadlock)");
      cv_.wait_for(lock, kAbortPoll);
    }
    std::vector<unsigned char> msg = std::move(q.front());
    q.pop_front();
    lock.unlock();
    if (msg.size() > capacity)
      throw CommError(std::string(what) + ": rank " + std::to_string(dst) + " got " +
                      std::to_string(msg.size()) + " bytes from rank " + std::to_string(src) +
                      " into a buffer of " + std::to_string(capacity));
    if (!msg.empty()) std::memcpy(out, msg.data(), msg.size());
    return true;
  }

  // The mailbox of the group that split number `seq` of this group makes for `color` (of `size`
  // ranks): the first member to ask creates it, the last one to ask drops it from the registry
  // (the members' communicators keep it alive).
  std::shared_ptr<ThreadMailbox> child(uint64_t seq, int color, int size) {
    std::lock_guard<std::mutex> lock(mu_);
    Pending& p = children_[{seq, color}];
    if (!p.box) p.box = std::make_shared<ThreadMailbox>(size, hang_s_, abort_);
    std::shared_ptr<ThreadMailbox> box = p.box;
    if (++p.taken == size) children_.erase({seq, color});
    return box;
  }

 private:
  std::deque<std::vector<unsigned char>>& queue(int ch, int src, int dst) {
    return queues_[std::make_tuple(ch, src, dst)];
  }

  struct Pending {
    std::shared_ptr<ThreadMailbox> box;
    int taken = 0;
  };

  const int size_;
  const double hang_s_;
  const std::shared_ptr<ThreadAbort> abort_;
  std::mutex mu_;
  std::condition_variable cv_;
  // Per (channel, source, destination); a map, since tags make many channels (under mu_).
  std::map<std::tuple<int, int, int>, std::deque<std::vector<unsigned char>>> queues_;
  std::map<std::pair<uint64_t, int>, Pending> children_;        // under mu_
};

// ---------------------------------------------------------------------------------------------

ThreadCommunicator::ThreadCommunicator(std::shared_ptr<ThreadMailbox> box, int rank)
    : box_(std::move(box)), rank_(rank), size_(box_->size()) {
  if (rank < 0 || rank >= size_)
    throw UsageError("ThreadCommunicator: rank " + std::to_string(rank) + " of a group of " +
                     std::to_string(size_));
}

ThreadCommunicator::~ThreadCommunicator() = default;

void ThreadCommunicator::gather_blocks(const void* send, void* recv, size_t bytes) const {
  auto* out = static_cast<unsigned char*>(recv);
  for (int dst = 0; dst < size_; ++dst)
    if (dst != rank_) box_->post(kCollective, rank_, dst, send, bytes);
  if (bytes > 0) std::memmove(out + bytes * rank_, send, bytes);
  for (int src = 0; src < size_; ++src)
    if (src != rank_)
      box_->take(kCollective, src, rank_, out + bytes * src, bytes, false, Clock::time_point{}, "allgather");
}

void ThreadCommunicator::allreduce_sum(void* buf, int64_t count, DType dtype) {
  if (dtype != DType::kFloat32 && dtype != DType::kFloat64)
    throw UsageError(std::string("MPI sum is not defined for ") + dtype_name(dtype));
  const size_t bytes = static_cast<size_t>(count) * dtype_size(dtype);
  std::vector<unsigned char> all(bytes * size_);
  gather_blocks(buf, all.data(), bytes);
  if (dtype == DType::kFloat32)
    sum_in_rank_order<float>(all.data(), size_, count, buf);
  else
    sum_in_rank_order<double>(all.data(), size_, count, buf);
  const uint64_t b = ring_allreduce_bytes(bytes, size_);
  stats_.add(b, b);
}

void ThreadCommunicator::allreduce_op(void* buf, int64_t count, DType dtype, ReduceOp op) {
  if (!is_elementwise_op(op))
    throw UsageError(std::string("ThreadCommunicator: no element-wise op ") + reduce_op_name(op));
  const size_t bytes = static_cast<size_t>(count) * dtype_size(dtype);
  std::vector<unsigned char> all(bytes * size_);
  gather_blocks(buf, all.data(), bytes);
  const unsigned char* a = all.data();
  switch (dtype) {
    case DType::kFloat32: reduce_in_rank_order<float>(a, size_, count, buf, op); break;
    case DType::kFloat64: reduce_in_rank_order<double>(a, size_, count, buf, op); break;
    case DType::kUInt8: reduce_in_rank_order<uint8_t>(a, size_, count, buf, op); break;
    case DType::kInt8: reduce_in_rank_order<int8_t>(a, size_, count, buf, op); break;
    case DType::kInt16: reduce_in_rank_order<int16_t>(a, size_, count, buf, op); break;
    case DType::kInt32: reduce_in_rank_order<int32_t>(a, size_, count, buf, op); break;
    case DType::kInt64: reduce_in_rank_order<int64_t>(a, size_, count, buf, op); break;
    default: throw UsageError(std::string("MPI reductions are not defined for ") + dtype_name(dtype));
  }
  const uint64_t b = ring_allreduce_bytes(bytes, size_);
  stats_.add(b, b);
}

void ThreadCommunicator::allgather(const void* send, void* recv, size_t bytes) {
  gather_blocks(send, recv, bytes);
  stats_.add(bytes * (size_ - 1), bytes * (size_ - 1));
}

void ThreadCommunicator::allgather_timed(const void* send, void* recv, size_t bytes,
                                         double timeout_s, const JoinWatch& join) {
  // As MpiCommunicator's: each peer's block taken on its own, so the wait knows who is missing.
  const Clock::time_point start = Clock::now();
  const double forever = std::numeric_limits<double>::infinity();
  const double limit = timeout_s > 0 ? timeout_s : forever;
  double next_report = join.every_s > 0 ? join.every_s : forever;
  auto* out = static_cast<unsigned char*>(recv);
  for (int dst = 0; dst < size_; ++dst)
    if (dst != rank_) box_->post(kCollective, rank_, dst, send, bytes);
  if (bytes > 0) std::memmove(out + bytes * rank_, send, bytes);
  std::vector<int> late;
  for (int src = 0; src < size_; ++src)
    if (src != rank_) late.push_back(src);
  while (!late.empty()) {
    // Every block that is there, then a short wait for the first one still missing.
    std::vector<int> still;
    for (int src : late)
      if (!box_->take(kCollective, src, rank_, out + bytes * src, bytes, true, Clock::time_point{},
                      "allgather", /*poll=*/true))
        still.push_back(src);
    late.swap(still);
    if (late.empty()) break;
    const double waited = seconds_since(start);
    if (waited >= limit)
      // The same words as MpiCommunicator: callers and tests see one error whatever the transport.
      throw CommTimeoutError("rank " + std::to_string(rank_) + " waited " +
                             std::to_string(static_cast<int>(waited)) + " s for " + rank_list(late) +
                             " to join a collective; a peer is dead or running different code "
                             "(HVDC_TIMEOUT sets the limit)");
    if (waited >= next_report) {
      if (join.report) join.report(waited, late);
      next_report += join.every_s;
    }
    const double until = std::min({limit, next_report, waited + 0.005});
    const Clock::time_point deadline =
        start + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(until));
    if (box_->take(kCollective, late[0], rank_, out + bytes * late[0], bytes, true, deadline, "allgather"))
      late.erase(late.begin());
  }
  stats_.add(bytes * (size_ - 1), bytes * (size_ - 1));
}

void ThreadCommunicator::sendrecv(const void* send, size_t send_bytes, int dst, void* recv,
                                  size_t recv_bytes, int src) {
  if (dst < 0 || dst >= size_ || src < 0 || src >= size_)
    throw CommError("sendrecv: rank " + std::to_string(dst) + " or " + std::to_string(src) +
                    " is not in a group of " + std::to_string(size_));
  if ((dst == rank_) != (src == rank_))
    throw UsageError("sendrecv: either both or neither of dst and src may be this rank");
  box_->post(kPointToPoint, rank_, dst, send, send_bytes);
  box_->take(kPointToPoint, src, rank_, recv, recv_bytes, false, Clock::time_point{}, "sendrecv");
  stats_.add(send_bytes, recv_bytes);
}

void ThreadCommunicator::alltoall(const void* send, void* recv, size_t bytes) {
  const auto* in = static_cast<const unsigned char*>(send);
  auto* out = static_cast<unsigned char*>(recv);
  for (int dst = 0; dst < size_; ++dst)
    if (dst != rank_) box_->post(kCollective, rank_, dst, in + bytes * dst, bytes);
  if (bytes > 0) std::memcpy(out + bytes * rank_, in + bytes * rank_, bytes);
  for (int src = 0; src < size_; ++src)
    if (src != rank_)
      box_->take(kCollective, src, rank_, out + bytes * src, bytes, false, Clock::time_point{},
                 "alltoall");
  stats_.add(bytes * (size_ - 1), bytes * (size_ - 1));
}

void ThreadCommunicator::broadcast(void* buf, size_t bytes, int root) {
  if (root < 0 || root >= size_)
    throw CommError("broadcast: root " + std::to_string(root) + " is not in a group of " +
                    std::to_string(size_));
  if (rank_ == root) {
    for (int dst = 0; dst < size_; ++dst)
      if (dst != root) box_->post(kCollective, root, dst, buf, bytes);
    stats_.add(bytes * (size_ - 1), 0);
  } else {
    box_->take(kCollective, root, rank_, buf, bytes, false, Clock::time_point{}, "broadcast");
    stats_.add(0, bytes);
  }
}

namespace {

// A send is complete when posted (the mailbox copies it). A receive takes its message on test()
// or wait(); one destroyed before that is cancelled: nothing was copied into its buffer.
class ThreadRequest final : public CommRequest {
 public:
  ThreadRequest(std::shared_ptr<ThreadMailbox> box, int ch, int src, int dst, void* buf,
                size_t bytes)
      : box_(std::move(box)), ch_(ch), src_(src), dst_(dst), buf_(buf), bytes_(bytes),
        done_(buf == nullptr) {}
  bool test() override {
    if (!done_)
      done_ = box_->take(ch_, src_, dst_, buf_, bytes_, false, Clock::time_point{}, "irecv", true);
    return done_;
  }
  void wait() override {
    if (!done_) box_->take(ch_, src_, dst_, buf_, bytes_, false, Clock::time_point{}, "irecv");
    done_ = true;
  }

 private:
  std::shared_ptr<ThreadMailbox> box_;
  int ch_, src_, dst_;
  void* buf_;
  size_t bytes_;
  bool done_;
};

void check_request(int peer, int rank, int size, int tag, const char* what) {
  if (peer < 0 || peer >= size || peer == rank)
    throw CommError(std::string(what) + ": rank " + std::to_string(peer) +
                    " is not another rank of a group of " + std::to_string(size));
  if (tag < 0 || tag >= Communicator::kMaxTag)
    throw UsageError(std::string(what) + ": tag " + std::to_string(tag) + " out of range");
}

}  // namespace

Request ThreadCommunicator::isend(const void* buf, size_t bytes, int dst, int tag) {
  check_request(dst, rank_, size_, tag, "isend");
  box_->post(kTagged + tag, rank_, dst, buf, bytes);
  stats_.add(bytes, 0);
  return Request(new ThreadRequest(box_, kTagged + tag, rank_, dst, nullptr, 0));
}

Request ThreadCommunicator::irecv(void* buf, size_t bytes, int src, int tag) {
  check_request(src, rank_, size_, tag, "irecv");
  stats_.add(0, bytes);
  // A non-null buffer marks the request pending, also for an empty message.
  static unsigned char empty;
  return Request(
      new ThreadRequest(box_, kTagged + tag, src, rank_, bytes ? buf : &empty, bytes));
}

std::unique_ptr<Communicator> ThreadCommunicator::split(int color, int key) const {
  struct Entry {
    int color, key;
  };
  const Entry mine{color, key};
  std::vector<Entry> all(static_cast<size_t>(size_));
  gather_blocks(&mine, all.data(), sizeof(Entry));
  // Members of this rank's color, ordered by (key, rank) as MPI_Comm_split orders them.
  std::vector<int> members;
  for (int r = 0; r < size_; ++r)
    if (all[r].color == color) members.push_back(r);
  std::stable_sort(members.begin(), members.end(),
                   [&](int a, int b) { return all[a].key < all[b].key; });
  const int new_rank =
      static_cast<int>(std::find(members.begin(), members.end(), rank_) - members.begin());
  std::shared_ptr<ThreadMailbox> child =
      box_->child(splits_++, color, static_cast<int>(members.size()));
  return std::make_unique<ThreadCommunicator>(std::move(child), new_rank);
}

// ---------------------------------------------------------------------------------------------

ThreadWorld::ThreadWorld(int size, double hang_s) : size_(size) {
  if (size < 1) throw UsageError("ThreadWorld: size " + std::to_string(size));
  box_ = std::make_shared<ThreadMailbox>(size, hang_s, std::make_shared<ThreadAbort>());
}

ThreadWorld::~ThreadWorld() = default;

std::unique_ptr<ThreadCommunicator> ThreadWorld::communicator(int rank) const {
  return std::make_unique<ThreadCommunicator>(box_, rank);
}

void ThreadWorld::abort(const std::string& why) {
  ThreadAbort& a = *box_->abort_state();
  {
    std::lock_guard<std::mutex> lock(a.mu);
    if (a.aborted.load()) return;  // the first reason is the one that explains the others
    a.why = why;
  }
  a.aborted.store(true);
}

std::vector<std::string> ThreadWorld::run(const std::function<void(Communicator&)>& body) {
  std::vector<std::string> failures(static_cast<size_t>(size_));
  std::vector<std::unique_ptr<ThreadCommunicator>> comms;
  for (int r = 0; r < size_; ++r) comms.push_back(communicator(r));
  // Joins whatever was started, also when starting a later thread throws: a std::thread that is
  // destroyed while joinable would terminate the process.
  struct Joiner {
    std::vector<std::thread> threads;
    ~Joiner() {
      for (std::thread& t : threads)
        if (t.joinable()) t.join();
    }
  } joiner;
  for (int r = 0; r < size_; ++r) {
    try {
      joiner.threads.emplace_back([&, r] {
        try {
          body(*comms[r]);
        } catch (const std::exception& e) {
          failures[r] = e.what()[0] != '\0' ? e.what() : "exception with an empty message";
          abort("rank " + std::to_string(r) + " failed: " + failures[r]);
        } catch (...) {
          failures[r] = "non-standard exception";
          abort("rank " + std::to_string(r) + " failed");
        }
      });
    } catch (...) {
      abort("could not start the thread of rank " + std::to_string(r));
      throw;
    }
  }
  for (std::thread& t : joiner.threads) t.join();
  return failures;
}

}  // namespace hvdc
