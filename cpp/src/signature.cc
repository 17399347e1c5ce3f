#include "hvdc/signature.h"

#include <cstdio>
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

namespace {

// The dims `t` stands for: its shape, or [numel] for a flat view.
std::vector<int64_t> dims_of(const TensorView& t) {
  return t.shape.empty() ? std::vector<int64_t>{t.numel} : t.shape;
}

// Shape hash and text of `tensors`, in order. The dim count goes into the hash too, so that
// [6] [1] and [6, 1] differ in a group.
void set_shape(CallSignature& sig, const std::vector<const TensorView*>& tensors) {
  uint64_t h = fnv1a(nullptr, 0);
  std::string text;
  for (const TensorView* t : tensors) {
    const std::vector<int64_t> dims = dims_of(*t);
    const int64_t ndim = static_cast<int64_t>(dims.size());
    h = fnv1a(&ndim, sizeof(ndim), h);
    h = fnv1a(dims.data(), dims.size() * sizeof(int64_t), h);
    if (!text.empty()) text += ' ';
    text += '[';
    for (size_t d = 0; d < dims.size(); ++d) text += (d ? ", " : "") + std::to_string(dims[d]);
    text += ']';
  }
  sig.shape_hash = h;
  if (text.size() >= sizeof(sig.shape)) text = text.substr(0, sizeof(sig.shape) - 4) + "...";
  std::snprintf(sig.shape, sizeof(sig.shape), "%s", text.c_str());
}

}  // namespace

CallSignature signature_of(Collective collective, const TensorView& t, int op,
                           const std::string& name) {
  CallSignature sig;
  sig.collective = collective;
  sig.op = op;
  sig.dtype = static_cast<int32_t>(t.dtype);
  sig.device = static_cast<int32_t>(t.device);
  sig.numel = t.numel;
  sig.name_hash = fnv1a(name.data(), name.size());
  set_shape(sig, {&t});
  return sig;
}

CallSignature signature_of(Collective collective, const std::vector<TensorView>& tensors, int op,
                           const std::string& name) {
  CallSignature sig;
  sig.collective = collective;
  sig.op = op;
  if (!tensors.empty()) {
    sig.dtype = static_cast<int32_t>(tensors[0].dtype);
    sig.device = static_cast<int32_t>(tensors[0].device);
  }
  std::vector<int64_t> sizes;
  std::vector<const TensorView*> all;
  for (const TensorView& t : tensors) {
    sig.numel += t.numel;
    sizes.push_back(t.numel);
    all.push_back(&t);
  }
  sig.ntensors = static_cast<int64_t>(tensors.size());
  sig.layout_hash = fnv1a(sizes.data(), sizes.size() * sizeof(int64_t));
  sig.name_hash = fnv1a(name.data(), name.size());
  set_shape(sig, all);
  return sig;
}

void set_rejected(CallSignature& sig, const std::string& why) {
  std::snprintf(sig.error, sizeof(sig.error), "%s", why.c_str());
}

namespace {

// Adds "field: rank 0=...; rank 1=...;" to `out` when `key` differs between ranks.
template <typename Key, typename Show>
void describe(std::ostringstream& out, const char* field, const std::vector<CallSignature>& all,
              Key key, Show show) {
  bool differs = false;
  for (const auto& s : all) differs |= key(s) != key(all[0]);
  if (!differs) return;
  out << "\n  " << field << ":";
  for (size_t r = 0; r < all.size(); ++r) out << " rank " << r << "=" << show(all[r]) << ";";
}

template <typename Get>
void describe(std::ostringstream& out, const char* field, const std::vector<CallSignature>& all,
              Get get) {
  describe(out, field, all, get, get);
}

}  // namespace

void agree_on_signature(Communicator& comm, const CallSignature& sig, double timeout_s,
                        const std::string& what) {
  std::vector<CallSignature> all(comm.size());
  try {  // a rank that never joins: the error names the collective this rank waited in
    comm.allgather_timed(&sig, all.data(), sizeof(CallSignature), timeout_s);
  } catch (const PeerExitedError& e) {
    throw PeerExitedError(what + ": " + e.what());
  } catch (const CommTimeoutError& e) {
    throw CommTimeoutError(what + ": " + e.what());
  }
  for (size_t r = 0; r < all.size(); ++r) {
    if (all[r].error[0] == '\0') continue;
    all[r].error[sizeof(all[r].error) - 1] = '\0';
    throw RejectedInputError(what + ": rank " + std::to_string(r) + " rejected its input: " +
                     all[r].error);
  }
  bool same = true;
  for (const auto& s : all) same &= std::memcmp(&s, &all[0], sizeof(CallSignature)) == 0;
  if (same) return;
  std::string joined;
  for (size_t r = 0; r < all.size(); ++r)
    if (all[r].collective == kJoin) joined += (joined.empty() ? "" : ", ") + std::to_string(r);
  if (!joined.empty()) {  // some ranks ran out of data first: there is no part of theirs to fill in
    throw MismatchError(
        what + ": rank(s) " + joined + " called join() while the others called another collective: " +
        "the ranks ran different numbers of steps (uneven data). hvd_compress's ops run every step " +
        "on every rank; give every rank the same number of batches (DistributedSampler's " +
        "drop_last=True, or stop at the smallest count) and call join() on all of them, or not at all");
  }
  for (auto& s : all) s.shape[sizeof(s.shape) - 1] = '\0';  // a peer's text is printed below
  std::ostringstream out;
  out << what << ": ranks called it with different arguments";
  describe(out, "collective", all, [](const CallSignature& s) { return s.collective; });
  describe(out, "op", all, [](const CallSignature& s) { return s.op; });
  describe(out, "dtype", all,
           [](const CallSignature& s) { return std::string(dtype_name(DType(s.dtype))); });
  describe(out, "device", all, [](const CallSignature& s) { return s.device; });
  describe(out, "numel", all, [](const CallSignature& s) { return s.numel; });
  describe(
      out, "shape", all, [](const CallSignature& s) { return s.shape_hash; },
      [](const CallSignature& s) { return std::string(s.shape); });
  describe(out, "tensor count", all, [](const CallSignature& s) { return s.ntensors; });
  describe(out, "tensor sizes (hash)", all, [](const CallSignature& s) { return s.layout_hash; });
  describe(out, "name (hash)", all, [](const CallSignature& s) { return s.name_hash; });
  throw MismatchError(out.str());
}

}  // namespace hvdc
