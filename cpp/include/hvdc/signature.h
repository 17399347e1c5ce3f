// What a rank is about to do in a collective, exchanged before any data moves so that ranks that
// disagree (shape, dtype, op, tensor count, name) all fail with the same clear error instead of
// deadlocking or reducing mismatched bytes.
#pragma once
#include <cstdint>
#include <string>

#include "hvdc/communicator.h"
#include "hvdc/tensor.h"

namespace hvdc {

// Core entry points, so that ranks in different collectives are told so.
enum Collective : int32_t { kAllreduce = 1, kBroadcast = 2, kAdasum = 3, kCompressedAllreduce = 4 };

struct CallSignature {
  int32_t collective = 0;  // which core entry point
  int32_t op = 0;
  int32_t dtype = 0;
  int32_t device = 0;
  int64_t numel = 0;
  int64_t ntensors = 1;
  uint64_t layout_hash = 0;  // hash of the per-tensor sizes of a grouped call
  uint64_t name_hash = 0;
  // Non-empty when this rank rejected its own input; every rank then raises with this text.
  char error[160] = {0};
};

uint64_t fnv1a(const void* data, size_t bytes, uint64_t h = 1469598103934665603ull);

// The signature of a one-tensor call of `collective` on `t` (op, dtype, device, numel, name hash).
CallSignature signature_of(Collective collective, const TensorView& t, int op,
                           const std::string& name);

// Allgathers `sig` (with `timeout_s`). Throws UsageError on every rank if any rank rejected its
// input, else MismatchError on every rank if any signature differs from rank 0's. `what` names
// the call in the message.
void agree_on_signature(Communicator& comm, const CallSignature& sig, double timeout_s,
                        const std::string& what);

}  // namespace hvdc
