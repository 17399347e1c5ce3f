#include "hvdc/sparse_allreduce.h"
// No contraction into FMAs: DGC's velocity u = mu * u + x is two float32 roundings, as in the NumPy
// reference (hvd_compress/reference/compression.py).
#pragma GCC optimize("fp-contract=off")

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "hvdc/cast.h"
#include "hvdc/errors.h"
#include "hvdc/philox.h"

namespace hvdc {
namespace {

// One top-k pair on the wire: 8 bytes, index first (little-endian words, as every rank is).
struct Pair {
  uint32_t index;
  float value;
};
static_assert(sizeof(Pair) == 8, "a top-k pair is 8 bytes on the wire");

// The buffer as float32 (float64 is rounded, half widened exactly).
void to_float(const TensorView& t, float* dst) {
  switch (t.dtype) {
    case DType::kFloat32: std::memcpy(dst, t.data, t.nbytes()); return;
    case DType::kFloat64: {
      const auto* s = static_cast<const double*>(t.data);
      for (int64_t i = 0; i < t.numel; ++i) dst[i] = static_cast<float>(s[i]);
      return;
    }
    default: widen_to_float(t.data, t.dtype, dst, t.numel);
  }
}

// float32 values into the buffer's dtype.
void from_float(const float* src, const TensorView& t) {
  switch (t.dtype) {
    case DType::kFloat32: std::memcpy(t.data, src, t.nbytes()); return;
    case DType::kFloat64: {
      auto* d = static_cast<double*>(t.data);
      for (int64_t i = 0; i < t.numel; ++i) d[i] = src[i];
      return;
    }
    default: narrow_from_float(src, 1.0f, t.data, t.dtype, t.numel);
  }
}

std::string describe_value(float v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  char out[32];  // short: the message travels in the signature's error field
  std::snprintf(out, sizeof(out), "%.6g", static_cast<double>(v));
  return out;
}

bool sparse(SparseKind kind) { return kind == SparseKind::kTopK || kind == SparseKind::kRandomK; }

// Indices (ascending) of the k smallest keys, ties to the lower index: the k-th smallest key found by
// nth_element on a copy, then one ordered scan takes every key below it and the first ones equal to it
// (select_keeps, the rule the CUDA kernels apply too).
void select_smallest(const std::vector<uint32_t>& keys, int64_t k, uint32_t* idx) {
  using Key = uint32_t;
  const auto numel = static_cast<int64_t>(keys.size());
  if (k <= 0) return;
  if (k >= numel) {
    for (int64_t i = 0; i < numel; ++i) idx[i] = static_cast<uint32_t>(i);
    return;
  }
  std::vector<Key> copy(keys);
  std::nth_element(copy.begin(), copy.begin() + (k - 1), copy.end());
  const Key threshold = copy[static_cast<size_t>(k - 1)];
  int64_t below = 0;
  for (const Key& v : keys) below += v < threshold;
  const int64_t equal_left = k - below;
  int64_t equal_before = 0, out = 0;
  for (int64_t i = 0; i < numel && out < k; ++i) {
    const Key v = keys[static_cast<size_t>(i)];
    if (select_keeps(v, threshold, equal_before, equal_left)) idx[out++] = static_cast<uint32_t>(i);
    equal_before += v == threshold;
  }
}

// `x` (float32, numel) becomes its reduction over the ranks: cut into n chunks of C = ceil(numel / n)
// (the last padded with zeros that are never data), chunk j goes to rank j by alltoall as `wire`
// (float32, or 16-bit: each rank's values rounded once), rank j sums its n chunks in float32 in rank order
// (from 0, as the top-k pairs are added), divides by n for Average, rounds the sum to `wire` once, and the
// chunks are allgathered. 2 (n - 1) C wire elements per rank; identical bits on every rank.
void chunked_allreduce(Communicator& comm, float* x, int64_t numel, DType wire, ReduceOp op) {
  const int n = comm.size();
  const int64_t chunk = (numel + n - 1) / n;
  const size_t width = wire == DType::kFloat32 ? 4 : 2;
  const auto to_wire = [&](const float* src, void* dst, int64_t count) {
    if (wire == DType::kFloat32)
      std::memcpy(dst, src, static_cast<size_t>(count) * 4);
    else
      narrow_from_float(src, 1.0f, dst, wire, count);
  };
  const auto from_wire = [&](const void* src, float* dst, int64_t count) {
    if (wire == DType::kFloat32)
      std::memcpy(dst, src, static_cast<size_t>(count) * 4);
    else
      widen_to_float(src, wire, dst, count);
  };
  std::vector<uint8_t> send(static_cast<size_t>(chunk * n) * width, 0), recv(send.size());
  to_wire(x, send.data(), numel);
  comm.alltoall(send.data(), recv.data(), static_cast<size_t>(chunk) * width);
  // recv block r: rank r's values of my chunk.
  std::vector<float> sum(static_cast<size_t>(chunk), 0.0f), part(static_cast<size_t>(chunk));
  for (int r = 0; r < n; ++r) {
    from_wire(recv.data() + static_cast<size_t>(r * chunk) * width, part.data(), chunk);
    for (int64_t i = 0; i < chunk; ++i) sum[i] += part[i];
  }
  if (op == ReduceOp::kAverage && n > 1)
    for (float& v : sum) v /= static_cast<float>(n);
  std::vector<uint8_t> mine(static_cast<size_t>(chunk) * width);
  to_wire(sum.data(), mine.data(), chunk);
  comm.allgather(mine.data(), recv.data(), static_cast<size_t>(chunk) * width);
  from_wire(recv.data(), x, numel);  // padding (beyond numel) is never read
}

// Kinds 1 and 2 (see the header).
void half_wire_allreduce(Communicator& comm, const TensorView& buffer, DType wire, ReduceOp op) {
  std::vector<float> x(static_cast<size_t>(buffer.numel));
  to_float(buffer, x.data());
  chunked_allreduce(comm, x.data(), buffer.numel, wire, op);
  from_float(x.data(), buffer);
}

}  // namespace

const char* sparse_kind_name(SparseKind kind) {
  switch (kind) {
    case SparseKind::kFloat16: return "fp16";
    case SparseKind::kBFloat16: return "bf16";
    case SparseKind::kTopK: return "topk";
    case SparseKind::kRandomK: return "randomk";
  }
  return "unknown";
}

int64_t sparse_k(int64_t numel, double ratio) {
  if (numel <= 0) return 0;
  const double k = std::floor(ratio * static_cast<double>(numel) + 0.5);
  return std::clamp<int64_t>(static_cast<int64_t>(std::min(k, 9.0e18)), 1, numel);
}

std::string sparse_check_input(const TensorView& buffer, const TensorView& error, const TensorView& velocity,
                               const SparseSpec& spec) {
  const std::string what = std::string("allreduce(compression=") + sparse_kind_name(spec.kind) + "): ";
  const auto kind = static_cast<int32_t>(spec.kind);
  if (kind < 1 || kind > 4) return "allreduce: unknown compression kind " + std::to_string(kind);
  if (spec.op != ReduceOp::kSum && spec.op != ReduceOp::kAverage)
    return what + "compression applies to op=Average or Sum only (Adasum and the 1-bit algorithms "
                  "compress their own way), got op " + std::to_string(static_cast<int>(spec.op));
  if (buffer.dtype == DType::kUInt8) return what + "tensor dtype uint8 is not supported; use a float type";
  if (buffer.device != Device::kCPU) return what + "tensors must be on the CPU";
  if (!sparse(spec.kind)) {
    std::vector<float> x(static_cast<size_t>(buffer.numel));
    to_float(buffer, x.data());
    for (int64_t i = 0; i < buffer.numel; ++i)
      if (!std::isfinite(x[i]))
        return what + "non-finite input: element " + std::to_string(i) + " is " + describe_value(x[i]);
    return "";
  }
  if (!(spec.ratio > 0.0 && spec.ratio <= 1.0)) {
    char r[32];
    std::snprintf(r, sizeof(r), "%g", spec.ratio);
    return what + "ratio must be in (0, 1], got " + r;
  }
  if (buffer.numel > static_cast<int64_t>(UINT32_MAX))
    return what + "at most 2^32 - 1 elements (indices are uint32); split the tensor";
  if (error.dtype != DType::kFloat32 || error.device != Device::kCPU)
    return what + "error buffer must be float32 on the CPU, got " + dtype_name(error.dtype);
 {
    int64_t total = 0;
    bool negative = false;
    for (int64_t m : spec.segments) {
      negative |= m < 0;
      total += m;
    }
    if (!spec.segments.empty() && (negative || total != buffer.numel))
      return what + "tensor sizes (" + std::to_string(spec.segments.size()) + " tensors, " + std::to_string(total) +
             " elements) do not cut the buffer of " + std::to_string(buffer.numel) + " elements";
  }
  if (error.numel != buffer.numel)
    return what + "error buffer has " + std::to_string(error.numel) + " elements, expected " +
           std::to_string(buffer.numel) + " (the tensor's numel)";
  const bool dgc = spec.momentum != 0.0;
  if (dgc) {
    char m[32];
    std::snprintf(m, sizeof(m), "%g", spec.momentum);
    if (spec.kind != SparseKind::kTopK) return what + "momentum correction applies to top-k only, got momentum " + m;
    if (!(spec.momentum > 0.0 && spec.momentum < 1.0)) return what + "momentum must be in [0, 1), got " + m;
    if (velocity.dtype != DType::kFloat32 || velocity.device != Device::kCPU || velocity.data == nullptr)
      return what + "momentum " + m + " needs a float32 velocity buffer on the CPU";
    if (velocity.numel != buffer.numel)
      return what + "velocity buffer has " + std::to_string(velocity.numel) + " elements, expected " +
             std::to_string(buffer.numel) + " (the tensor's numel)";
  }
  std::vector<float> x(static_cast<size_t>(buffer.numel));
  to_float(buffer, x.data());
  const auto* e = static_cast<const float*>(error.data);
  const auto* u = dgc ? static_cast<const float*>(velocity.data) : nullptr;
  const auto mu = static_cast<float>(spec.momentum);
  for (int64_t i = 0; i < buffer.numel; ++i) {
    const float g = u ? mu * u[i] + x[i] : x[i];  // what enters the error (DGC: the new velocity)
    const float c = g + e[i];
    if (!std::isfinite(c))
      return what + "non-finite input: element " + std::to_string(i) + " is " +
             (!std::isfinite(x[i]) ? describe_value(x[i])
              : u ? describe_value(x[i]) + " + momentum * velocity " + describe_value(u[i]) + " + accumulator " +
                        describe_value(e[i])
                  : describe_value(x[i]) + " + error " + describe_value(e[i])) +
             "; state unchanged";
  }
  return "";
}

void topk_select(const float* c, int64_t numel, int64_t k, uint32_t* idx) {
  // Largest |c| first = smallest key; -0.0 and 0.0 have one key, as the reference's -|c| compare equal.
  std::vector<uint32_t> keys(static_cast<size_t>(numel));
  for (int64_t i = 0; i < numel; ++i) keys[i] = topk_key(c[i]);
  select_smallest(keys, k, idx);
}

void randomk_select(int64_t numel, int64_t k, uint64_t seed, uint32_t step, uint32_t* idx, uint64_t offset) {
  std::vector<uint32_t> words(static_cast<size_t>(numel));
  philox_fill_u32(randomk_philox_key(seed, step), offset, numel, words.data());  // word i = philox_word(key, offset + i)
  select_smallest(words, k, idx);
}

void sparse_select(const float* c, int64_t numel, const SparseSpec& spec, std::vector<uint32_t>& idx) {
  const std::vector<int64_t> whole{numel};
  const std::vector<int64_t>& segments = spec.segments.empty() ? whole : spec.segments;
  idx.clear();
  int64_t offset = 0;
  for (int64_t m : segments) {
    const int64_t k = sparse_k(m, spec.ratio);
    const size_t at = idx.size();
    idx.resize(at + static_cast<size_t>(k));
    if (spec.kind == SparseKind::kTopK)
      topk_select(c + offset, m, k, idx.data() + at);
    else
      randomk_select(m, k, spec.seed, spec.step, idx.data() + at, static_cast<uint64_t>(offset));
    for (size_t j = at; j < idx.size(); ++j) idx[j] += static_cast<uint32_t>(offset);
    offset += m;
  }
}

bool topk_sends_dense(int64_t numel, const SparseSpec& spec, int n) {
  if (spec.kind != SparseKind::kTopK) return false;
  const std::vector<int64_t> whole{numel};
  int64_t k = 0;
  for (int64_t m : spec.segments.empty() ? whole : spec.segments) k += sparse_k(m, spec.ratio);
  return k * n >= numel;
}

void sparse_allreduce(Communicator& comm, const TensorView& buffer, const TensorView& error,
                      const TensorView& velocity, const SparseSpec& spec) {
  const std::string why = sparse_check_input(buffer, error, velocity, spec);
  if (!why.empty()) throw UsageError(why);
  sparse_allreduce_prepared(comm, buffer, error, velocity, spec);
}

void sparse_allreduce_prepared(Communicator& comm, const TensorView& buffer, const TensorView& error,
                               const TensorView& velocity, const SparseSpec& spec) {
  const int64_t numel = buffer.numel;
  if (numel == 0) return;
  if (!sparse(spec.kind))
    return half_wire_allreduce(comm, buffer, spec.kind == SparseKind::kFloat16 ? DType::kFloat16 : DType::kBFloat16,
                               spec.op);
  const int n = comm.size();
  // c = x + e, the compensated value; it becomes the new error once the sent elements are cut out.
  // DGC (momentum > 0, top-k): u = mu * u + x, then c = e + u, in the same pass.
  auto* e = static_cast<float*>(error.data);
  std::vector<float> x(static_cast<size_t>(numel));
  to_float(buffer, x.data());
  float* u = spec.momentum != 0.0 ? static_cast<float*>(velocity.data) : nullptr;
  if (u) {
    const auto mu = static_cast<float>(spec.momentum);
    for (int64_t i = 0; i < numel; ++i) {
      u[i] = mu * u[i] + x[i];
      e[i] += u[i];
    }
  } else {
    for (int64_t i = 0; i < numel; ++i) e[i] += x[i];
  }
  const float* c = e;
  if (topk_sends_dense(numel, spec, n)) {
    std::vector<float> out(c, c + numel);
    chunked_allreduce(comm, out.data(), numel, DType::kFloat32, spec.op);
    std::fill(e, e + numel, 0.0f);  // every element was sent
    if (u && spec.momentum_masking) std::fill(u, u + numel, 0.0f);
    from_float(out.data(), buffer);
    return;
  }
  std::vector<uint32_t> idx;
  sparse_select(c, numel, spec, idx);  // the same count on every rank: numel and segments agreed
  const auto k = static_cast<int64_t>(idx.size());
  std::vector<float> out(static_cast<size_t>(numel), 0.0f);
  if (spec.kind == SparseKind::kTopK) {
    std::vector<Pair> send(static_cast<size_t>(k)), all(static_cast<size_t>(k) * n);
    for (int64_t j = 0; j < k; ++j) send[j] = Pair{idx[j], c[idx[j]]};
    comm.allgather(send.data(), all.data(), static_cast<size_t>(k) * sizeof(Pair));
    for (const Pair& p : all) out[p.index] += p.value;  // rank order, then index order
  } else {
    std::vector<float> vals(static_cast<size_t>(k));
    for (int64_t j = 0; j < k; ++j) vals[j] = c[idx[j]];
    comm.allreduce_sum(vals.data(), k, DType::kFloat32);
    for (int64_t j = 0; j < k; ++j) out[idx[j]] = vals[j];
  }
  if (spec.op == ReduceOp::kAverage && n > 1)
    for (float& v : out) v /= static_cast<float>(n);  // zeros stay zeros
  // What this rank sent leaves the error: e = c - sent, exactly 0 at the sent elements; DGC's momentum
  // factor masking zeroes the velocity at the same (this rank's selected) elements.
  for (int64_t j = 0; j < k; ++j) e[idx[j]] = 0.0f;
  if (u && spec.momentum_masking)
    for (int64_t j = 0; j < k; ++j) u[idx[j]] = 0.0f;
  from_float(out.data(), buffer);
}

}  // namespace hvdc
