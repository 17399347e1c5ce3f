// ADASUMRVH for any number of ranks: paper 002, Algorithm 1 (algorithm box lines 1-25) and
// Section 4.2, plus DESIGN.md's fold-in rule for rank counts that are not a power of two. See
// hvdc/adasum.h for the steps; hvd_compress/reference/adasum.py mirrors this file step by step.
#include "hvdc/adasum.h"

#include <algorithm>

#include "hvdc/adasum_kernels.h"
#include "hvdc/errors.h"

namespace hvdc {
namespace {

// offsets[i] is where tensor i starts in the fused buffer; offsets.back() == numel.
std::vector<int64_t> tensor_offsets(const std::vector<int64_t>& sizes, int64_t numel) {
  std::vector<int64_t> off(sizes.size() + 1, 0);
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] < 0) throw UsageError("Adasum: negative tensor size");
    off[i + 1] = off[i] + sizes[i];
  }
  if (off.back() != numel)
    throw UsageError("Adasum: tensor sizes add up to " + std::to_string(off.back()) +
                     ", the fused buffer has " + std::to_string(numel) + " elements");
  return off;
}

// One pair step on the slice [lo, hi) of the fused buffer (Algorithm 1, lines 15-18). `left`,
// `right` and `out` point at element lo of the lower rank's data, the upper rank's data and the
// destination (which is one of the two). `group` holds every rank that owns a piece of the same
// logical vectors; null when this rank holds them whole (the fold-in). The partial sums of all
// tensors travel in one allreduce, so a level costs one round trip however many tensors it has.
// Per tensor of the slice: the dots on the device, summed over `group` on the host, the
// coefficients on the host, the combination on the device. `dots_dev` holds 3 doubles per tensor.
void combine_slice(DeviceTable& dev, Communicator* group, const std::vector<int64_t>& offsets,
                   int64_t lo, int64_t hi, const unsigned char* left, const unsigned char* right,
                   unsigned char* out, DType dtype, double* dots_dev, std::vector<double>& dots) {
  const size_t es = dtype_size(dtype);
  const size_t ntensors = offsets.size() - 1;
  dots.assign(3 * ntensors, 0.0);
  std::vector<bool> present(ntensors, false);
  for (size_t i = 0; i < ntensors; ++i) {
    const int64_t a = std::max(lo, offsets[i]), b = std::min(hi, offsets[i + 1]);
    if (a >= b) continue;  // tensor i has no element in this slice: it contributes zeros
    present[i] = true;
    const size_t at = static_cast<size_t>(a - lo) * es;
    dev.adasum_dot_norms(left + at, right + at, dtype, b - a, dots_dev + 3 * i);
  }
  if (ntensors > 0) {
    // The absent tensors' dots are the zeros of `dots`: only the present ones are read back.
    std::vector<double> host(3 * ntensors);
    const auto* got = reinterpret_cast<const double*>(
        stage_out(dev, reinterpret_cast<uint8_t*>(host.data()),
                  reinterpret_cast<const uint8_t*>(dots_dev), sizeof(double) * 3 * ntensors));
    dev.wait();
    for (size_t i = 0; i < ntensors; ++i)
      if (present[i]) std::copy(got + 3 * i, got + 3 * i + 3, dots.begin() + 3 * i);
  }
  if (group != nullptr && group->size() > 1)
    group->allreduce_sum(dots.data(), static_cast<int64_t>(dots.size()), DType::kFloat64);
  for (size_t i = 0; i < ntensors; ++i) {
    if (!present[i]) continue;
    const int64_t a = std::max(lo, offsets[i]);
    const size_t at = static_cast<size_t>(a - lo) * es;
    const double cl = adasum_coefficient(dots[3 * i], dots[3 * i + 1]);
    const double cr = adasum_coefficient(dots[3 * i], dots[3 * i + 2]);
    dev.adasum_combine(left + at, cl, right + at, cr, out + at, dtype,
                       std::min(hi, offsets[i + 1]) - a);
  }
}

// The exchanges of adasum_rvh on device memory: what is sent is read through the device's copies
// and what arrives is written through them; on the CPU, the memory itself.
class Exchange {
 public:
  Exchange(DeviceTable& dev, Communicator& comm, size_t bytes, unsigned char* host_recv)
      : dev_(dev), comm_(comm), send_(dev, dev.host_memory() ? 0 : bytes), recv_(host_recv) {}
  // Sends [send, send + send_bytes) to `peer` and receives recv_bytes from it into device memory
  // at `into` (which may be null for none).
  void sendrecv(const unsigned char* send, size_t send_bytes, int peer, unsigned char* into,
                size_t recv_bytes) {
    const uint8_t* out = send_bytes ? stage_out(dev_, send_.get(), send, send_bytes) : nullptr;
    if (send_bytes) dev_.wait();
    unsigned char* in = dev_.host_memory() ? into : recv_;
    comm_.sendrecv(out, send_bytes, peer, recv_bytes ? in : nullptr, recv_bytes, peer);
    if (recv_bytes && !dev_.host_memory()) {
      dev_.to_device(into, recv_, recv_bytes);
      dev_.wait();  // recv_ is written by the next exchange
    }
  }

 private:
  DeviceTable& dev_;
  Communicator& comm_;
  HostStaging send_;
  unsigned char* recv_;
};

constexpr int64_t kAverageSliceElems = int64_t{1} << 22;

}  // namespace

AdasumPlan::AdasumPlan(Communicator& comm) : comm_(comm) {
  const int n = comm.size(), r = comm.rank();
  while (pow2_ * 2 <= n) pow2_ *= 2;
  for (int d = 1; d < pow2_; d <<= 1) {
    // Ranks >= pow2 must join the split (it is collective) but each lands in a group of its own,
    // which it never uses.
    const int color = r < pow2_ ? r / (2 * d) : pow2_ + r;
    std::unique_ptr<Communicator> group = comm.split(color, r);
    if (r < pow2_) levels_.push_back(std::move(group));
  }
}

CommStats AdasumPlan::take_stats() {
  CommStats total;
  for (auto& g : levels_) {
    total.add(g->stats().bytes_sent, g->stats().bytes_received);
    g->stats() = CommStats{};
  }
  return total;
}

unsigned char* AdasumPlan::scratch(size_t bytes) {
  if (scratch_.size() < bytes) scratch_.resize(bytes);
  return scratch_.data();
}

void adasum_rvh(AdasumPlan& plan, const TensorView& fused, const std::vector<int64_t>& tensor_sizes,
                DeviceTable* device) {
  const std::vector<int64_t> offsets = tensor_offsets(tensor_sizes, fused.numel);
  Communicator& comm = plan.comm();
  const int n = comm.size(), r = comm.rank(), p = plan.pow2();
  if (fused.numel == 0 || n == 1) return;
  DeviceTable& dev = device ? *device : cpu_device(KernelChoice::kAuto);
  const DType dtype = fused.dtype;
  const size_t es = dtype_size(dtype);
  const size_t nbytes = fused.nbytes();
  auto* x = static_cast<unsigned char*>(fused.data);
  std::vector<double> dots;
  // The host side of every receive (the plan's, kept between calls); on a device, also its
  // device side (`recv`) and the dots of a slice.
  unsigned char* host_recv = plan.scratch(nbytes);
  DeviceBuffer dev_recv(dev, dev.host_memory() ? 0 : nbytes);
  unsigned char* recv = dev.host_memory() ? host_recv : dev_recv.get();
  DeviceBuffer dots_dev(dev, sizeof(double) * 3 * (offsets.size() - 1) + sizeof(double));
  auto* dots_at = reinterpret_cast<double*>(dots_dev.get());
  Exchange ex(dev, comm, nbytes, host_recv);

  // fold-in: rank r >= p hands its vector to r - p and waits for the final result (fold-out).
  if (r >= p) {
    ex.sendrecv(x, nbytes, r - p, nullptr, 0);
    ex.sendrecv(nullptr, 0, r - p, x, nbytes);
    return;
  }
  if (r + p < n) {
    ex.sendrecv(nullptr, 0, r + p, recv, nbytes);
    combine_slice(dev, nullptr, offsets, 0, fused.numel, x, recv, x, dtype, dots_at, dots);  // Adasum(g[r], g[r+p])
  }

  // levels (Algorithm 1, lines 2-20): slice [lo, lo + len) of the fused buffer is this rank's.
  struct Slice {
    int64_t lo, len;
  };
  std::vector<Slice> before;  // the slice held before each level, for the allgather
  int64_t lo = 0, len = fused.numel;
  for (int d = 1, level = 0; d < p; d <<= 1, ++level) {
    const int peer = r ^ d;
    const bool lower = (r & d) == 0;  // "left neighbor" of line 3: keeps the first half
    const int64_t first = len / 2, second = len - first;
    before.push_back({lo, len});
    const int64_t keep_lo = lower ? lo : lo + first, keep_len = lower ? first : second;
    const int64_t send_lo = lower ? lo + first : lo, send_len = lower ? second : first;
    ex.sendrecv(x + send_lo * es, send_len * es, peer, recv, keep_len * es);
    unsigned char* own = x + keep_lo * es;
    combine_slice(dev, &plan.level_group(level), offsets, keep_lo, keep_lo + keep_len,
                  lower ? own : recv, lower ? recv : own, own, dtype, dots_at, dots);
    lo = keep_lo;
    len = keep_len;
  }

  // allgather (lines 22-24): undo the halvings, last level first; halves land in place.
  for (size_t k = before.size(); k-- > 0;) {
    const int peer = r ^ (1 << k);
    const bool lower = (r & (1 << k)) == 0;
    const Slice s = before[k];
    const int64_t first = s.len / 2;
    const int64_t other_lo = lower ? s.lo + first : s.lo;
    const int64_t other_len = lower ? s.len - first : first;
    ex.sendrecv(x + lo * es, len * es, peer, x + other_lo * es, other_len * es);
    lo = s.lo;
    len = s.len;
  }

  // fold-out
  if (r + p < n) ex.sendrecv(x, nbytes, r + p, nullptr, 0);
  dev.wait();  // the last combination, before the caller reads the result
}

HierarchicalAdasumPlan::HierarchicalAdasumPlan(Communicator& world,
                                               std::unique_ptr<Communicator> node)
    : node_(std::move(node)) {
  leaders_ = world.split(is_leader() ? 0 : 1, world.rank());
  if (is_leader()) cross_.reset(new AdasumPlan(*leaders_));
}

CommStats HierarchicalAdasumPlan::take_stats() {
  CommStats total;
  for (Communicator* c : {node_.get(), leaders_.get()}) {
    total.add(c->stats().bytes_sent, c->stats().bytes_received);
    c->stats() = CommStats{};
  }
  if (cross_) {
    const CommStats s = cross_->take_stats();
    total.add(s.bytes_sent, s.bytes_received);
  }
  return total;
}

void adasum_hierarchical(HierarchicalAdasumPlan& plan, const TensorView& fused,
                         const std::vector<int64_t>& tensor_sizes) {
  tensor_offsets(tensor_sizes, fused.numel);  // validates before any communication
  if (fused.numel == 0) return;
  Communicator& node = plan.node();
  const int k = node.size();
  const size_t es = dtype_size(fused.dtype);
  auto* x = static_cast<unsigned char*>(fused.data);
  // node average: sum in double, divide by the node size, one rounding to the storage dtype.
  if (k > 1) {
    std::vector<double> acc(static_cast<size_t>(std::min(fused.numel, kAverageSliceElems)));
    for (int64_t off = 0; off < fused.numel; off += kAverageSliceElems) {
      const int64_t len = std::min(kAverageSliceElems, fused.numel - off);
      widen_to_double(x + off * es, fused.dtype, acc.data(), len);
      node.allreduce_sum(acc.data(), len, DType::kFloat64);
      narrow_from_double(acc.data(), static_cast<double>(k), x + off * es, fused.dtype, len);
    }
  }
  // across nodes: the leaders hold their node's average and run ADASUMRVH over the nodes.
  if (plan.is_leader()) adasum_rvh(plan.cross(), fused, tensor_sizes);
  // share: the leader's result, so that every rank of the node ends bit-identical.
  if (k > 1) node.broadcast(fused.data, fused.nbytes(), 0);
}

}  // namespace hvdc
