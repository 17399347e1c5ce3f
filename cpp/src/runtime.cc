#include "hvdc/runtime.h"

#include <cstdio>
#include <cstdlib>

#include "hvdc/dense_allreduce.h"
#include "hvdc/errors.h"
#include "hvdc/signature.h"

namespace hvdc {

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
  const auto lock = serialize();
  agree(signature_of(kAllreduce, t, static_cast<int>(op), name), name);
  world_->stats().calls++;
  dense_allreduce(*world_, t, op);
}

void Runtime::broadcast(const TensorView& t, int root, const std::string& name) {
  const auto lock = serialize();
  if (root < 0 || root >= size())
    throw UsageError("broadcast root " + std::to_string(root) + " is not a rank of a world of " +
                     std::to_string(size()));
  agree(signature_of(kBroadcast, t, root, name), name);
  world_->stats().calls++;
  world_->broadcast(t.data, t.nbytes(), root);
}

namespace {

// Bit set in the signature's op field of a hierarchical Adasum call, so that ranks that disagree
// on the mode raise MismatchError ("op") instead of joining different communicators.
constexpr int32_t kAdasumHierarchicalFlag = 0x100;

// HVDC_LOCAL_SIZE=k: consecutive blocks of k ranks form a node (emulates nodes on one machine);
// 0 when unset, meaning the MPI shared-memory node.
int local_size_from_env() {
  const char* raw = std::getenv("HVDC_LOCAL_SIZE");
  if (raw == nullptr || *raw == '\0') return 0;
  char* end = nullptr;
  const long k = std::strtol(raw, &end, 10);
  if (*end != '\0' || k < 1 || k > (1 << 30))
    throw UsageError(std::string("HVDC_LOCAL_SIZE=") + raw + " is not a positive number of ranks");
  return static_cast<int>(k);
}

}  // namespace

void Runtime::adasum(const TensorView& fused, const std::vector<int64_t>& tensor_sizes,
                     bool hierarchical, const std::string& name) {
  const auto lock = serialize();
  int64_t total = 0;
  bool negative = false;
  for (int64_t s : tensor_sizes) {
    negative |= s < 0;
    total += s;
  }
  if (negative || total != fused.numel)
    reject_unlocked(kAdasum,
           "Adasum: tensor sizes (" + std::to_string(tensor_sizes.size()) + " tensors, " +
               std::to_string(total) + " elements) do not cut the fused buffer of " +
               std::to_string(fused.numel) + " elements",
           name);
  CallSignature sig = signature_of(
      kAdasum, fused,
      static_cast<int>(ReduceOp::kAdasum) | (hierarchical ? kAdasumHierarchicalFlag : 0), name);
  sig.ntensors = static_cast<int64_t>(tensor_sizes.size());
  sig.layout_hash = fnv1a(tensor_sizes.data(), tensor_sizes.size() * sizeof(int64_t));
  agree(sig, name);
  world_->stats().calls++;
  if (!hierarchical) {
    if (!adasum_plan_) adasum_plan_.reset(new AdasumPlan(*world_));
    adasum_rvh(*adasum_plan_, fused, tensor_sizes);
    const CommStats s = adasum_plan_->take_stats();
    world_->stats().add(s.bytes_sent, s.bytes_received);
    return;
  }
  if (!hierarchical_plan_) {
    // Every rank must split the same way: agree on HVDC_LOCAL_SIZE before any split.
    CallSignature local;
    local.collective = kAdasum;
    try {
      local.numel = local_size_from_env();
    } catch (const UsageError& e) {
      std::snprintf(local.error, sizeof(local.error), "%s", e.what());
    }
    agree(local, "HVDC_LOCAL_SIZE of hierarchical Adasum");
    const int k = static_cast<int>(local.numel);
    std::unique_ptr<Communicator> node =
        k > 0 ? world_->split(rank() / k, rank()) : world_->split_shared();
    hierarchical_plan_.reset(new HierarchicalAdasumPlan(*world_, std::move(node)));
  }
  adasum_hierarchical(*hierarchical_plan_, fused, tensor_sizes);
  const CommStats s = hierarchical_plan_->take_stats();
  world_->stats().add(s.bytes_sent, s.bytes_received);
}

void Runtime::reject(int collective, const std::string& why, const std::string& name) {
  const auto lock = serialize();
  reject_unlocked(collective, why, name);
}

void Runtime::reject_unlocked(int collective, const std::string& why, const std::string& name) {
  CallSignature sig;
  sig.collective = collective;
  std::snprintf(sig.error, sizeof(sig.error), "%s", why.c_str());
  agree(sig, name);
  throw UsageError(why);  // unreachable: agree() throws on the error it just sent
}

}  // namespace hvdc
