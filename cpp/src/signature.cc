#include "hvdc/signature.h"

#include <algorithm>
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
template <typename Item, typename Key, typename Show>
void describe(std::ostringstream& out, const char* field, const std::vector<Item>& all, Key key,
              Show show) {
  bool differs = false;
  for (const auto& s : all) differs |= key(s) != key(all[0]);
  if (!differs) return;
  out << "\n  " << field << ":";
  for (size_t r = 0; r < all.size(); ++r) out << " rank " << r << "=" << show(all[r]) << ";";
}

template <typename Item, typename Get>
void describe(std::ostringstream& out, const char* field, const std::vector<Item>& all, Get get) {
  describe(out, field, all, get, get);
}

}  // namespace

namespace {

// Each rank's name in the second exchange of a mismatch, cut to fit.
constexpr size_t kNameBytes = 2048;

// "allreduce of float32 [4, 5]": what the call moves, for a warning.
std::string call_text(const CallSignature& sig) {
  std::string shape(sig.shape, strnlen(sig.shape, sizeof(sig.shape)));
  std::string out = collective_name(sig.collective);
  if (sig.collective != kJoin && sig.collective != kInit)
    out += std::string(" of ") + dtype_name(DType(sig.dtype)) + " " + shape;
  return out;
}

// The "key=value" lines of a name's details, in order (a line without '=' is a key with no value).
std::vector<std::pair<std::string, std::string>> detail_fields(const std::string& details) {
  std::vector<std::pair<std::string, std::string>> fields;
  std::istringstream in(details);
  for (std::string line; std::getline(in, line);) {
    if (line.empty()) continue;
    const size_t eq = line.find('=');
    fields.emplace_back(line.substr(0, eq), eq == std::string::npos ? "" : line.substr(eq + 1));
  }
  return fields;
}

// The ranks' names (a second exchange: every rank is here, since every rank found the same mismatch),
// as lines of `out`: the shown names where they differ, then each detail that every rank's name has and
// that differs, with every rank's value, then the keys of the details only some have. Returns false
// when nothing could be told apart (the differing part was cut off).
bool describe_names(std::ostringstream& out, Communicator& comm, const std::string& what, double timeout_s) {
  std::vector<char> mine(kNameBytes, '\0');
  std::memcpy(mine.data(), what.data(), std::min(what.size(), kNameBytes - 1));
  std::vector<char> all(kNameBytes * comm.size());
  comm.allgather_timed(mine.data(), all.data(), kNameBytes, timeout_s);
  std::vector<CallName> names;
  std::vector<std::vector<std::pair<std::string, std::string>>> fields;
  for (int r = 0; r < comm.size(); ++r) {
    const char* text = all.data() + kNameBytes * r;
    names.push_back(split_call_name(std::string(text, strnlen(text, kNameBytes - 1))));
    fields.push_back(detail_fields(names.back().details));
  }
  const size_t before = out.str().size();
  describe(out, "name", names, [](const CallName& n) { return n.shown; });
  std::vector<std::string> keys;  // every rank's keys, in the order they first appear
  for (const auto& f : fields)
    for (const auto& kv : f)
      if (std::find(keys.begin(), keys.end(), kv.first) == keys.end()) keys.push_back(kv.first);
  // A detail that some ranks' calls lack (calls of different ops, whose options differ in kind) is
  // named once, after those every rank has: listing each with its values would bury the op that differs.
  std::string partial;
  for (const std::string& key : keys) {
    std::vector<std::string> values;
    bool everywhere = true;
    for (const auto& f : fields) {
      const auto it = std::find_if(f.begin(), f.end(), [&](const auto& kv) { return kv.first == key; });
      everywhere &= it != f.end();
      values.push_back(it == f.end() ? "" : it->second);
    }
    if (everywhere)
      describe(out, key.c_str(), values, [](const std::string& v) { return v; });
    else
      partial += (partial.empty() ? "" : ", ") + key;
  }
  if (!partial.empty()) out << "\n  details only some ranks' calls have: " << partial;
  return out.str().size() > before;
}

}  // namespace

const char* collective_name(int32_t c) {
  switch (c) {
    case kAllreduce: return "allreduce";
    case kBroadcast: return "broadcast";
    case kAdasum: return "Adasum allreduce";
    case kCompressedAllreduce: return "1-bit compressed allreduce";
    case kInit: return "start-up exchange";
    case kAllgather: return "allgather";
    case kMaskedAllreduce: return "masked allreduce";
    case kSparseAllreduce: return "sparse allreduce";
    case kHierarchicalCompressedAllreduce: return "hierarchical 1-bit allreduce";
    case kMaskedGather: return "masked gather";
    case kJoin: return "join";
    case kBlockQuantAllreduce: return "block-quantized allreduce";
    default: return "collective";
  }
}

CallName split_call_name(const std::string& name) {
  const size_t bar = name.find('|');
  if (bar == std::string::npos) return {name, ""};
  return {name.substr(0, bar), name.substr(bar + 1)};
}

void agree_on_signature(Communicator& comm, const CallSignature& sig, const JoinWait& wait,
                        const std::string& what_in) {
  const std::string what = split_call_name(what_in).shown;
  std::vector<CallSignature> all(comm.size());
  // A rank that has not joined after wait.warn_every_s: say so on this rank, and again at that
  // interval, naming the call and the ranks missing (a rank busy elsewhere, such as rank 0 alone
  // evaluating or checkpointing, joins late; one that exited is named at once by its goodbye).
  Communicator::JoinWatch join;
  join.every_s = wait.warn_every_s;
  join.report = [&](double waited_s, const std::vector<int>& missing) {
    char head[96];
    std::snprintf(head, sizeof head, "hvd_compress: rank %d has waited %.0f s in ", comm.rank(), waited_s);
    char tail[160];
    std::snprintf(tail, sizeof tail, "HVDC_TIMEOUT=%.0f s; HVDC_STALL_WARNING=%.0f s sets how often this repeats",
                  wait.timeout_s, wait.warn_every_s);
    const std::string message =
        head + what + " (" + call_text(sig) + ") for " + rank_list(missing) +
        " to join it. Still waiting: a rank busy elsewhere (evaluation, checkpointing) joins late; it raises "
        "CommTimeoutError after " + (wait.timeout_s > 0 ? tail : std::string("never (HVDC_TIMEOUT <= 0)")) + ".";
    if (wait.warn) {
      wait.warn(message);
    } else {
      std::fprintf(stderr, "%s\n", message.c_str());
      std::fflush(stderr);
    }
  };
  try {  // a rank that never joins: the error names the collective this rank waited in
    comm.allgather_timed(&sig, all.data(), sizeof(CallSignature), wait.timeout_s, join);
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
  bool names_differ = false;
  for (const auto& s : all) names_differ |= s.name_hash != all[0].name_hash;
  if (names_differ && !describe_names(out, comm, what_in, wait.timeout_s))
    describe(out, "name (hash)", all, [](const CallSignature& s) { return s.name_hash; });
  throw MismatchError(out.str());
}

}  // namespace hvdc
