// Bulk fills of the Philox4x32-10 sequence (hvdc/philox.h). The portable fill runs the block
// function over independent lanes; the AVX2 fill is written with intrinsics, eight blocks per
// iteration as two independent chains of four (philox8: the counter words in the low halves of
// 64-bit lanes, so that each vpmuludq gives a whole (hi, lo) product), and a 4x8 transpose to
// write the words in sequence order. philox_fill_uniform's AVX2 fill converts the words to
// uniforms in registers, so a tile of uniforms is written once. The auto-vectorized clone this
// replaced ran at ~1 GB/s of words, the first intrinsics version (one chain, 32-bit lanes) at
// ~3 GB/s, this one at ~5 GB/s on the bench machine (hvd_compress/bench/kernels.py,
// philox_fill): it is what bounds the stochastic quantizer (stochastic_kernels.cc). Both fills
// compute the same words (cpp/tests/test_philox.cc checks every alignment against the block
// function); the choice is made once.
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

template <bool kUniform>
FillBlocks pick_fill_blocks() {
#if HVDC_PHILOX_AVX2
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2")) return &fill_blocks_avx2<kUniform>;
#endif
  return &fill_blocks_portable<kUniform>;
}

const FillBlocks kFillWords = pick_fill_blocks<false>();
const FillBlocks kFillUniforms = pick_fill_blocks<true>();

// Elements [offset, offset + n) of `key`'s sequence into `out` (uint32_t or float slots): a head
// that is not block-aligned, then whole blocks straight into `out`, then a tail.
template <bool kUniform>
void fill(const PhiloxKey& key, uint64_t offset, int64_t n, void* out) {
  if (n <= 0) return;
  auto* words = static_cast<uint32_t*>(out);
  auto* floats = static_cast<float*>(out);
  const auto one = [&](int64_t i, uint64_t index) {
    const uint32_t w = philox_block(key, index >> 2).v[index & 3];
    if (kUniform)
      floats[i] = philox_word_to_uniform(w);
    else
      words[i] = w;
  };
  uint64_t index = offset;
  int64_t done = 0;
  while (done < n && (index & 3) != 0) one(done++, index++);
  const int64_t whole = (n - done) / 4;
  (kUniform ? kFillUniforms : kFillWords)(key, index >> 2, whole,
                                          kUniform ? static_cast<void*>(floats + done)
                                                   : static_cast<void*>(words + done));
  done += 4 * whole;
  index += 4 * static_cast<uint64_t>(whole);
  while (done < n) one(done++, index++);
}

}  // namespace

void philox_fill_u32(const PhiloxKey& key, uint64_t offset, int64_t n, uint32_t* out) {
  fill<false>(key, offset, n, out);
}

void philox_fill_uniform(const PhiloxKey& key, uint64_t offset, int64_t n, float* out) {
  fill<true>(key, offset, n, out);
}

}  // namespace hvdc
