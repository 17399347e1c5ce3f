// Random-k masks and the compaction kernels (hvdc/masks.h).
#include "hvdc/masks.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <mutex>

#include "hvdc/philox.h"

namespace hvdc {
namespace {

constexpr int64_t kMaxCyclicNumel = int64_t{1} << 32;  // ranks are kept as uint32

// Chunks of a cyclic mask: nc = int(1 / ratio) (at least 1), cs = ceil(numel / nc).
int64_t cyclic_chunks(double ratio) {
  // 1 / ratio computed as Python's int(1 / k) computes it (double division, truncation).
  return std::max<int64_t>(1, static_cast<int64_t>(1.0 / ratio));
}

// Position of every element in the permutation (the inverse of pi), by a stable LSD radix sort of
// the Philox words: three passes of 11 bits over (word, index) pairs that start in index order.
std::vector<uint32_t> permutation_ranks(int64_t numel, uint64_t seed) {
  const size_t n = static_cast<size_t>(numel);
  std::vector<uint32_t> words(n), order(n), next_order(n), next_words(n);
  PhiloxKey key;
  key.seed = seed;
  key.step = 0;
  key.stream = kMaskPermutationStream;
  philox_fill_u32(key, 0, numel, words.data());
  for (size_t i = 0; i < n; ++i) order[i] = static_cast<uint32_t>(i);
  constexpr int kBits = 11;
  constexpr uint32_t kBuckets = 1u << kBits;
  for (int shift = 0; shift < 32; shift += kBits) {
    std::vector<size_t> count(kBuckets + 1, 0);
    for (size_t i = 0; i < n; ++i) ++count[((words[i] >> shift) & (kBuckets - 1)) + 1];
    for (uint32_t b = 0; b < kBuckets; ++b) count[b + 1] += count[b];
    for (size_t i = 0; i < n; ++i) {
      const size_t at = count[(words[i] >> shift) & (kBuckets - 1)]++;
      next_order[at] = order[i];
      next_words[at] = words[i];
    }
    order.swap(next_order);
    words.swap(next_words);
  }
  std::vector<uint32_t> rank(n);
  for (size_t j = 0; j < n; ++j) rank[order[j]] = static_cast<uint32_t>(j);
  return rank;
}

// The ranks of the last (numel, seed) asked for: SLAMB asks for the same one every step.
struct RankCache {
  std::mutex mu;
  int64_t numel = -1;
  uint64_t seed = 0;
  std::shared_ptr<const std::vector<uint32_t>> ranks;
};

std::shared_ptr<const std::vector<uint32_t>> cached_ranks(int64_t numel, uint64_t seed) {
  static RankCache cache;
  {
    const std::lock_guard<std::mutex> lock(cache.mu);
    if (cache.ranks && cache.numel == numel && cache.seed == seed) return cache.ranks;
  }
  // Computed outside the lock (it can take a while); two threads racing both compute it.
  auto ranks = std::make_shared<const std::vector<uint32_t>>(permutation_ranks(numel, seed));
  const std::lock_guard<std::mutex> lock(cache.mu);
  cache.numel = numel;
  cache.seed = seed;
  cache.ranks = ranks;
  return ranks;
}

void cyclic_mask(const MaskSpec& s, uint8_t* out) {
  const int64_t nc = cyclic_chunks(s.ratio);
  const int64_t cs = (s.numel + nc - 1) / nc;
  const int64_t lo = (s.step % nc) * cs;
  const int64_t len = std::max<int64_t>(0, std::min(cs, s.numel - lo));
  if (len == 0) {
    std::memset(out, 0, static_cast<size_t>(s.numel));
    return;
  }
  const auto ranks = cached_ranks(s.numel, s.seed);
  const uint32_t* r = ranks->data();
  const uint32_t base = static_cast<uint32_t>(lo), width = static_cast<uint32_t>(len);
  // One streaming compare (unsigned wrap-around makes it one test): vectorizes.
  for (int64_t i = 0; i < s.numel; ++i) out[i] = static_cast<uint8_t>(r[i] - base < width);
}

void bernoulli_mask(const MaskSpec& s, uint8_t* out) {
  PhiloxKey key;
  key.seed = s.seed;
  key.step = static_cast<uint32_t>(s.step);
  key.stream = kMaskBernoulliStream;
  const float k = static_cast<float>(s.ratio);
  constexpr int64_t kBlock = 4096;
  float u[kBlock];
  for (int64_t at = 0; at < s.numel; at += kBlock) {
    const int64_t len = std::min(kBlock, s.numel - at);
    philox_fill_uniform(key, static_cast<uint64_t>(at), len, u);
    for (int64_t i = 0; i < len; ++i) out[at + i] = static_cast<uint8_t>(u[i] < k);
  }
}

// Sum of 8 mask bytes that are each 0 or 1.
inline int bytes_set(const uint8_t* m) {
  uint64_t w;
  std::memcpy(&w, m, sizeof w);
  return static_cast<int>((w * 0x0101010101010101ull) >> 56);
}

constexpr int64_t kBlock = 64;

inline int block_count(const uint8_t* m) {
  int c = 0;
  for (int b = 0; b < kBlock; b += 8) c += bytes_set(m + b);
  return c;
}

// Per block of 64: nothing selected is skipped, everything selected is one copy, a mixed block is
// compacted without branches into a block on the stack (so no write runs past dst's end).
template <typename T>
int64_t gather_impl(const T* src, const uint8_t* mask, int64_t n, T* dst) {
  int64_t j = 0, i = 0;
  for (; i + kBlock <= n; i += kBlock) {
    const int c = block_count(mask + i);
    if (c == 0) continue;
    if (c == kBlock) {
      std::memcpy(dst + j, src + i, kBlock * sizeof(T));
    } else {
      T tmp[kBlock + 1];
      int k = 0;
      for (int b = 0; b < kBlock; ++b) {
        tmp[k] = src[i + b];
        k += mask[i + b];
      }
      std::memcpy(dst + j, tmp, static_cast<size_t>(c) * sizeof(T));
    }
    j += c;
  }
  for (; i < n; ++i)
    if (mask[i]) dst[j++] = src[i];
  return j;
}

template <typename T>
int64_t scatter_impl(const T* compact, const uint8_t* mask, int64_t n, T* dst) {
  int64_t j = 0, i = 0;
  for (; i + kBlock <= n; i += kBlock) {
    const int c = block_count(mask + i);
    if (c == 0) continue;
    if (c == kBlock) {
      std::memcpy(dst + i, compact + j, kBlock * sizeof(T));
    } else {
      T tmp[kBlock + 1];
      std::memcpy(tmp, compact + j, static_cast<size_t>(c) * sizeof(T));
      tmp[c] = T{};
      int k = 0;
      for (int b = 0; b < kBlock; ++b) {
        const uint8_t m = mask[i + b];
        dst[i + b] = m ? tmp[k] : dst[i + b];
        k += m;
      }
    }
    j += c;
  }
  for (; i < n; ++i)
    if (mask[i]) dst[i] = compact[j++];
  return j;
}

}  // namespace

std::string check_mask_spec(const MaskSpec& s) {
  if (!(s.ratio > 0.0 && s.ratio <= 1.0))
    return "mask ratio must be in (0, 1], got " + std::to_string(s.ratio);
  if (s.numel < 0) return "mask numel must be >= 0, got " + std::to_string(s.numel);
  if (s.step < 0) return "mask step must be >= 0, got " + std::to_string(s.step);
  if (s.kind != MaskKind::kCyclic && s.kind != MaskKind::kBernoulli)
    return "unknown mask kind " + std::to_string(static_cast<int>(s.kind)) +
           " (0: cyclic, 1: bernoulli)";
  if (s.kind == MaskKind::kCyclic && s.numel >= kMaxCyclicNumel)
    return "cyclic masks cover at most 2^32 - 1 elements, got " + std::to_string(s.numel);
  if (s.always.size() % 2 != 0) return "always-selected ranges must be (offset, length) pairs";
  for (size_t i = 0; i < s.always.size(); i += 2) {
    const int64_t off = s.always[i], len = s.always[i + 1];
    if (off < 0 || len < 0 || off > s.numel || len > s.numel - off)
      return "always-selected range (" + std::to_string(off) + ", " + std::to_string(len) +
             ") is outside [0, " + std::to_string(s.numel) + ")";
  }
  return "";
}

void random_mask(const MaskSpec& spec, uint8_t* out) {
  if (spec.numel <= 0) return;
  if (spec.kind == MaskKind::kBernoulli)
    bernoulli_mask(spec, out);
  else
    cyclic_mask(spec, out);
  for (size_t i = 0; i < spec.always.size(); i += 2)
    std::memset(out + spec.always[i], 1, static_cast<size_t>(spec.always[i + 1]));
}

std::vector<int64_t> cyclic_permutation(int64_t numel, uint64_t seed) {
  const std::vector<uint32_t> rank = permutation_ranks(numel, seed);
  std::vector<int64_t> pi(rank.size());
  for (size_t i = 0; i < rank.size(); ++i) pi[rank[i]] = static_cast<int64_t>(i);
  return pi;
}

int64_t mask_count(const uint8_t* mask, int64_t n) {
  int64_t c = 0, i = 0;
  for (; i + 8 <= n; i += 8) c += bytes_set(mask + i);
  for (; i < n; ++i) c += mask[i];
  return c;
}

int64_t mask_gather(const void* src, const uint8_t* mask, int64_t n, size_t elem, void* dst) {
  switch (elem) {
    case 2:
      return gather_impl(static_cast<const uint16_t*>(src), mask, n, static_cast<uint16_t*>(dst));
    case 4:
      return gather_impl(static_cast<const uint32_t*>(src), mask, n, static_cast<uint32_t*>(dst));
    case 8:
      return gather_impl(static_cast<const uint64_t*>(src), mask, n, static_cast<uint64_t*>(dst));
    default:
      return -1;
  }
}

int64_t mask_scatter(const void* compact, const uint8_t* mask, int64_t n, size_t elem, void* dst) {
  switch (elem) {
    case 2:
      return scatter_impl(static_cast<const uint16_t*>(compact), mask, n,
                          static_cast<uint16_t*>(dst));
    case 4:
      return scatter_impl(static_cast<const uint32_t*>(compact), mask, n,
                          static_cast<uint32_t*>(dst));
    case 8:
      return scatter_impl(static_cast<const uint64_t*>(compact), mask, n,
                          static_cast<uint64_t*>(dst));
    default:
      return -1;
  }
}

MaskedSumSquares mask_sum_squares(const float* x, const uint8_t* mask, int64_t n) {
  // Blocks short enough that a float lane's rounding stays far below the double total's; fixed-width
  // lanes so that the compiler vectorizes the select-and-add without reassociating (no fast-math).
  constexpr int kLanes = 8;
  constexpr int64_t kSpan = 1024;
  MaskedSumSquares r;
  int64_t i = 0;
  for (; i + kSpan <= n; i += kSpan) {
    float in[kLanes] = {}, out[kLanes] = {};
    for (int64_t b = 0; b < kSpan; b += kLanes) {
      for (int l = 0; l < kLanes; ++l) {
        const float v = x[i + b + l] * x[i + b + l];
        const float m = static_cast<float>(mask[i + b + l]);
        in[l] += m * v;
        out[l] += v - m * v;
      }
    }
    for (int l = 0; l < kLanes; ++l) {
      r.selected += in[l];
      r.unselected += out[l];
    }
    r.count += mask_count(mask + i, kSpan);
  }
  for (; i < n; ++i) {
    const double v = static_cast<double>(x[i]) * x[i];
    if (mask[i]) {
      r.selected += v;
      ++r.count;
    } else {
      r.unselected += v;
    }
  }
  return r;
}

}  // namespace hvdc
