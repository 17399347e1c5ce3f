// The one object that holds the core's mutable state: the world communicator, the settings that
// apply to every collective and the node topology. Python holds exactly one per process
// (hvd_compress.ops.runtime).
//
// Every collective runs the same protocol (Runtime::run): one call at a time; this rank's
// signature (with its rejection of its own input, if any) exchanged with every rank, so that a
// bad call raises on every rank instead of hanging the others; the call counted; and the bytes
// this rank moved for it returned to the caller.
#pragma once
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "hvdc/adasum.h"
#include "hvdc/comm_stats.h"
#include "hvdc/compressed_allreduce.h"
#include "hvdc/device.h"
#include "hvdc/kernel_isa.h"
#include "hvdc/masks.h"
#include "hvdc/hierarchical_allreduce.h"
#include "hvdc/communicator.h"
#include "hvdc/reduce_op.h"
#include "hvdc/signature.h"
#include "hvdc/tensor.h"

namespace hvdc {

struct SparseSpec;  // hvdc/sparse_allreduce.h
class StagedDevice;  // hvdc/staged_device.h

// What the runtime reads once, at start-up (hvd_compress.ops reads it from the environment).
struct RuntimeConfig {
  // HVDC_TIMEOUT: seconds a collective waits for every rank to join (then CommTimeoutError), and the
  // longest a transfer inside a collective every rank joined may stall (then the job is aborted). Long:
  // a peer that exited is named at once (its goodbye), so this only ends a wait for a live peer that
  // is elsewhere, and a rank may well spend many minutes alone evaluating or checkpointing.
  double timeout_s = 3600;
  // HVDC_STALL_WARNING: while a collective waits for ranks that have not joined, a warning naming it
  // and them, this often (seconds; <= 0: none), on every waiting rank (Horovod's stall inspector:
  // HOROVOD_STALL_CHECK_TIME_SECONDS).
  double stall_warning_s = 60;
  // Where those warnings go (empty: stderr).
  std::function<void(const std::string&)> warn;
  // HVDC_LOCAL_SIZE=k: consecutive blocks of k ranks form a node (emulates nodes on one machine);
  // 0 means the node the transport reports (Runtime's `shared_node`; MPI: the shared-memory node).
  int local_size = 0;
  // HVDC_ONEBIT_KERNELS=scalar: the element-wise kernels of every call run the portable code.
  KernelChoice kernels = KernelChoice::kAuto;
  // HVDC_ONEBIT_PIPELINE=piece: the flat 1-bit collective's pipeline pieces (elements; 0: never
  // pipeline). Must match on every rank (agreed at start-up).
  OneBitPipeline onebit_pipeline;
  // Non-empty when this rank's settings are invalid (why): the constructor then raises on every
  // rank, instead of this rank alone leaving the others waiting in the start-up exchange.
  std::string invalid;
};

class Runtime {
 public:
  // This rank's node communicator when config.local_size is 0, split off the world (collective).
  using NodeSplit = std::function<std::unique_ptr<Communicator>()>;

  // Over `world` (any transport: MPI in the extension, watched_world() in mpi_communicator.h;
  // threads in the C++ tests). Collective: agrees on the settings that must match (local size),
  // then builds the node topology and the Adasum level groups once. A null `shared_node` makes the
  // whole world one node. Throws UsageError on every rank if some rank's config is invalid.
  Runtime(std::unique_ptr<Communicator> world, const RuntimeConfig& config, const NodeSplit& shared_node);
  ~Runtime();

  int rank() const { return world_->rank(); }
  int size() const { return world_->size(); }
  double timeout() const { return wait_.timeout_s; }
  double stall_warning() const { return wait_.warn_every_s; }
  KernelChoice kernels() const { return kernels_; }
  // Ranks in this rank's node (the topology built at start-up).
  int node_size() const { return hierarchical_plan_->node().size(); }
  // Also the stall timeout of every transfer inside an agreed collective (mpi_communicator.h).
  void set_timeout(double s) {
    wait_.timeout_s = s;
    world_->set_stall_timeout(s);
  }

  // Each collective returns the bytes this rank sent and received for that call (signature
  // exchange included; calls == 1), counted under the runtime's lock, so calls on other threads
  // never leak into it. Bad input on any rank throws UsageError on every rank, before any data
  // moves.
  // `op`: Average, Sum, Min, Max or Product (hvdc/dense_allreduce.h); floating and integer dtypes.
  CommStats allreduce(const TensorView& t, ReduceOp op, const std::string& name);
  CommStats broadcast(const TensorView& t, int root, const std::string& name);
  // In-place Adasum of a fused buffer whose tensors have `tensor_sizes` elements (dot products
  // and coefficients per tensor; see hvdc/adasum.h). `hierarchical`: average within each node,
  // Adasum across nodes. Sizes that do not add up to fused.numel are rejected on every rank.
  CommStats adasum(const TensorView& fused, const std::vector<int64_t>& tensor_sizes,
                   bool hierarchical, const std::string& name);
  // In-place Adasum of separate same-dtype tensors, packed into one core-owned buffer (one
  // exchange, one small allreduce per level for all of them) and unpacked afterwards.
  CommStats adasum_group(const std::vector<TensorView>& tensors, bool hierarchical,
                         const std::string& name);
  // In place: `buffer` becomes the error-compensated 1-bit average (hvdc/compressed_allreduce.h);
  // the error buffers are updated only if every rank accepted its input.
  CommStats compressed_allreduce(const TensorView& buffer, const TensorView& worker_error,
                                 const TensorView& server_error, const std::string& name);

  // Horovod's allgather: `t` (at least one dim) may have a different first dim on each rank; its
  // other dims and its dtype must agree (MismatchError otherwise). `out` receives every rank's
  // rows in rank order and `rows_per_rank` each rank's first dim.
  CommStats allgather(const TensorView& t, const std::string& name, std::vector<unsigned char>& out,
                      std::vector<int64_t>& rows_per_rank);
  // In place (hvdc/masked_allreduce.h): the elements of `t` that the mask of `spec` selects become
  // their average over all ranks, the others stay local. `t` holds elements [spec.first,
  // spec.first + t.numel) of the mask's index space [0, spec.numel) (the whole of it when first is 0
  // and numel is t.numel; SLAMB's buckets are ranges of it). The mask's arguments (ratio, seed, step,
  // kind, always-selected ranges, the range) are part of the signature, so ranks whose masks would
  // differ raise MismatchError. `mask_out` (t.numel bytes, may be null) receives the mask used. `check_finite`: a NaN/Inf anywhere in `t` on any rank raises UsageError on every
  // rank with `t` unchanged.
  CommStats masked_allreduce(const TensorView& t, const MaskSpec& spec, uint8_t* mask_out,
                             bool check_finite, const std::string& name);
  // The first half of masked_allreduce, for a caller that averages the dense buffer itself (SLAMB computes
  // its momentum on the gathered elements only, and starts its local work once the ranks agreed): the same
  // agreement (signature of kMaskedGather, `check_finite` on `t`), then the mask into `mask_out` (t.numel
  // bytes) and t[mask] gathered in index order into `compact` (room for `capacity` elements of t's dtype; null:
  // the mask only). `*count` receives the number selected, the same on every rank. Only the signature travels.
  CommStats masked_gather(const TensorView& t, const MaskSpec& spec, uint8_t* mask_out, void* compact,
                          int64_t capacity, bool check_finite, const std::string& name, int64_t* count);
  // In place: `call.buffer` becomes the Hierarchical-1-bit-All-Reduce of paper 004 Section 4
  // (hvdc/hierarchical_allreduce.h), Birder's +/-1 or the scaled 1-bit payload; `hierarchical`:
  // over the node topology built at start-up (nodes of unequal size are rejected on every rank),
  // else flat (every rank its own node). Errors and moments change only if every rank accepted.
  CommStats hierarchical_compressed_allreduce(const HierarchicalCall& call, bool hierarchical,
                                              const std::string& name);
  // In place: `buffer` becomes its compressed reduction (hvdc/sparse_allreduce.h: 16-bit wire, top-k,
  // random-k); `error` (top-k/random-k) and `velocity` (top-k with momentum) are updated only if every
  // rank accepted its input. The kind, ratio, seed, (random-k) step and momentum are part of the signature.
  CommStats sparse_allreduce(const TensorView& buffer, const TensorView& error, const TensorView& velocity,
                             const SparseSpec& spec, const std::string& name);
  // In place: `buffer` (float32) becomes its int8/int4 block-quantized reduction (hvdc/block_quant_allreduce.h);
  // `error` (or none) is updated only if every rank accepted its input. The bits are part of the signature.
  CommStats block_quant_allreduce(const TensorView& buffer, const TensorView& error, int bits, ReduceOp op,
                                  const std::string& name);

  // Horovod's join(): returns once every rank called it. A rank that called it while another is in
  // some other collective fails with the others, on every rank (MismatchError naming it): the
  // algorithms have no part of a rank without data to fill in, as Horovod fills zeros.
  void join();

  // Joins the signature exchange of a collective whose input this rank could not even read
  // (`why`), so that every rank raises instead of the others waiting for a peer that never
  // arrives. Always throws.
  [[noreturn]] void reject(Collective collective, const std::string& why, const std::string& name);

  // This process is exiting: tells every peer (mpi_communicator.h, PeerWatch), so that a peer waiting
  // for it in a collective raises PeerExitedError naming this rank instead of waiting for the
  // timeout. Waits at most `timeout_s` for the messages to leave; not under the collectives' lock
  // (a collective stuck on another thread must not keep the goodbye in).
  void leave(double timeout_s);

  // Bytes on the wire by this rank since the last reset_stats(), signature exchanges included.
  CommStats stats() const;
  void reset_stats();

  // Device tables (hvdc/device.h). The table for a tensor: CUDA tensors the registered CUDA table
  // (null until hvd_compress._cuda registered one), CPU tensors the CPU's, or the staged test
  // device where set_test_device("staged") chose it.
  DeviceTable* device_for(const TensorView& t);
  // Called by hvd_compress._cuda's loader; the table outlives the runtime (the module keeps it).
  void register_device(DeviceTable* table);
  // Tests only, the same on every rank: "staged" runs the collectives that go through the table
  // (allreduce, broadcast, compressed_allreduce, flat adasum, masked_allreduce, masked_gather,
  // block_quant_allreduce) on the staged test device, "" on the CPU's; `fault` drops the
  // `index`-th "to_host", "to_device" or "wait" of the staged device from now on ("": none).
  void set_test_device(const std::string& which, const std::string& fault = "", int index = 0);
  std::string test_device() const;

 private:
  // The protocol of every collective: under mu_, agree on `sig` (throws on every rank if some rank
  // rejected its input or the signatures differ; a timeout marks the runtime broken), count the
  // call, run `body`, and return what this call moved. Defined in runtime.cc.
  template <typename Body>
  CommStats run(const CallSignature& sig, const std::string& what, Body&& body);
  // The table of `t`'s device; where there is none, `sig` rejected (every rank raises).
  DeviceTable& device_or_reject(const TensorView& t, CallSignature& sig, const char* what);
  // `moved` with the bytes `dev` copied since it counted `before`, added to the totals too.
  CommStats add_host_bytes(CommStats moved, const DeviceTable& dev, uint64_t before);
  void agree(const CallSignature& sig, const std::string& what);
  // The Adasum of a fused buffer, flat or hierarchical, on the topology built at start-up.
  // `dev`: the flat run's device table (null: the CPU's); the hierarchical run is the CPU's.
  void run_adasum(const TensorView& fused, const std::vector<int64_t>& tensor_sizes,
                  bool hierarchical, DeviceTable* dev = nullptr);
  // Moves what the plans' group communicators counted onto the world's counters.
  void absorb_plan_stats();

  // Collectives may be called from several threads (the Adasum optimizer reduces on a worker
  // thread while the main thread may reduce a loss); the communicators and scratch buffers are
  // shared, so one collective runs at a time. Taken with the GIL released.
  std::mutex mu_;
  std::unique_ptr<Communicator> world_;
  JoinWait wait_;  // how the signature exchange waits (timeout, warnings)
  KernelChoice kernels_;
  OneBitPipeline onebit_pipeline_;
  bool broken_ = false;  // set after a timeout: a pending request makes the communicator unusable
  std::string broken_by_;         // that timeout's message, repeated by every later call
  bool broken_by_exit_ = false;   // ... and whether a peer had left (PeerExitedError)
  // Built at start-up (collectively: every rank is in the constructor) and kept, so the per-level
  // group communicators and the node groups are split once. Declared after world_: destroyed
  // before it.
  std::unique_ptr<AdasumPlan> adasum_plan_;
  std::unique_ptr<HierarchicalAdasumPlan> hierarchical_plan_;
  // The cross-node groups of the hierarchical 1-bit allreduce, over hierarchical_plan_'s nodes.
  std::unique_ptr<HierarchicalOneBitPlan> hierarchical_onebit_plan_;
  // Totals for stats(): kept apart from the communicators' counters and under their own lock, so
  // that reading them never waits for a collective in flight on another thread.
  // The masked allreduce's dense buffer and mask, kept between calls (used under mu_).
  std::vector<unsigned char> masked_scratch_;
  std::vector<uint8_t> masked_mask_;
  mutable std::mutex stats_mu_;
  CommStats totals_;
  // The devices of device_for (the CUDA table is the _cuda module's; the staged one is the
  // runtime's own).
  DeviceTable* cuda_device_ = nullptr;
  std::unique_ptr<StagedDevice> staged_device_;
};

}  // namespace hvdc
