#include "hvdc/signature.h"

#include <cstring>
#include <sstream>
#include <vector>

#include "hvdc/dtype.h"
#include "hvdc/errors.h"

namespace hvdc {

uint64_t fnv1a(const void* data, size_t bytes, uint64_t h) {
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < bytes; ++i) {
    h ^= p[i];
    h *= 1099511628211ull;
  }
  return h;
}

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

namespace {

template <typename F>
void describe(std::ostringstream& out, const char* field, const std::vector<CallSignature>& all,
              F get) {
  bool differs = false;
  for (const auto& s : all) differs |= get(s) != get(all[0]);
  if (!differs) return;
  out << "\n  " << field << ":";
  for (size_t r = 0; r < all.size(); ++r) out << " rank " << r << "=" << get(all[r]) << ";";
}

}  // namespace

void agree_on_signature(Communicator& comm, const CallSignature& sig, double timeout_s,
                        const std::string& what) {
  std::vector<CallSignature> all(comm.size());
  comm.allgather_timed(&sig, all.data(), sizeof(CallSignature), timeout_s);
  for (size_t r = 0; r < all.size(); ++r) {
    if (all[r].error[0] == '\0') continue;
    all[r].error[sizeof(all[r].error) - 1] = '\0';
    throw UsageError(what + ": rank " + std::to_string(r) + " rejected its input: " +
                     all[r].error);
  }
  bool same = true;
  for (const auto& s : all) same &= std::memcmp(&s, &all[0], sizeof(CallSignature)) == 0;
  if (same) return;
  std::ostringstream out;
  out << what << ": ranks called it with different arguments";
  describe(out, "collective", all, [](const CallSignature& s) { return s.collective; });
  describe(out, "op", all, [](const CallSignature& s) { return s.op; });
  describe(out, "dtype", all,
           [](const CallSignature& s) { return std::string(dtype_name(DType(s.dtype))); });
  describe(out, "device", all, [](const CallSignature& s) { return s.device; });
  describe(out, "numel", all, [](const CallSignature& s) { return s.numel; });
  describe(out, "tensor count", all, [](const CallSignature& s) { return s.ntensors; });
  describe(out, "tensor sizes (hash)", all, [](const CallSignature& s) { return s.layout_hash; });
  describe(out, "name (hash)", all, [](const CallSignature& s) { return s.name_hash; });
  throw MismatchError(out.str());
}

}  // namespace hvdc
