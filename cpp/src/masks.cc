// Random-k masks and the compaction kernels (hvdc/masks.h).
#include "hvdc/masks.h"

#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <memory>
#include <mutex>

#include "hvdc/kernel_isa.h"
#include "hvdc/mask_lanes.h"
#include "hvdc/philox.h"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace hvdc {
namespace {

constexpr int64_t kMaxCyclicNumel = int64_t{1} << 32;  // ranks are kept as uint32

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

// out[i] = (r[i] - base < width) as a byte: one streaming compare (unsigned wrap-around makes the
// range test one comparison).
void cyclic_compare_scalar(const uint32_t* r, uint32_t base, uint32_t width, int64_t n, uint8_t* out) {
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<uint8_t>(cyclic_selected(r[i], base, width));
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
// All ones in lane l where p[l] - base < width (unsigned), as a signed compare of sign-flipped values.
__attribute__((target("avx2"), always_inline)) inline __m256i rank_below(const uint32_t* p, __m256i base,
                                                                         __m256i width_flipped,
                                                                         __m256i flip) {
  const __m256i d = _mm256_sub_epi32(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)), base);
  return _mm256_cmpgt_epi32(width_flipped, _mm256_xor_si256(d, flip));
}

// 32 ranks per iteration; the unsigned compare as a signed one on sign-flipped values (AVX2 has no
// unsigned 32-bit compare), packed to bytes with the lane order restored.
__attribute__((target("avx2"))) void cyclic_compare_avx2(const uint32_t* r, uint32_t base, uint32_t width,
                                                         int64_t n, uint8_t* out) {
  const __m256i flip = _mm256_set1_epi32(INT32_MIN);
  const __m256i vbase = _mm256_set1_epi32(static_cast<int>(base));
  const __m256i vwidth = _mm256_xor_si256(_mm256_set1_epi32(static_cast<int>(width)), flip);
  const __m256i one = _mm256_set1_epi8(1);
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    const __m256i a = _mm256_packs_epi32(rank_below(r + i, vbase, vwidth, flip),
                                         rank_below(r + i + 8, vbase, vwidth, flip));
    const __m256i b = _mm256_packs_epi32(rank_below(r + i + 16, vbase, vwidth, flip),
                                         rank_below(r + i + 24, vbase, vwidth, flip));
    const __m256i bytes = _mm256_permutevar8x32_epi32(_mm256_packs_epi16(a, b), order);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i), _mm256_and_si256(bytes, one));
  }
  cyclic_compare_scalar(r + i, base, width, n - i, out + i);
}
#endif

void cyclic_compare(const uint32_t* r, uint32_t base, uint32_t width, int64_t n, uint8_t* out) {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  if (cpu_has_avx2_kernels()) return cyclic_compare_avx2(r, base, width, n, out);
#endif
  cyclic_compare_scalar(r, base, width, n, out);
}

// Elements [s.first, s.first + n) of the cyclic mask into out[0, n).
void cyclic_mask(const MaskSpec& s, int64_t n, uint8_t* out) {
  const CyclicWindow w = cyclic_window(s.numel, s.ratio, s.step);
  if (w.width == 0) {
    std::memset(out, 0, static_cast<size_t>(n));
    return;
  }
  const auto ranks = cached_ranks(s.numel, s.seed);
  cyclic_compare(ranks->data() + s.first, w.base, w.width, n, out);
}

// Elements [s.first, s.first + n) of the Bernoulli mask (hvdc/masks.h) into out[0, n), from the
// Philox words of `isa`'s fill, a tile at a time. Element i's high half is 16-bit half (i & 1) of
// word i >> 1, so a tile of words read as little-endian uint16 is the elements' high halves in
// order; the tiles are cut at fixed word indices, so where the range starts changes only where the
// first tile begins, never which bits an element gets.
constexpr int64_t kBernoulliTileWords = 2048;


// Elements [e, e + n) whose high halves are halves [k, k + n) of `words` (as little-endian uint16).
void bernoulli_compare_scalar(const BernoulliDraw& d, const uint32_t* words, int64_t k, uint64_t e,
                              int64_t n, uint8_t* out) {
  for (int64_t x = 0; x < n; ++x, ++k) {
    const uint32_t hi = (words[k >> 1] >> (16 * (k & 1))) & 0xFFFFu;
    out[x] = bernoulli_selected(d, hi, e + static_cast<uint64_t>(x));
  }
}

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define HVDC_TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))

// 64 halves per iteration: two unsigned 16-bit compares give the 64-bit selection mask, which
// writes the 0/1 bytes in one masked move; the equal-compare finds the ties (any lane, rarely).
HVDC_TARGET_AVX512 void bernoulli_compare_avx512(const BernoulliDraw& d, const uint32_t* words,
                                                 int64_t k, uint64_t e, int64_t n, uint8_t* out) {
  const auto* halves = reinterpret_cast<const char*>(words);
  const __m512i th = _mm512_set1_epi16(static_cast<short>(d.th));
  const __m512i one = _mm512_set1_epi8(1);
  int64_t x = 0;
  for (; x + 64 <= n; x += 64) {
    const __m512i a = _mm512_loadu_si512(halves + 2 * (k + x));
    const __m512i b = _mm512_loadu_si512(halves + 2 * (k + x + 32));
    const __mmask64 below = _mm512_kunpackd(_mm512_cmplt_epu16_mask(b, th), _mm512_cmplt_epu16_mask(a, th));
    _mm512_storeu_si512(out + x, _mm512_maskz_mov_epi8(below, one));
    if (d.tl == 0) continue;  // a tie then never selects, as the compare already wrote
    uint64_t ties = _cvtmask64_u64(
        _mm512_kunpackd(_mm512_cmpeq_epu16_mask(b, th), _mm512_cmpeq_epu16_mask(a, th)));
    for (; ties != 0; ties &= ties - 1) {
      const int l = __builtin_ctzll(ties);
      // A tie: its low half decides (probability 2^-16, so one scalar block on demand costs less
      // than a second stream in bulk).
      out[x + l] = bernoulli_selected(d, d.th, e + static_cast<uint64_t>(x + l));
    }
  }
  bernoulli_compare_scalar(d, words, k + x, e + static_cast<uint64_t>(x), n - x, out + x);
}
#endif

void bernoulli_draw(PhiloxIsa isa, const MaskSpec& s, int64_t n, uint8_t* out) {
  const uint64_t t = bernoulli_threshold(s.ratio);
  if (t >= (uint64_t{1} << 32)) {
    std::memset(out, 1, static_cast<size_t>(n));
    return;
  }
  const BernoulliDraw d = bernoulli_draw_of(s.seed, s.step, t);
  if (isa == PhiloxIsa::kAuto || !philox_isa_supported(isa)) isa = philox_best_isa();
  auto compare = &bernoulli_compare_scalar;
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  if (isa == PhiloxIsa::kAvx512) compare = &bernoulli_compare_avx512;
#endif
  alignas(64) uint32_t words[kBernoulliTileWords];
  const uint64_t first = static_cast<uint64_t>(s.first), end = first + static_cast<uint64_t>(n);
  const uint64_t word_end = (end + 1) >> 1;
  for (uint64_t w = first >> 1; w < word_end;) {
    const uint64_t next = std::min(word_end, (w / kBernoulliTileWords + 1) * kBernoulliTileWords);
    philox_fill_u32_with(isa, d.key, w, static_cast<int64_t>(next - w), words);
    const uint64_t lo = std::max(first, 2 * w), hi = std::min(end, 2 * next);
    compare(d, words, static_cast<int64_t>(lo - 2 * w), lo, static_cast<int64_t>(hi - lo), out + (lo - first));
    w = next;
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


#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define HVDC_MASKS_AVX2 1

// Groups of 8 go through one permute; the groups whose 8 stores could pass dst's end (the last
// selected elements) are left to the scalar tail.
__attribute__((target("avx2"))) int64_t gather32_avx2(const uint32_t* src, const uint8_t* mask,
                                                      int64_t n, int64_t total, uint32_t* dst) {
  const MaskLaneTables& t = mask_lane_tables();
  int64_t i = 0, j = 0;
  for (; i + 8 <= n && j + 8 <= total; i += 8) {
    // No branch on an empty group: at k = 0.1 about 43% of groups are, unpredictably; the store
    // of an empty group is overwritten by the next one.
    const uint32_t bits = mask_bits8(mask + i);
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(src + i));
    const __m256i p = _mm256_load_si256(reinterpret_cast<const __m256i*>(t.compress[bits]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(dst + j), _mm256_permutevar8x32_epi32(v, p));
    j += __builtin_popcount(bits);
  }
  for (; i < n; ++i)
    if (mask[i]) dst[j++] = src[i];
  return j;
}

__attribute__((target("avx2"))) int64_t scatter32_avx2(const uint32_t* compact, const uint8_t* mask,
                                                       int64_t n, int64_t total, uint32_t* dst) {
  const MaskLaneTables& t = mask_lane_tables();
  int64_t i = 0, j = 0;
  for (; i + 8 <= n && j + 8 <= total; i += 8) {
    const uint32_t bits = mask_bits8(mask + i);  // no branch on an empty group (see gather)
    const __m256i v = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(compact + j));
    const __m256i p = _mm256_load_si256(reinterpret_cast<const __m256i*>(t.expand[bits]));
    // Lane l of `keep` is all ones where bit l is set: only those lanes of dst change.
    const __m256i lanes = _mm256_set_epi32(128, 64, 32, 16, 8, 4, 2, 1);
    const __m256i keep = _mm256_cmpeq_epi32(
        _mm256_and_si256(_mm256_set1_epi32(static_cast<int>(bits)), lanes), lanes);
    // A blend and a full store rather than vpmaskmovd, whose store form is slow on AMD cores.
    __m256i* at = reinterpret_cast<__m256i*>(dst + i);
    _mm256_storeu_si256(at, _mm256_blendv_epi8(_mm256_loadu_si256(at), _mm256_permutevar8x32_epi32(v, p), keep));
    j += __builtin_popcount(bits);
  }
  for (; i < n; ++i)
    if (mask[i]) dst[i] = compact[j++];
  return j;
}
#endif

}  // namespace

MaskLaneTables::MaskLaneTables() {
  for (int bits = 0; bits < 256; ++bits) {
    int k = 0;
    for (int l = 0; l < 8; ++l) {
      compress[bits][l] = 0;
      expand[bits][l] = 0;
    }
    for (int l = 0; l < 8; ++l) {
      if (bits & (1 << l)) {
        compress[bits][k] = l;
        expand[bits][l] = k;
        ++k;
      }
    }
  }
}

const MaskLaneTables& mask_lane_tables() {
  static const MaskLaneTables tables;
  return tables;
}

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
  if (s.first < 0 || s.first > s.numel || mask_range_length(s) > s.numel - s.first)
    return "mask range [" + std::to_string(s.first) + ", " +
           std::to_string(s.first + mask_range_length(s)) + ") is outside [0, " +
           std::to_string(s.numel) + ")";
  return "";
}

void bernoulli_mask(PhiloxIsa isa, const MaskSpec& spec, uint8_t* out) {
  const int64_t n = mask_range_length(spec);
  if (n > 0) bernoulli_draw(isa, spec, n, out);
}

int64_t mask_range_length(const MaskSpec& spec) {
  return spec.length >= 0 ? spec.length : spec.numel - spec.first;
}

void random_mask(const MaskSpec& spec, uint8_t* out) {
  const int64_t n = mask_range_length(spec);
  if (n <= 0) return;
  if (spec.kind == MaskKind::kBernoulli)
    bernoulli_draw(PhiloxIsa::kAuto, spec, n, out);
  else
    cyclic_mask(spec, n, out);
  const int64_t first = spec.first, end = spec.first + n;
  for (size_t i = 0; i < spec.always.size(); i += 2) {  // each always range clipped to the drawn one
    const int64_t lo = std::max(first, spec.always[i]);
    const int64_t hi = std::min(end, spec.always[i] + spec.always[i + 1]);
    if (lo < hi) std::memset(out + (lo - first), 1, static_cast<size_t>(hi - lo));
  }
}

std::shared_ptr<const std::vector<uint32_t>> cyclic_ranks(int64_t numel, uint64_t seed) {
  return cached_ranks(numel, seed);
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

int64_t mask_gather(const void* src, const uint8_t* mask, int64_t n, int64_t count, size_t elem,
                    void* dst) {
  switch (elem) {
    case 2:
      return gather_impl(static_cast<const uint16_t*>(src), mask, n, static_cast<uint16_t*>(dst));
    case 4:
#ifdef HVDC_MASKS_AVX2
      if (cpu_has_avx2_kernels())
        return gather32_avx2(static_cast<const uint32_t*>(src), mask, n, count,
                             static_cast<uint32_t*>(dst));
#endif
      return gather_impl(static_cast<const uint32_t*>(src), mask, n, static_cast<uint32_t*>(dst));
    case 8:
      return gather_impl(static_cast<const uint64_t*>(src), mask, n, static_cast<uint64_t*>(dst));
    default:
      return -1;
  }
}

int64_t mask_scatter(const void* compact, const uint8_t* mask, int64_t n, int64_t count, size_t elem,
                     void* dst) {
  switch (elem) {
    case 2:
      return scatter_impl(static_cast<const uint16_t*>(compact), mask, n,
                          static_cast<uint16_t*>(dst));
    case 4:
#ifdef HVDC_MASKS_AVX2
      if (cpu_has_avx2_kernels())
        return scatter32_avx2(static_cast<const uint32_t*>(compact), mask, n, count,
                              static_cast<uint32_t*>(dst));
#endif
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

void mask_freshness(float* c, const uint8_t* mask, int64_t n, float beta3) {
  // m + (1 - m) * (beta3 * c) is exactly 1 or beta3 * c for m in {0, 1}, and vectorizes (a select on
  // the byte mask does not).
  for (int64_t i = 0; i < n; ++i) {
    const float m = static_cast<float>(mask[i]);
    c[i] = m + (1.0f - m) * (beta3 * c[i]);
  }
}

}  // namespace hvdc
