#include "hvdc/runtime.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "hvdc/allgather.h"
#include "hvdc/compressed_allreduce.h"
#include "hvdc/dense_allreduce.h"
#include "hvdc/errors.h"
#include "hvdc/masked_allreduce.h"
#include "hvdc/signature.h"
#include "hvdc/sparse_allreduce.h"
#include "hvdc/block_quant_allreduce.h"
#include "hvdc/staged_device.h"

namespace hvdc {
namespace {

// Modes set in the signature's op field above the op or payload itself (which stay below 0x100),
// so that ranks that disagree on a mode raise MismatchError ("op") instead of joining different
// communicators or posting different messages.
constexpr int32_t kHierarchicalFlag = 0x100;     // over the node topology (Adasum, 1-bit)
constexpr int32_t kMomentsFlag = 0x200;          // the 1-bit allreduce also updates moments
constexpr int32_t kWorkerUniformsFlag = 0x400;   // ... from the caller's uniforms

int adasum_op(bool hierarchical) {
  return static_cast<int>(ReduceOp::kAdasum) | (hierarchical ? kHierarchicalFlag : 0);
}

}  // namespace

Runtime::Runtime(std::unique_ptr<Communicator> world, const RuntimeConfig& config,
                 const NodeSplit& shared_node)
    : world_(std::move(world)),
      kernels_(config.kernels),
      onebit_pipeline_(config.onebit_pipeline) {
  wait_.timeout_s = config.timeout_s;
  wait_.warn_every_s = config.stall_warning_s;
  wait_.warn = config.warn;
  world_->set_stall_timeout(wait_.timeout_s);
  // Every rank must split the same way: agree on the local size (and on every rank's settings
  // being valid) before any split.
  CallSignature settings;
  settings.collective = kInit;
  settings.numel = config.local_size;
  // Ranks that pipeline the 1-bit collective differently would post different messages.
  const int64_t pipeline[2] = {config.onebit_pipeline.piece, config.onebit_pipeline.min_numel};
  settings.layout_hash = fnv1a(pipeline, sizeof pipeline);
  if (!config.invalid.empty()) set_rejected(settings, config.invalid);
  agree(settings, "hvd_compress init (HVDC_* settings)");
  adasum_plan_.reset(new AdasumPlan(*world_));
  const int k = config.local_size;
  std::unique_ptr<Communicator> node = k > 0        ? world_->split(rank() / k, rank())
                                       : shared_node ? shared_node()
                                                     : world_->split(0, rank());
  hierarchical_plan_.reset(new HierarchicalAdasumPlan(*world_, std::move(node)));
  hierarchical_onebit_plan_.reset(new HierarchicalOneBitPlan(*world_, hierarchical_plan_->node()));
  // Start-up traffic is no collective call of the user's: it stays out of stats().
  absorb_plan_stats();
}

void Runtime::agree(const CallSignature& sig, const std::string& what) {
  if (broken_) {
    // The first failure's own words: a peer that left reads differently from one that hung.
    const std::string message = "an earlier collective failed (" + broken_by_ +
                                "); this process cannot communicate any more and must be restarted";
    if (broken_by_exit_) throw PeerExitedError(message);
    throw CommTimeoutError(message);
  }
  try {
    agree_on_signature(*world_, sig, wait_, what.empty() ? "hvd_compress collective" : what);
  } catch (const CommTimeoutError& e) {
    broken_ = true;
    broken_by_ = e.what();
    broken_by_exit_ = dynamic_cast<const PeerExitedError*>(&e) != nullptr;
    throw;
  }
}

void Runtime::absorb_plan_stats() {
  for (const CommStats& s : {adasum_plan_ ? adasum_plan_->take_stats() : CommStats{},
                             hierarchical_plan_ ? hierarchical_plan_->take_stats() : CommStats{},
                             hierarchical_onebit_plan_ ? hierarchical_onebit_plan_->take_stats()
                                                       : CommStats{}})
    world_->stats().add(s.bytes_sent, s.bytes_received);
}

template <typename Body>
CommStats Runtime::run(const CallSignature& sig, const std::string& what, Body&& body) {
  const std::lock_guard<std::mutex> lock(mu_);
  const CommStats before = world_->stats();
  // What this call moved, added to the totals whether it returns or throws (a rejected call's
  // signature exchange was on the wire too). `agreed`: the call counts once the ranks agreed.
  const auto account = [&](bool agreed) {
    absorb_plan_stats();
    CommStats moved;
    moved.add(world_->stats().bytes_sent - before.bytes_sent,
              world_->stats().bytes_received - before.bytes_received);
    moved.calls = agreed ? 1 : 0;
    const std::lock_guard<std::mutex> totals_lock(stats_mu_);
    totals_.add(moved.bytes_sent, moved.bytes_received);
    totals_.calls += moved.calls;
    return moved;
  };
  bool agreed = false;
  try {
    agree(sig, what);
    agreed = true;
    body();
  } catch (...) {
    account(agreed);
    throw;
  }
  return account(true);
}

CommStats Runtime::allreduce(const TensorView& t, ReduceOp op, const std::string& name) {
  CallSignature sig = signature_of(kAllreduce, t, static_cast<int>(op), name);
  if (op != ReduceOp::kAverage && !is_elementwise_op(op))
    set_rejected(sig, "allreduce: unknown op " + std::to_string(static_cast<int>(op)));
  DeviceTable& dev = device_or_reject(t, sig, "allreduce");
  const uint64_t host_before = dev.host_bytes();
  return add_host_bytes(run(sig, name, [&] { dense_allreduce(*world_, dev, t, op); }), dev, host_before);
}

CommStats Runtime::allgather(const TensorView& t, const std::string& name,
                             std::vector<unsigned char>& out, std::vector<int64_t>& rows_per_rank) {
  // What must agree is everything but the first dim: the signature is that of one row (its dims
  // as the shape), with the dim count in the op field so that [5] and [5, 1] differ.
  TensorView row = t;
  const int64_t rows = t.shape.empty() ? t.numel : t.shape[0];
  row.shape.assign(t.shape.size() > 1 ? t.shape.begin() + 1 : t.shape.end(), t.shape.end());
  row.numel = 1;
  for (int64_t d : row.shape) row.numel *= d;
  CallSignature sig =
      signature_of(kAllgather, row, static_cast<int>(std::max<size_t>(t.shape.size(), 1)), name);
  const size_t row_bytes = static_cast<size_t>(row.numel) * dtype_size(t.dtype);
  DeviceTable& dev = device_or_reject(t, sig, "allgather");
  const uint64_t host_before = dev.host_bytes();
  return add_host_bytes(
      run(sig, name, [&] { allgather_rows(*world_, t.data, rows, row_bytes, out, rows_per_rank, &dev); }), dev,
      host_before);
}

CommStats Runtime::broadcast(const TensorView& t, int root, const std::string& name) {
  CallSignature sig = signature_of(kBroadcast, t, root, name);
  if (root < 0 || root >= size())
    set_rejected(sig, "broadcast root " + std::to_string(root) + " is not a rank of a world of " +
                          std::to_string(size()));
  DeviceTable& dev = device_or_reject(t, sig, "broadcast");
  const uint64_t host_before = dev.host_bytes();
  return add_host_bytes(run(sig, name,
                            [&] {
                              // Only the root's bytes travel out; every rank's come back.
                              HostCopy host(dev, t.data, t.nbytes(), rank() == root);
                              world_->broadcast(host.get(), t.nbytes(), root);
                              host.write_back();
                            }),
                        dev, host_before);
}

CommStats Runtime::adasum(const TensorView& fused, const std::vector<int64_t>& tensor_sizes,
                          bool hierarchical, const std::string& name) {
  CallSignature sig = signature_of(kAdasum, fused, adasum_op(hierarchical), name);
  sig.ntensors = static_cast<int64_t>(tensor_sizes.size());
  sig.layout_hash = fnv1a(tensor_sizes.data(), tensor_sizes.size() * sizeof(int64_t));
  int64_t total = 0;
  bool negative = false;
  for (int64_t s : tensor_sizes) {
    negative |= s < 0;
    total += s;
  }
  if (negative || total != fused.numel)
    set_rejected(sig, "Adasum: tensor sizes (" + std::to_string(tensor_sizes.size()) +
                          " tensors, " + std::to_string(total) +
                          " elements) do not cut the fused buffer of " +
                          std::to_string(fused.numel) + " elements");
  DeviceTable& dev = device_or_reject(fused, sig, "Adasum");
  if (hierarchical && dev.device_type() != Device::kCPU)
    set_rejected(sig, "hierarchical Adasum: CUDA tensors are not supported yet");
  const uint64_t host_before = dev.host_bytes();
  return add_host_bytes(run(sig, name, [&] { run_adasum(fused, tensor_sizes, hierarchical, &dev); }),
                        dev, host_before);
}

void Runtime::run_adasum(const TensorView& fused, const std::vector<int64_t>& tensor_sizes,
                         bool hierarchical, DeviceTable* dev) {
  if (hierarchical)
    adasum_hierarchical(*hierarchical_plan_, fused, tensor_sizes);  // on host memory only
  else
    adasum_rvh(*adasum_plan_, fused, tensor_sizes, dev);
}

CommStats Runtime::adasum_group(const std::vector<TensorView>& tensors, bool hierarchical,
                                const std::string& name) {
  CallSignature sig = signature_of(kAdasum, tensors, adasum_op(hierarchical), name);
  std::vector<int64_t> sizes;
  for (size_t i = 0; i < tensors.size(); ++i) {
    sizes.push_back(tensors[i].numel);
    if (tensors[i].dtype != tensors[0].dtype && sig.error[0] == '\0')
      set_rejected(sig, std::string("grouped Adasum: tensors must share one dtype; item ") +
                            std::to_string(i) + " is " + dtype_name(tensors[i].dtype) +
                            ", item 0 is " + dtype_name(tensors[0].dtype));
  }
  return run(sig, name, [&] {
    if (tensors.size() == 1) return run_adasum(tensors[0], sizes, hierarchical);
    TensorView fused;
    if (!tensors.empty()) fused.dtype = tensors[0].dtype;
    for (const TensorView& t : tensors) fused.numel += t.numel;
    std::vector<unsigned char> packed(fused.nbytes());
    fused.data = packed.data();
    size_t at = 0;
    for (const TensorView& t : tensors) {
      if (t.numel) std::memcpy(packed.data() + at, t.data, t.nbytes());
      at += t.nbytes();
    }
    run_adasum(fused, sizes, hierarchical);
    at = 0;
    for (const TensorView& t : tensors) {
      if (t.numel) std::memcpy(t.data, packed.data() + at, t.nbytes());
      at += t.nbytes();
    }
  });
}

CommStats Runtime::compressed_allreduce(const TensorView& buffer, const TensorView& worker_error,
                                        const TensorView& server_error, const std::string& name) {
  CallSignature sig = signature_of(kCompressedAllreduce, buffer, 0, name);
  // Local checks (sizes, dtypes, finiteness) ride in the signature: one exchange, and a rank with
  // bad input makes every rank raise before any error buffer changes. The finiteness check is
  // fused into the first (read-only) pass of phase 1, which onebit_prepare runs here, outside
  // the lock (it touches no communicator).
  OneBitCall call;
  call.kernels = kernels_;
  call.pipeline = onebit_pipeline_;
  call.device = &device_or_reject(buffer, sig, "compressed_allreduce");
  const uint64_t host_before = call.device->host_bytes();
  const std::string why = onebit_prepare(buffer, worker_error, server_error, size(), call);
  if (!why.empty()) set_rejected(sig, why);
  return add_host_bytes(run(sig, name.empty() ? "compressed_allreduce" : name,
                            [&] { compressed_allreduce_prepared(*world_, call); }),
                        *call.device, host_before);
}

namespace {

// What a masked call (allreduce or gather) agrees on: the mask's range `spec` of `t` (its length set to t's),
// rejected for an invalid spec.
CallSignature masked_agreement(const TensorView& t, MaskSpec& spec, const std::string& name, Collective collective) {
  spec.length = t.numel;  // `t` is elements [first, first + t.numel) of the mask's index space
  CallSignature sig = masked_signature(t, spec, name, collective);
  const std::string why = check_mask_spec(spec);
  if (!why.empty()) set_rejected(sig, why);
  return sig;
}

// With `check_finite`, a NaN/Inf in `t` (found by dev's kernel) rejects `sig`, where nothing else did.
void reject_nonfinite(CallSignature& sig, DeviceTable& dev, const TensorView& t, bool check_finite,
                      const char* what) {
  if (!check_finite || sig.error[0] != '\0') return;
  const int64_t bad = dev.first_nonfinite(t.data, t.dtype, nullptr, t.numel);
  if (bad >= 0)
    set_rejected(sig, std::string(what) + ": non-finite value at element " + std::to_string(bad) + " of " +
                          std::to_string(t.numel));
}

}  // namespace

CommStats Runtime::masked_allreduce(const TensorView& t, const MaskSpec& spec_in,
                                    uint8_t* mask_out, bool check_finite,
                                    const std::string& name) {
  MaskSpec spec = spec_in;
  CallSignature sig = masked_agreement(t, spec, name, kMaskedAllreduce);
  DeviceTable& dev = device_or_reject(t, sig, "masked_allreduce");
  reject_nonfinite(sig, dev, t, check_finite, "masked_allreduce");
  const uint64_t host_before = dev.host_bytes();
  return add_host_bytes(run(sig, name.empty() ? "masked_allreduce" : name, [&] {
    // The mask is drawn once the ranks agreed: a rejected call leaves mask_out as it was.
    DeviceBuffer own(dev, mask_out || dev.host_memory() ? 0 : static_cast<size_t>(t.numel));
    if (!mask_out && dev.host_memory()) masked_mask_.resize(static_cast<size_t>(t.numel));
    uint8_t* m = mask_out ? mask_out : dev.host_memory() ? masked_mask_.data() : own.get();
    masked_draw(dev, spec, m);
    masked_average(*world_, dev, t, m, masked_scratch_);
  }), dev, host_before);
}

CommStats Runtime::masked_gather(const TensorView& t, const MaskSpec& spec_in, uint8_t* mask_out,
                                 void* compact, int64_t capacity, bool check_finite, const std::string& name,
                                 int64_t* count) {
  MaskSpec spec = spec_in;
  CallSignature sig = masked_agreement(t, spec, name, kMaskedGather);
  DeviceTable& dev = device_or_reject(t, sig, "masked_gather");
  reject_nonfinite(sig, dev, t, check_finite, "masked_gather");
  const uint64_t host_before = dev.host_bytes();
  return add_host_bytes(run(sig, name.empty() ? "masked_gather" : name, [&] {
    masked_draw(dev, spec, mask_out);
    const int64_t n = dev.mask_count(mask_out, t.numel);
    *count = n;
    if (compact == nullptr) return;
    // The mask is the same on every rank, and so is this check: a too small buffer throws everywhere.
    if (n > capacity)
      throw UsageError("masked_gather: " + std::to_string(n) + " elements selected, room for " +
                       std::to_string(capacity));
    dev.mask_gather(t.data, mask_out, t.numel, n, dtype_size(t.dtype), compact);
    dev.wait();  // before the caller reads compact
  }), dev, host_before);
}

CommStats Runtime::hierarchical_compressed_allreduce(const HierarchicalCall& call, bool hierarchical,
                                                    const std::string& name) {
  // Everything that must match across ranks rides in the signature: the payload and the modes in
  // `op`, the seed, step and moment constants in the layout hash (a mismatch raises everywhere).
  const int op = static_cast<int>(call.payload) | (hierarchical ? kHierarchicalFlag : 0) |
                 (call.has_moments ? kMomentsFlag : 0) | (call.worker_uniforms.data ? kWorkerUniformsFlag : 0);
  CallSignature sig = signature_of(kHierarchicalCompressedAllreduce, call.buffer, op, name);
  const struct {
    uint64_t seed;
    uint32_t step;
    float beta, one_minus_beta, eps;
  } constants{call.key.seed, call.key.step, call.beta, call.one_minus_beta, call.eps};
  sig.layout_hash = fnv1a(&constants, sizeof constants);
  const HierarchicalGroups groups =
      hierarchical ? hierarchical_onebit_plan_->groups() : HierarchicalGroups{nullptr, world_.get()};
  HierarchicalCall with_kernels = call;
  with_kernels.kernels = kernels_;
  with_kernels.pipeline = onebit_pipeline_;
  with_kernels.device = &device_or_reject(call.buffer, sig, "hierarchical_compressed_allreduce");
  DeviceTable& dev = *with_kernels.device;
  const uint64_t host_before = dev.host_bytes();
  std::string why = hierarchical ? hierarchical_onebit_plan_->invalid() : "";
  if (why.empty()) why = hierarchical_check(groups, with_kernels);
  if (!why.empty()) set_rejected(sig, why);
  return add_host_bytes(run(sig, name.empty() ? "hierarchical_compressed_allreduce" : name,
                            [&] { hvdc::hierarchical_compressed_allreduce(groups, with_kernels); }),
                        dev, host_before);
}

CommStats Runtime::sparse_allreduce(const TensorView& buffer, const TensorView& error, const TensorView& velocity,
                                   const SparseSpec& spec, const std::string& name) {
  // The kind rides in the op field; ratio, seed, (random-k) step and (top-k) momentum and masking, which
  // decide what is sent, in the layout hash with the tensor sizes: ranks that disagree raise MismatchError
  // on every rank.
  CallSignature sig = signature_of(kSparseAllreduce, buffer,
                                   static_cast<int>(spec.op) | (static_cast<int>(spec.kind) << 8), name);
  uint64_t key[5] = {0, spec.seed, spec.kind == SparseKind::kRandomK ? spec.step : 0u, 0,
                     static_cast<uint64_t>(spec.momentum_masking)};
  std::memcpy(&key[0], &spec.ratio, sizeof(double));
  std::memcpy(&key[3], &spec.momentum, sizeof(double));
  sig.layout_hash = fnv1a(spec.segments.data(), spec.segments.size() * sizeof(int64_t), fnv1a(key, sizeof(key)));
  sig.ntensors = spec.segments.empty() ? 1 : static_cast<int64_t>(spec.segments.size());
  DeviceTable& dev = device_or_reject(buffer, sig, "allreduce(compression=)");
  const uint64_t host_before = dev.host_bytes();
  const std::string why = sparse_check_input(buffer, error, velocity, spec, &dev);
  if (!why.empty()) set_rejected(sig, why);
  const CallName call = split_call_name(name);
  const std::string what = std::string("allreduce(compression=") + sparse_kind_name(spec.kind) +
                           (call.shown.empty() ? "" : ", name=" + call.shown) +
                           ") [kind, ratio, seed, momentum and step must match on every rank]" +
                           (call.details.empty() ? "" : "|" + call.details);
  return add_host_bytes(run(sig, what, [&] { sparse_allreduce_prepared(*world_, buffer, error, velocity, spec, &dev); }),
                        dev, host_before);
}

CommStats Runtime::block_quant_allreduce(const TensorView& buffer, const TensorView& error, int bits, ReduceOp op,
                                         const std::string& name) {
  CallSignature sig = signature_of(kBlockQuantAllreduce, buffer, static_cast<int>(op) | (bits << 8), name);
  DeviceTable& dev = device_or_reject(buffer, sig, "block_quant_allreduce");
  if (sig.error[0] == '\0') {
    const std::string why = block_quant_check_input(buffer, error, bits, op, &dev);
    if (!why.empty()) set_rejected(sig, why);
  }
  const uint64_t host_before = dev.host_bytes();
  const CallName call = split_call_name(name);
  const std::string what = "allreduce(compression=int" + std::to_string(bits) +
                           (call.shown.empty() ? "" : ", name=" + call.shown) + ") [bits must match on every rank]" +
                           (call.details.empty() ? "" : "|" + call.details);
  return add_host_bytes(run(sig, what, [&] { block_quant_allreduce_prepared(*world_, dev, buffer, error, bits, op); }),
                        dev, host_before);
}

void Runtime::join() {
  CallSignature sig;
  sig.collective = kJoin;
  run(sig, "join()", [] {});
}

void Runtime::reject(Collective collective, const std::string& why, const std::string& name) {
  CallSignature sig;
  sig.collective = collective;
  set_rejected(sig, why);
  run(sig, name, [] {});
  throw UsageError(why);  // unreachable: the exchange throws on the rejection it just sent
}

void Runtime::leave(double timeout_s) {
  world_->leave(timeout_s);
}

Runtime::~Runtime() = default;

CommStats Runtime::add_host_bytes(CommStats moved, const DeviceTable& dev, uint64_t before) {
  moved.host_bytes = dev.host_bytes() - before;
  const std::lock_guard<std::mutex> totals_lock(stats_mu_);
  totals_.host_bytes += moved.host_bytes;
  return moved;
}

DeviceTable& Runtime::device_or_reject(const TensorView& t, CallSignature& sig, const char* what) {
  DeviceTable* dev = device_for(t);
  if (dev) return *dev;
  set_rejected(sig, std::string(what) + ": a CUDA tensor, and no CUDA device table is loaded "
                                        "(hvd_compress._cuda)");
  return cpu_device(kernels_);  // never runs: every rank raises in the agreement
}

DeviceTable* Runtime::device_for(const TensorView& t) {
  if (t.device == Device::kCUDA) return cuda_device_;
  if (staged_device_) return staged_device_.get();
  return &cpu_device(kernels_);
}

void Runtime::register_device(DeviceTable* table) {
  if (!table || table->device_type() != Device::kCUDA)
    throw UsageError("register_device: not a CUDA device table");
  const std::lock_guard<std::mutex> lock(mu_);
  cuda_device_ = table;
}

void Runtime::set_test_device(const std::string& which, const std::string& fault, int index) {
  StagedFault kind = StagedFault::kNone;
  if (fault == "to_host") kind = StagedFault::kSkipToHost;
  else if (fault == "to_device") kind = StagedFault::kSkipToDevice;
  else if (fault == "wait") kind = StagedFault::kSkipWait;
  else if (!fault.empty()) throw UsageError("set_test_device: unknown fault '" + fault + "'");
  if (which != "staged" && which != "")
    throw UsageError("set_test_device: unknown device '" + which + "' (\"staged\" or \"\")");
  if (which.empty() && kind != StagedFault::kNone)
    throw UsageError("set_test_device: faults are the staged device's");
  const std::lock_guard<std::mutex> lock(mu_);
  if (which.empty()) {
    staged_device_.reset();
    return;
  }
  if (!staged_device_) staged_device_.reset(new StagedDevice(kernels_));
  staged_device_->set_fault(kind, index);
}

std::string Runtime::test_device() const { return staged_device_ ? "staged" : ""; }

CommStats Runtime::stats() const {
  const std::lock_guard<std::mutex> lock(stats_mu_);
  return totals_;
}

void Runtime::reset_stats() {
  const std::lock_guard<std::mutex> lock(stats_mu_);
  totals_ = CommStats{};
}

}  // namespace hvdc
