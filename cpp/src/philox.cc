// Bulk fills of the Philox4x32-10 sequence (hvdc/philox.h). The portable fill runs the block
// function over independent lanes; the AVX2 fill is written with intrinsics, eight blocks per
// iteration as two independent chains of four (philox8: the counter words in the low halves of
// 64-bit lanes, so that each vpmuludq gives a whole (hi, lo) product), and a 4x8 transpose to
// write the words in sequence order. The AVX-512 fill (philox_zmm) is the same scheme in zmm
// registers, 32 blocks per iteration as four chains of eight, the two xors of a round one
// vpternlogq, and two-source permutes for the sequence order. philox_fill_uniform's vector fills
// convert the words to uniforms in registers, so a tile of uniforms is written once.
// Two chains hide the AVX2 round's latency; the AVX-512 fill is throughput bound, so more chains
// would add registers, not speed. The fill is what bounds the stochastic
// quantizer (stochastic_kernels.cc) and the Bernoulli mask (masks.cc).
// Every fill computes the same words (cpp/tests/test_philox.cc checks each one this CPU runs,
// through philox_fill_*_with, at every alignment against the block function); the auto choice,
// the best one the CPU has, is made once.
#include "hvdc/philox.h"

#include <cstring>

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define HVDC_PHILOX_AVX2 1
#else
#define HVDC_PHILOX_AVX2 0
#endif

namespace hvdc {
namespace {

// Blocks [first, first + count) into out[4 * i + lane]; written as independent lanes so that the
// compiler can keep several blocks in vector registers at once.
template <int kLanes>
inline void fill_blocks(const PhiloxKey& key, uint64_t first, int64_t count, uint32_t* out) {
  int64_t b = 0;
  for (; b + kLanes <= count; b += kLanes) {
    PhiloxBlock blocks[kLanes];
    for (int l = 0; l < kLanes; ++l) blocks[l] = philox_block(key, first + b + l);
    for (int l = 0; l < kLanes; ++l)
      for (int w = 0; w < 4; ++w) out[4 * (b + l) + w] = blocks[l].v[w];
  }
  for (; b < count; ++b) {
    const PhiloxBlock blk = philox_block(key, first + b);
    for (int w = 0; w < 4; ++w) out[4 * b + w] = blk.v[w];
  }
}

#if HVDC_PHILOX_AVX2
#define HVDC_TARGET_AVX2 __attribute__((target("avx2")))

// Eight blocks (first + 0..7) of Philox4x32-10, as two independent chains of four blocks (the even
// and the odd ones) whose counter words sit in the low halves of 64-bit lanes: vpmuludq reads only
// those halves, so its 64-bit product is (hi, lo) in place, hi is one shift away, and the garbage
// that the xors leave in the upper halves is never read. Two chains keep the multiplier busy while
// the other waits on its latency. Words (kUniform: their uniforms, philox_word_to_uniform) go to
// out[0..32) in sequence order.
// Lanes 2i of `even` and 2i + 1 of `odd` (the low halves of their 64-bit lanes), as 8 words.
HVDC_TARGET_AVX2 inline __m256i merge(__m256i even, __m256i odd) {
  return _mm256_blend_epi32(even, _mm256_slli_epi64(odd, 32), 0xAA);
}

template <bool kUniform>
HVDC_TARGET_AVX2 inline void philox8(const PhiloxKey& key, uint64_t first, void* out) {
  __m256i c0[2], c1[2], c2[2], c3[2];
  for (int g = 0; g < 2; ++g) {  // chain g: blocks first + g + {0, 2, 4, 6}
    const __m256i ctr = _mm256_add_epi64(_mm256_set1_epi64x(static_cast<long long>(first + g)),
                                         _mm256_setr_epi64x(0, 2, 4, 6));
    c0[g] = ctr;
    c1[g] = _mm256_srli_epi64(ctr, 32);
    c2[g] = _mm256_set1_epi64x(key.step);
    c3[g] = _mm256_set1_epi64x(key.stream);
  }
  const __m256i m0 = _mm256_set1_epi64x(0xD2511F53u), m1 = _mm256_set1_epi64x(0xCD9E8D57u);
  uint32_t k0 = static_cast<uint32_t>(key.seed), k1 = static_cast<uint32_t>(key.seed >> 32);
  for (int round = 0; round < 10; ++round) {
    const __m256i kk0 = _mm256_set1_epi64x(k0), kk1 = _mm256_set1_epi64x(k1);
    for (int g = 0; g < 2; ++g) {
      const __m256i p0 = _mm256_mul_epu32(c0[g], m0);
      const __m256i p1 = _mm256_mul_epu32(c2[g], m1);
      c0[g] = _mm256_xor_si256(_mm256_xor_si256(_mm256_srli_epi64(p1, 32), c1[g]), kk0);
      c1[g] = p1;
      c2[g] = _mm256_xor_si256(_mm256_xor_si256(_mm256_srli_epi64(p0, 32), c3[g]), kk1);
      c3[g] = p0;
    }
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  // Word w of blocks 0..7 in lanes 0..7 (even blocks from chain 0, odd from chain 1), then the
  // 4x8 transpose to out[4 * block + w].
  const __m256i w0 = merge(c0[0], c0[1]), w1 = merge(c1[0], c1[1]);
  const __m256i w2 = merge(c2[0], c2[1]), w3 = merge(c3[0], c3[1]);
  const __m256i t0 = _mm256_unpacklo_epi32(w0, w1);  // b0w0 b0w1 b1w0 b1w1 | b4.. b5..
  const __m256i t1 = _mm256_unpackhi_epi32(w0, w1);  // b2w0 b2w1 b3w0 b3w1 | b6.. b7..
  const __m256i t2 = _mm256_unpacklo_epi32(w2, w3);
  const __m256i t3 = _mm256_unpackhi_epi32(w2, w3);
  const __m256i b01 = _mm256_unpacklo_epi64(t0, t2);  // block 0 | block 4
  const __m256i b11 = _mm256_unpackhi_epi64(t0, t2);  // block 1 | block 5
  const __m256i b21 = _mm256_unpacklo_epi64(t1, t3);  // block 2 | block 6
  const __m256i b31 = _mm256_unpackhi_epi64(t1, t3);  // block 3 | block 7
  const __m256i words[4] = {_mm256_permute2x128_si256(b01, b11, 0x20),   // blocks 0, 1
                            _mm256_permute2x128_si256(b21, b31, 0x20),   // blocks 2, 3
                            _mm256_permute2x128_si256(b01, b11, 0x31),   // blocks 4, 5
                            _mm256_permute2x128_si256(b21, b31, 0x31)};  // blocks 6, 7
  for (int q = 0; q < 4; ++q) {
    if (kUniform) {  // (word >> 8) * 2^-24: exact in float32, as philox_word_to_uniform
      const __m256 u = _mm256_mul_ps(_mm256_cvtepi32_ps(_mm256_srli_epi32(words[q], 8)),
                                     _mm256_set1_ps(1.0f / 16777216.0f));
      _mm256_storeu_ps(static_cast<float*>(out) + 8 * q, u);
    } else {
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(static_cast<uint32_t*>(out) + 8 * q), words[q]);
    }
  }
}

template <bool kUniform>
HVDC_TARGET_AVX2 void fill_blocks_avx2(const PhiloxKey& key, uint64_t first, int64_t count,
                                       void* out) {
  auto* words = static_cast<uint32_t*>(out);
  auto* floats = static_cast<float*>(out);
  int64_t b = 0;
  for (; b + 8 <= count; b += 8)
    philox8<kUniform>(key, first + static_cast<uint64_t>(b),
                      kUniform ? static_cast<void*>(floats + 4 * b) : static_cast<void*>(words + 4 * b));
  for (; b < count; ++b) {
    const PhiloxBlock blk = philox_block(key, first + static_cast<uint64_t>(b));
    for (int w = 0; w < 4; ++w) {
      if (kUniform)
        floats[4 * b + w] = philox_word_to_uniform(blk.v[w]);
      else
        words[4 * b + w] = blk.v[w];
    }
  }
}

#define HVDC_TARGET_AVX512 __attribute__((target("avx512f,avx512bw,avx512vl,avx512dq")))

// GCC 12's avx512fintrin.h fills the unused pass-through operand of the unmasked intrinsics with a
// self-initialised _mm512_undefined_*, which -Wuninitialized reports at every use (GCC bug 105593,
// fixed in 13).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

// 8 * kChains blocks (first + 0 ..) of Philox4x32-10 in zmm registers: chain g holds blocks
// first + 8g + l in its 64-bit lanes l, counter words in the low halves as in philox8. With 32
// registers four chains fit with room to spare, enough that the round's chain (vpmuludq, shift,
// one ternary-logic xor of three) no longer bounds it: the multipliers stay busy. Words
// (kUniform: uniforms) go to out[0, 32 * kChains) in sequence order.
template <int kChains, bool kUniform>
HVDC_TARGET_AVX512 inline void philox_zmm(const PhiloxKey& key, uint64_t first, void* out) {
  __m512i c0[kChains], c1[kChains], c2[kChains], c3[kChains];
  const __m512i lanes = _mm512_set_epi64(7, 6, 5, 4, 3, 2, 1, 0);
  for (int g = 0; g < kChains; ++g) {
    const __m512i ctr =
        _mm512_add_epi64(_mm512_set1_epi64(static_cast<long long>(first + 8 * g)), lanes);
    c0[g] = ctr;
    c1[g] = _mm512_srli_epi64(ctr, 32);
    c2[g] = _mm512_set1_epi64(key.step);
    c3[g] = _mm512_set1_epi64(key.stream);
  }
  const __m512i m0 = _mm512_set1_epi64(0xD2511F53u), m1 = _mm512_set1_epi64(0xCD9E8D57u);
  uint32_t k0 = static_cast<uint32_t>(key.seed), k1 = static_cast<uint32_t>(key.seed >> 32);
  for (int round = 0; round < 10; ++round) {
    const __m512i kk0 = _mm512_set1_epi64(k0), kk1 = _mm512_set1_epi64(k1);
    for (int g = 0; g < kChains; ++g) {
      const __m512i p0 = _mm512_mul_epu32(c0[g], m0);
      const __m512i p1 = _mm512_mul_epu32(c2[g], m1);
      c0[g] = _mm512_ternarylogic_epi64(_mm512_srli_epi64(p1, 32), c1[g], kk0, 0x96);  // a ^ b ^ c
      c1[g] = p1;
      c2[g] = _mm512_ternarylogic_epi64(_mm512_srli_epi64(p0, 32), c3[g], kk1, 0x96);
      c3[g] = p0;
    }
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  // Per chain: (w0, w1) and (w2, w3) of each block as adjacent dwords (an in-lane shuffle puts
  // the low half of w1's lane in the high half), then the qwords of the two interleaved so that
  // blocks 0..3 and 4..7 come out whole.
  const __m512i first4 = _mm512_set_epi64(11, 3, 10, 2, 9, 1, 8, 0);
  const __m512i last4 = _mm512_set_epi64(15, 7, 14, 6, 13, 5, 12, 4);
  for (int g = 0; g < kChains; ++g) {
    const __m512i w01 = _mm512_mask_shuffle_epi32(c0[g], 0xAAAA, c1[g], _MM_PERM_CDAB);
    const __m512i w23 = _mm512_mask_shuffle_epi32(c2[g], 0xAAAA, c3[g], _MM_PERM_CDAB);
    const __m512i words[2] = {_mm512_permutex2var_epi64(w01, first4, w23),
                              _mm512_permutex2var_epi64(w01, last4, w23)};
    for (int h = 0; h < 2; ++h) {
      const int64_t at = 32 * g + 16 * h;
      if (kUniform) {  // as philox_word_to_uniform
        const __m512 u = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_srli_epi32(words[h], 8)),
                                       _mm512_set1_ps(1.0f / 16777216.0f));
        _mm512_storeu_ps(static_cast<float*>(out) + at, u);
      } else {
        _mm512_storeu_si512(static_cast<uint32_t*>(out) + at, words[h]);
      }
    }
  }
}

template <bool kUniform>
HVDC_TARGET_AVX512 void fill_blocks_avx512(const PhiloxKey& key, uint64_t first, int64_t count,
                                           void* out) {
  auto* words = static_cast<uint32_t*>(out);
  auto* floats = static_cast<float*>(out);
  const auto at = [&](int64_t b) {
    return kUniform ? static_cast<void*>(floats + 4 * b) : static_cast<void*>(words + 4 * b);
  };
  int64_t b = 0;
  for (; b + 32 <= count; b += 32) philox_zmm<4, kUniform>(key, first + static_cast<uint64_t>(b), at(b));
  for (; b + 8 <= count; b += 8) philox_zmm<1, kUniform>(key, first + static_cast<uint64_t>(b), at(b));
  for (; b < count; ++b) {
    const PhiloxBlock blk = philox_block(key, first + static_cast<uint64_t>(b));
    for (int w = 0; w < 4; ++w) {
      if (kUniform)
        floats[4 * b + w] = philox_word_to_uniform(blk.v[w]);
      else
        words[4 * b + w] = blk.v[w];
    }
  }
}
#pragma GCC diagnostic pop
#endif

// Words [0, n) at `out` (4-byte slots) become their uniforms, in place.
void words_to_uniforms(void* out, int64_t n) {
  auto* f = static_cast<float*>(out);
  for (int64_t i = 0; i < n; ++i) {
    uint32_t w;
    std::memcpy(&w, f + i, sizeof w);
    f[i] = philox_word_to_uniform(w);
  }
}

template <bool kUniform>
void fill_blocks_portable(const PhiloxKey& key, uint64_t first, int64_t count, void* out) {
  fill_blocks<4>(key, first, count, static_cast<uint32_t*>(out));
  if (kUniform) words_to_uniforms(out, 4 * count);
}

// Blocks [first, first + count) into out[4 * i + w]: their words, or (kUniform) their uniforms.
using FillBlocks = void (*)(const PhiloxKey&, uint64_t, int64_t, void*);

bool cpu_has(PhiloxIsa isa) {
#if HVDC_PHILOX_AVX2
  __builtin_cpu_init();
  if (isa == PhiloxIsa::kAvx2) return __builtin_cpu_supports("avx2");
  if (isa == PhiloxIsa::kAvx512)
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq");
#endif
  return isa == PhiloxIsa::kPortable;
}

const PhiloxIsa kBestIsa = cpu_has(PhiloxIsa::kAvx512) ? PhiloxIsa::kAvx512
                           : cpu_has(PhiloxIsa::kAvx2) ? PhiloxIsa::kAvx2
                                                       : PhiloxIsa::kPortable;

template <bool kUniform>
FillBlocks fill_blocks_of(PhiloxIsa isa) {
  if (isa == PhiloxIsa::kAuto || !cpu_has(isa)) isa = kBestIsa;
#if HVDC_PHILOX_AVX2
  if (isa == PhiloxIsa::kAvx512) return &fill_blocks_avx512<kUniform>;
  if (isa == PhiloxIsa::kAvx2) return &fill_blocks_avx2<kUniform>;
#endif
  return &fill_blocks_portable<kUniform>;
}

// Elements [offset, offset + n) of `key`'s sequence into `out` (uint32_t or float slots): a head
// that is not block-aligned, then whole blocks straight into `out`, then a tail.
template <bool kUniform>
void fill(FillBlocks fill_blocks, const PhiloxKey& key, uint64_t offset, int64_t n, void* out) {
  if (n <= 0) return;
  auto* words = static_cast<uint32_t*>(out);
  auto* floats = static_cast<float*>(out);
  const auto one = [&](int64_t i, uint64_t index) {
    const uint32_t w = philox_word(key, index);
    if (kUniform)
      floats[i] = philox_word_to_uniform(w);
    else
      words[i] = w;
  };
  uint64_t index = offset;
  int64_t done = 0;
  while (done < n && (index & 3) != 0) one(done++, index++);
  const int64_t whole = (n - done) / 4;
  fill_blocks(key, index >> 2, whole,
              kUniform ? static_cast<void*>(floats + done) : static_cast<void*>(words + done));
  done += 4 * whole;
  index += 4 * static_cast<uint64_t>(whole);
  while (done < n) one(done++, index++);
}

// The auto choice, made once.
const FillBlocks kFillWords = fill_blocks_of<false>(PhiloxIsa::kAuto);
const FillBlocks kFillUniforms = fill_blocks_of<true>(PhiloxIsa::kAuto);

}  // namespace

bool philox_isa_supported(PhiloxIsa isa) { return isa == PhiloxIsa::kAuto || cpu_has(isa); }

PhiloxIsa philox_best_isa() { return kBestIsa; }

void philox_fill_u32(const PhiloxKey& key, uint64_t offset, int64_t n, uint32_t* out) {
  fill<false>(kFillWords, key, offset, n, out);
}

void philox_fill_uniform(const PhiloxKey& key, uint64_t offset, int64_t n, float* out) {
  fill<true>(kFillUniforms, key, offset, n, out);
}

void philox_fill_u32_with(PhiloxIsa isa, const PhiloxKey& key, uint64_t offset, int64_t n,
                          uint32_t* out) {
  fill<false>(fill_blocks_of<false>(isa), key, offset, n, out);
}

void philox_fill_uniform_with(PhiloxIsa isa, const PhiloxKey& key, uint64_t offset, int64_t n,
                              float* out) {
  fill<true>(fill_blocks_of<true>(isa), key, offset, n, out);
}

}  // namespace hvdc
