#include "hvdc/runtime.h"

#include <cstdio>

#include "hvdc/dense_allreduce.h"
#include "hvdc/errors.h"
#include "hvdc/signature.h"

namespace hvdc {
namespace {

CallSignature signature_of(Collective collective, const TensorView& t, int op,
                           const std::string& name) {
  CallSignature sig;
  sig.collective = collective;
  sig.op = op;
  sig.dtype = static_cast<int32_t>(t.dtype);
  sig.device = static_cast<int32_t>(t.device);
  sig.numel = t.numel;
  sig.name_hash = fnv1a(name.data(), name.size());
  return sig;
}

}  // namespace

Runtime::Runtime(MPI_Comm world, double timeout_s)
    : world_(new MpiCommunicator(world)), timeout_s_(timeout_s) {}

void Runtime::agree(CallSignature sig, const std::string& name) {
  if (broken_)
    throw CommTimeoutError("an earlier collective timed out; this process cannot communicate "
                           "any more and must be restarted");
  try {
    agree_on_signature(*world_, sig, timeout_s_, name.empty() ? "hvd_compress collective" : name);
  } catch (const CommTimeoutError&) {
    broken_ = true;
    throw;
  }
}

void Runtime::allreduce(const TensorView& t, ReduceOp op, const std::string& name) {
  agree(signature_of(kAllreduce, t, static_cast<int>(op), name), name);
  world_->stats().calls++;
  dense_allreduce(*world_, t, op);
}

void Runtime::broadcast(const TensorView& t, int root, const std::string& name) {
  if (root < 0 || root >= size())
    throw UsageError("broadcast root " + std::to_string(root) + " is not a rank of a world of " +
                     std::to_string(size()));
  agree(signature_of(kBroadcast, t, root, name), name);
  world_->stats().calls++;
  world_->broadcast(t.data, t.nbytes(), root);
}

void Runtime::reject(int collective, const std::string& why, const std::string& name) {
  CallSignature sig;
  sig.collective = collective;
  std::snprintf(sig.error, sizeof(sig.error), "%s", why.c_str());
  agree(sig, name);
  throw UsageError(why);  // unreachable: agree() throws on the error it just sent
}

}  // namespace hvdc
