// What a rank is about to do in a collective, exchanged before any data moves so that ranks that
// disagree (shape, dtype, op, tensor count, name) all fail with the same clear error instead of
// deadlocking or reducing mismatched bytes.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "hvdc/communicator.h"
#include "hvdc/tensor.h"

namespace hvdc {

// Core entry points, so that ranks in different collectives are told so. kInit is the runtime's
// own exchange at start-up (the settings that must be equal on every rank).
enum Collective : int32_t {
  kAllreduce = 1,
  kBroadcast = 2,
  kAdasum = 3,
  kCompressedAllreduce = 4,
  kInit = 5,
  kAllgather = 6,
  kMaskedAllreduce = 7,  // SLAMB's masked allreduce
  kSparseAllreduce = 8,  // the top-k / random-k compressed reductions
  kHierarchicalCompressedAllreduce = 9,  // Birder's hierarchical 1-bit allreduce
  kMaskedGather = 10,  // SLAMB's agreed mask and gather, its average left to a dense allreduce
  kJoin = 11,  // join(): this rank is out of data; every rank must reach it together
  kBlockQuantAllreduce = 12,  // DiLoCo's int8/int4 outer gradients (block_quant_allreduce.h)
};

struct CallSignature {
  int32_t collective = 0;  // which core entry point
  int32_t op = 0;
  int32_t dtype = 0;
  int32_t device = 0;
  int64_t numel = 0;
  int64_t ntensors = 1;
  uint64_t layout_hash = 0;  // hash of the per-tensor sizes of a grouped call
  uint64_t name_hash = 0;
  // Hash of every dim of every tensor: what is compared. `shape` is the same dims as text, for the
  // message only, cut with "..." where they do not fit (the hash still tells such shapes apart).
  uint64_t shape_hash = 0;
  char shape[40] = {0};
  // Non-empty when this rank rejected its own input; every rank then raises with this text.
  char error[160] = {0};
};
// Every call exchanges one signature per peer; the tests (and the byte counts users see) rely on
// this staying within 256 bytes.
static_assert(sizeof(CallSignature) <= 256, "CallSignature travels in every call: keep it small");

uint64_t fnv1a(const void* data, size_t bytes, uint64_t h = 1469598103934665603ull);

// The signature of a one-tensor call of `collective` on `t` (op, dtype, device, numel, shape, name
// hash).
CallSignature signature_of(Collective collective, const TensorView& t, int op,
                           const std::string& name);

// The signature of a grouped call on `tensors` (one dtype): numel is the total, the layout hash
// covers the per-tensor sizes and the shape every tensor's dims.
CallSignature signature_of(Collective collective, const std::vector<TensorView>& tensors, int op,
                           const std::string& name);

// Marks `sig` as rejected by this rank, for the reason `why` (cut to fit).
void set_rejected(CallSignature& sig, const std::string& why);

// The core entry point `c` in words ("allreduce", "broadcast", ...), for messages.
const char* collective_name(int32_t c);

// A call's name may carry details after a '|': lines "key=value" (an algorithm's op, its options, its
// hyper-parameters). The whole name is hashed into the signature, so ranks whose details differ
// raise MismatchError; messages show the part before the '|', and a mismatch names each detail
// that differs with every rank's value.
struct CallName {
  std::string shown;
  std::string details;
};
CallName split_call_name(const std::string& name);

// How a rank waits in the signature exchange for the ranks that have not joined.
struct JoinWait {
  double timeout_s = 0;     // then CommTimeoutError (<= 0: forever)
  double warn_every_s = 0;  // a warning this often, naming the call and the missing ranks (<= 0: none)
  // Where the warnings go (empty: stderr).
  std::function<void(const std::string&)> warn;
};

// Allgathers `sig`, waiting as `wait` says. Throws UsageError on every rank if any rank rejected
// its input (RejectedInputError, a UsageError), else MismatchError on every rank if any signature
// differs from rank 0's (naming the ranks in join() where only some are: uneven data; where the
// names differ, a second exchange of the names names each detail that differs). `what` names the
// call in messages (and may carry details: split_call_name).
void agree_on_signature(Communicator& comm, const CallSignature& sig, const JoinWait& wait,
                        const std::string& what);
inline void agree_on_signature(Communicator& comm, const CallSignature& sig, double timeout_s,
                               const std::string& what) {
  JoinWait wait;
  wait.timeout_s = timeout_s;
  agree_on_signature(comm, sig, wait, what);
}

}  // namespace hvdc
