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
#include "hvdc/elementwise/sparse.h"
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

// Element i of device memory `data` (a dtype of sparse_load) as float32, read through the device's copies.
float value_at(DeviceTable& dev, const void* data, DType dtype, int64_t i) {
  const size_t esize = dtype_size(dtype);
  alignas(8) uint8_t host[8] = {};
  const uint8_t* at = stage_out(dev, host, static_cast<const uint8_t*>(data) + i * esize, esize);
  dev.wait();
  return sparse_load(at, dtype, 0);
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

std::string sparse_check_input(const TensorView& buffer, const TensorView& error, const TensorView& velocity,
                               const SparseSpec& spec, DeviceTable* device) {
  DeviceTable& dev = device ? *device : cpu_device(KernelChoice::kAuto);
  const Device here = dev.device_type();
  const std::string on = here == Device::kCPU ? "on the CPU" : "on the CUDA device";
  const std::string what = std::string("allreduce(compression=") + sparse_kind_name(spec.kind) + "): ";
  const auto kind = static_cast<int32_t>(spec.kind);
  if (kind < 1 || kind > 4) return "allreduce: unknown compression kind " + std::to_string(kind);
  if (spec.op != ReduceOp::kSum && spec.op != ReduceOp::kAverage)
    return what + "compression applies to op=Average or Sum only (Adasum and the 1-bit algorithms "
                  "compress their own way), got op " + std::to_string(static_cast<int>(spec.op));
  if (buffer.dtype == DType::kUInt8) return what + "tensor dtype uint8 is not supported; use a float type";
  if (buffer.device != here) return what + "tensors must be " + on;
  if (!sparse(spec.kind)) {
    const int64_t i = dev.sparse_first_nonfinite(buffer.data, buffer.dtype, nullptr, nullptr, 0.0f, buffer.numel);
    if (i >= 0)
      return what + "non-finite input: element " + std::to_string(i) + " is " +
             describe_value(value_at(dev, buffer.data, buffer.dtype, i));
    return "";
  }
  if (!(spec.ratio > 0.0 && spec.ratio <= 1.0)) {
    char r[32];
    std::snprintf(r, sizeof(r), "%g", spec.ratio);
    return what + "ratio must be in (0, 1], got " + r;
  }
  if (buffer.numel > static_cast<int64_t>(UINT32_MAX))
    return what + "at most 2^32 - 1 elements (indices are uint32); split the tensor";
  if (error.dtype != DType::kFloat32 || error.device != here)
    return what + "error buffer must be float32 " + on + ", got " + dtype_name(error.dtype);
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
    if (velocity.dtype != DType::kFloat32 || velocity.device != here || velocity.data == nullptr)
      return what + "momentum " + m + " needs a float32 velocity buffer " + on;
    if (velocity.numel != buffer.numel)
      return what + "velocity buffer has " + std::to_string(velocity.numel) + " elements, expected " +
             std::to_string(buffer.numel) + " (the tensor's numel)";
  }
  const auto* e = static_cast<const float*>(error.data);
  const auto* u = dgc ? static_cast<const float*>(velocity.data) : nullptr;
  const auto mu = static_cast<float>(spec.momentum);
  const int64_t i = dev.sparse_first_nonfinite(buffer.data, buffer.dtype, e, u, mu, buffer.numel);
  if (i < 0) return "";
  const float xi = value_at(dev, buffer.data, buffer.dtype, i);
  const float ei = value_at(dev, e, DType::kFloat32, i);
  return what + "non-finite input: element " + std::to_string(i) + " is " +
         (!std::isfinite(xi) ? describe_value(xi)
          : u ? describe_value(xi) + " + momentum * velocity " +
                    describe_value(value_at(dev, u, DType::kFloat32, i)) + " + accumulator " + describe_value(ei)
              : describe_value(xi) + " + error " + describe_value(ei)) +
         "; state unchanged";
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

int64_t sparse_total_k(int64_t numel, const SparseSpec& spec) {
  const std::vector<int64_t> whole{numel};
  int64_t k = 0;
  for (int64_t m : spec.segments.empty() ? whole : spec.segments) k += sparse_k(m, spec.ratio);
  return k;
}

bool topk_sends_dense(int64_t numel, const SparseSpec& spec, int n) {
  return spec.kind == SparseKind::kTopK && sparse_total_k(numel, spec) * n >= numel;
}

void sparse_allreduce(Communicator& comm, const TensorView& buffer, const TensorView& error,
                      const TensorView& velocity, const SparseSpec& spec) {
  const std::string why = sparse_check_input(buffer, error, velocity, spec);
  if (!why.empty()) throw UsageError(why);
  sparse_allreduce_prepared(comm, buffer, error, velocity, spec);
}

namespace {

// The kinds whose whole buffer is the payload (16-bit wire, a top-k that sends every element) on a
// device: the buffers are copied to the host and back and reduced there by the CPU's path.
void dense_through_host(Communicator& comm, DeviceTable& dev, const TensorView& buffer, const TensorView& error,
                        const TensorView& velocity, const SparseSpec& spec) {
  const bool ef = sparse(spec.kind), dgc = ef && spec.momentum != 0.0;
  HostCopy b(dev, buffer.data, buffer.nbytes());
  HostCopy e(dev, ef ? error.data : nullptr, ef ? error.nbytes() : 0);
  HostCopy u(dev, dgc ? velocity.data : nullptr, dgc ? velocity.nbytes() : 0);
  TensorView hb = buffer, he = error, hu = velocity;
  hb.data = b.get();
  he.data = e.get();
  hu.data = u.get();
  for (TensorView* t : {&hb, &he, &hu}) t->device = Device::kCPU;
  sparse_allreduce_prepared(comm, hb, he, hu, spec, nullptr);
  b.write_back();
  e.write_back();
  u.write_back();
}

}  // namespace

void sparse_allreduce_prepared(Communicator& comm, const TensorView& buffer, const TensorView& error,
                               const TensorView& velocity, const SparseSpec& spec, DeviceTable* device) {
  const int64_t numel = buffer.numel;
  if (numel == 0) return;
  DeviceTable& dev = device ? *device : cpu_device(KernelChoice::kAuto);
  const int n = comm.size();
  if (!dev.host_memory() && (!sparse(spec.kind) || topk_sends_dense(numel, spec, n)))
    return dense_through_host(comm, dev, buffer, error, velocity, spec);
  if (!sparse(spec.kind))
    return half_wire_allreduce(comm, buffer, spec.kind == SparseKind::kFloat16 ? DType::kFloat16 : DType::kBFloat16,
                               spec.op);
  // c = x + e, the compensated value; it becomes the new error once the sent elements are cut out.
  // DGC (momentum > 0, top-k): u = mu * u + x, then c = e + u, in the same pass.
  auto* e = static_cast<float*>(error.data);
  float* u = spec.momentum != 0.0 ? static_cast<float*>(velocity.data) : nullptr;
  dev.sparse_compensate(buffer.data, buffer.dtype, e, u, static_cast<float>(spec.momentum), numel);
  const float* c = e;
  if (topk_sends_dense(numel, spec, n)) {  // on host memory (above)
    std::vector<float> out(c, c + numel);
    chunked_allreduce(comm, out.data(), numel, DType::kFloat32, spec.op);
    std::fill(e, e + numel, 0.0f);  // every element was sent
    if (u && spec.momentum_masking) std::fill(u, u + numel, 0.0f);
    from_float(out.data(), buffer);
    return;
  }
  // The same count on every rank: numel and segments agreed.
  const int64_t k = sparse_total_k(numel, spec);
  const bool host = dev.host_memory();
  const size_t kb = static_cast<size_t>(k) * 4;
  DeviceBuffer idx(dev, kb), vals(dev, kb), out(dev, static_cast<size_t>(numel) * 4);
  auto* idx_d = reinterpret_cast<uint32_t*>(idx.get());
  auto* vals_d = reinterpret_cast<float*>(vals.get());
  auto* out_d = reinterpret_cast<float*>(out.get());
  dev.sparse_select(c, numel, spec, idx_d, vals_d);
  // Only the payload crosses to the host: this rank's k values (and, for top-k, their indices).
  const bool topk = spec.kind == SparseKind::kTopK;
  HostStaging idx_h(dev, host || !topk ? 0 : kb), vals_h(dev, host ? 0 : kb);
  const uint8_t* hi = topk ? stage_out(dev, idx_h.get(), idx.get(), kb) : nullptr;
  const uint8_t* hv = stage_out(dev, vals_h.get(), vals.get(), kb);
  dev.wait();
  if (topk) {
    const size_t all_bytes = sizeof(Pair) * static_cast<size_t>(k) * n;
    std::vector<Pair> send(static_cast<size_t>(k));
    for (int64_t j = 0; j < k; ++j) {
      std::memcpy(&send[j].index, hi + 4 * j, 4);
      std::memcpy(&send[j].value, hv + 4 * j, 4);
    }
    HostStaging all(dev, all_bytes);
    comm.allgather(send.data(), all.get(), static_cast<size_t>(k) * sizeof(Pair));
    DeviceBuffer all_d(dev, host ? 0 : all_bytes);
    dev.sparse_sum_pairs(stage_in(dev, all_d.get(), all.get(), all_bytes), n, k, out_d, numel);
    dev.wait();  // before `all` goes back
  } else {
    HostStaging sum(dev, kb);
    std::memcpy(sum.get(), hv, kb);
    comm.allreduce_sum(sum.get(), k, DType::kFloat32);
    DeviceBuffer sum_d(dev, host ? 0 : kb);
    dev.sparse_place(idx_d, reinterpret_cast<const float*>(stage_in(dev, sum_d.get(), sum.get(), kb)), k, out_d,
                     numel);
    dev.wait();  // before `sum` goes back
  }
  // Average: the sum divided by n (zeros stay zeros). What this rank sent leaves the error: e = c - sent,
  // exactly 0 at the sent elements; DGC's momentum factor masking zeroes the velocity at the same (this rank's
  // selected) elements.
  const float divisor = spec.op == ReduceOp::kAverage && n > 1 ? static_cast<float>(n) : 1.0f;
  dev.sparse_finish(out_d, divisor, buffer.data, buffer.dtype, numel, idx_d, k, e,
                    u && spec.momentum_masking ? u : nullptr);
  dev.wait();  // the caller reads the buffers next
}

}  // namespace hvdc
