// ThreadCommunicator (cpp/tests/thread_communicator.h) itself at n = 1..5 thread ranks: every
// Communicator call gives what MpiCommunicator gives (results, group order of split, bytes
// counted), and a failing or deadlocked rank ends the test with an error instead of a hang.
#include <chrono>
#include <cstdint>
#include <string>
#include <thread>
#include <vector>

#include "check.h"
#include "hvdc/errors.h"
#include "thread_communicator.h"

namespace hvdc {
namespace {

constexpr double kHangS = 60;  // a rank that waits this long is deadlocked: fail, do not hang

void all_ok(Failures& f, const std::string& label, const std::vector<std::string>& failed) {
  f.ran();
  for (size_t r = 0; r < failed.size(); ++r)
    f.check(failed[r].empty(), str(label, ": rank ", r, " of ", failed.size(), " threw ", failed[r]));
}

// Each collective once, with rank-dependent data, checked on every rank.
void collectives(Failures& f, int n) {
  ThreadWorld world(n, kHangS);
  all_ok(f, str("collectives n=", n), world.run([&](Communicator& comm) {
    const int r = comm.rank();
    const std::string at = str("n=", n, " rank ", r, ": ");
    f.check(comm.size() == n, at + "size");

    // allreduce_sum: integers and halves sum exactly, in any order.
    std::vector<float> xf = {1.0f * r, 0.5f, -2.0f * r};
    std::vector<double> xd = {1.0 * r, 0.25 * r};
    comm.allreduce_sum(xf.data(), 3, DType::kFloat32);
    comm.allreduce_sum(xd.data(), 2, DType::kFloat64);
    const double tri = n * (n - 1) / 2.0;
    f.check(xf == std::vector<float>{float(tri), 0.5f * n, float(-2 * tri)}, at + "allreduce f32");
    f.check(xd == std::vector<double>{tri, 0.25 * tri}, at + "allreduce f64");
    uint8_t byte = 1;
    bool refused = false;
    try {
      comm.allreduce_sum(&byte, 1, DType::kUInt8);
    } catch (const UsageError&) {
      refused = true;  // before communicating, as MPI has no sum for it in MpiCommunicator
    }
    f.check(refused, at + "allreduce of uint8 accepted");
    const uint64_t reduced = ring_allreduce_bytes(12, n) + ring_allreduce_bytes(16, n);
    f.check(comm.stats().bytes_sent == reduced && comm.stats().bytes_received == reduced,
            at + "allreduce bytes");
    comm.stats() = CommStats{};

    // allgather (and the timed one, everyone present): block i from rank i.
    const int mine[2] = {r, 10 * r};
    std::vector<int> all(2 * n, -1), timed(2 * n, -1);
    comm.allgather(mine, all.data(), sizeof(mine));
    comm.allgather_timed(mine, timed.data(), sizeof(mine), 30);
    for (int i = 0; i < n; ++i)
      f.check(all[2 * i] == i && all[2 * i + 1] == 10 * i && timed == all,
              str(at, "allgather block ", i));

    // alltoall: block j of rank i carries (i, j).
    std::vector<int> send(2 * n), recv(2 * n, -1);
    for (int j = 0; j < n; ++j) {
      send[2 * j] = r;
      send[2 * j + 1] = j;
    }
    comm.alltoall(send.data(), recv.data(), 2 * sizeof(int));
    for (int i = 0; i < n; ++i)
      f.check(recv[2 * i] == i && recv[2 * i + 1] == r, str(at, "alltoall block ", i));

    // broadcast from every root.
    for (int root = 0; root < n; ++root) {
      double v[3] = {r == root ? 1.5 * root : -1.0, 2.0, r == root ? 7.0 : 0.0};
      comm.broadcast(v, sizeof(v), root);
      f.check(v[0] == 1.5 * root && v[1] == 2.0 && v[2] == 7.0, str(at, "broadcast root ", root));
    }
    const uint64_t block = 2 * sizeof(int), bcast = 3 * sizeof(double);
    const uint64_t sent = 3 * block * (n - 1) + bcast * (n - 1), got = 3 * block * (n - 1) + bcast * (n - 1);
    f.check(comm.stats().bytes_sent == sent && comm.stats().bytes_received == got,
            str(at, "collective bytes ", comm.stats().bytes_sent, "/", comm.stats().bytes_received,
                ", want ", sent, "/", got));
    comm.stats() = CommStats{};

    // sendrecv around the ring with sizes that differ per rank, then an empty message back, then
    // to itself; messages between one pair arrive in order.
    const int next = (r + 1) % n, prev = (r + n - 1) % n;
    std::vector<char> out(r + 1, static_cast<char>('a' + r)), in(prev + 1, 0);
    comm.sendrecv(out.data(), out.size(), next, in.data(), in.size(), prev);
    f.check(in == std::vector<char>(prev + 1, static_cast<char>('a' + prev)), at + "sendrecv ring");
    comm.sendrecv(nullptr, 0, prev, nullptr, 0, next);
    int first = 1, second = 2, a = 0, b = 0;
    comm.sendrecv(&first, sizeof(int), r, &a, sizeof(int), r);
    comm.sendrecv(&second, sizeof(int), r, &b, sizeof(int), r);
    f.check(a == 1 && b == 2, at + "sendrecv to itself, in order");
    f.check(comm.stats().bytes_sent == out.size() + 2 * sizeof(int) &&
                comm.stats().bytes_received == in.size() + 2 * sizeof(int),
            at + "sendrecv bytes");
  }));
}

// split orders each group by (key, rank); groups work on their own, also split again; the
// exchange inside split is not counted (MPI_Comm_split's is not either).
void splits(Failures& f, int n) {
  ThreadWorld world(n, kHangS);
  all_ok(f, str("split n=", n), world.run([&](Communicator& comm) {
    const int r = comm.rank();
    const std::string at = str("n=", n, " rank ", r, ": ");
    // Colors by parity, keys reversing the order: group members descend in world rank.
    std::unique_ptr<Communicator> g = comm.split(r % 2, -r);
    std::vector<int> members;
    for (int q = n - 1; q >= 0; --q)
      if (q % 2 == r % 2) members.push_back(q);
    f.check(g->size() == static_cast<int>(members.size()) && members[g->rank()] == r,
            str(at, "split: rank ", g->rank(), " of ", g->size()));
    std::vector<int> seen(g->size(), -1);
    g->allgather(&r, seen.data(), sizeof(int));
    f.check(seen == members, at + "split group order");
    f.check(comm.stats().bytes_sent == 0, at + "split counted bytes");
    // Equal keys keep world order; one rank alone in a color; then a split of the split.
    std::unique_ptr<Communicator> h = comm.split(r == 0 ? 1 : 2, 0);
    f.check(h->rank() == (r == 0 ? 0 : r - 1) && h->size() == (r == 0 ? 1 : n - 1),
            at + "split with equal keys");
    std::unique_ptr<Communicator> hh = h->split(0, h->rank());
    double v = 1.0;
    hh->allreduce_sum(&v, 1, DType::kFloat64);
    f.check(v == h->size(), at + "nested split");
    // Two successive splits with the same colors are distinct groups.
    std::unique_ptr<Communicator> again = comm.split(r % 2, -r);
    int token = r, back = -1;
    const int partner = (g->rank() ^ 1) < g->size() ? (g->rank() ^ 1) : g->rank();
    again->sendrecv(&token, sizeof(int), partner, &back, sizeof(int), partner);
    f.check(back == members[partner], at + "second split");
  }));
}

// A rank that joins late (but within the timeout) changes nothing.
void late_rank(Failures& f, int n) {
  ThreadWorld world(n, kHangS);
  all_ok(f, str("late rank n=", n), world.run([&](Communicator& comm) {
    if (comm.rank() == n - 1) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    const int r = comm.rank();
    std::vector<int> all(n, -1);
    comm.allgather_timed(&r, all.data(), sizeof(int), 30);
    for (int i = 0; i < n; ++i) f.check(all[i] == i, str("late rank n=", n, ": block ", i));
  }));
}

// A rank whose body throws aborts the world: its peers stop waiting with CommError.
void failing_rank(Failures& f, int n) {
  ThreadWorld world(n, kHangS);
  const std::vector<std::string> failed = world.run([&](Communicator& comm) {
    if (comm.rank() == 0) throw std::runtime_error("boom");
    std::vector<int> all(n);
    comm.allgather(&n, all.data(), sizeof(int));
  });
  f.ran();
  f.check(failed[0] == "boom", str("failing rank n=", n, ": rank 0 reported '", failed[0], "'"));
  for (int r = 1; r < n; ++r)
    f.check(failed[r].find("rank 0 failed: boom") != std::string::npos,
            str("failing rank n=", n, ": rank ", r, " reported '", failed[r], "'"));
}

// A wait without a timeout of its own ends at the world's hang limit with CommTimeoutError.
void hang_limit(Failures& f) {
  ThreadWorld world(2, 0.1);
  std::string what;
  const std::vector<std::string> failed = world.run([&](Communicator& comm) {
    if (comm.rank() == 0) return;  // never broadcasts
    double v = 0;
    try {
      comm.broadcast(&v, sizeof(v), 0);
    } catch (const CommTimeoutError& e) {
      what = e.what();
    }
  });
  all_ok(f, "hang limit", failed);
  f.check(what.find("hang limit") != std::string::npos, "hang limit: got '" + what + "'");
}

}  // namespace
}  // namespace hvdc

int main() {
  hvdc::Failures f;
  for (int n = 1; n <= 5; ++n) {
    hvdc::collectives(f, n);
    hvdc::splits(f, n);
    hvdc::late_rank(f, n);
    if (n > 1) hvdc::failing_rank(f, n);
  }
  hvdc::hang_limit(f);
  return f.finish("test_thread_communicator");
}
