// Bulk fills of the Philox4x32-10 sequence (hvdc/philox.h). The portable fill runs the block
// function over independent lanes; the AVX2 fill is written with intrinsics, eight blocks per
// iteration in structure-of-arrays form (one 8-lane vector per counter word), the 32x32->64-bit
// products done by vpmuludq on the even and odd lanes, and a 4x8 transpose to write the words in
// sequence order. The auto-vectorized clone it replaces ran at ~1 GB/s of words; this one is what
// lets the stochastic quantizer (stochastic_kernels.cc) draw its uniforms at memory speed. Both
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

// (hi, lo) of the eight 32x32->64-bit products x * m, lane by lane.
HVDC_TARGET_AVX2 inline void mulhilo8(__m256i x, __m256i m, __m256i& hi, __m256i& lo) {
  const __m256i even = _mm256_mul_epu32(x, m);                         // lanes 0,2,4,6 as 64-bit
  const __m256i odd = _mm256_mul_epu32(_mm256_srli_epi64(x, 32), m);  // lanes 1,3,5,7
  lo = _mm256_blend_epi32(even, _mm256_slli_epi64(odd, 32), 0xAA);
  hi = _mm256_blend_epi32(_mm256_srli_epi64(even, 32), odd, 0xAA);
}

// Eight blocks (first + 0..7) of Philox4x32-10 into out[0..32) in sequence order.
HVDC_TARGET_AVX2 inline void philox8(const PhiloxKey& key, uint64_t first, uint32_t* out) {
  alignas(32) uint32_t lo_words[8], hi_words[8];
  for (int l = 0; l < 8; ++l) {
    const uint64_t b = first + static_cast<uint64_t>(l);
    lo_words[l] = static_cast<uint32_t>(b);
    hi_words[l] = static_cast<uint32_t>(b >> 32);
  }
  __m256i c0 = _mm256_load_si256(reinterpret_cast<const __m256i*>(lo_words));
  __m256i c1 = _mm256_load_si256(reinterpret_cast<const __m256i*>(hi_words));
  __m256i c2 = _mm256_set1_epi32(static_cast<int>(key.step));
  __m256i c3 = _mm256_set1_epi32(static_cast<int>(key.stream));
  const __m256i m0 = _mm256_set1_epi64x(0xD2511F53u), m1 = _mm256_set1_epi64x(0xCD9E8D57u);
  uint32_t k0 = static_cast<uint32_t>(key.seed), k1 = static_cast<uint32_t>(key.seed >> 32);
  for (int round = 0; round < 10; ++round) {
    __m256i hi0, lo0, hi1, lo1;
    mulhilo8(c0, m0, hi0, lo0);
    mulhilo8(c2, m1, hi1, lo1);
    c0 = _mm256_xor_si256(_mm256_xor_si256(hi1, c1), _mm256_set1_epi32(static_cast<int>(k0)));
    c1 = lo1;
    c2 = _mm256_xor_si256(_mm256_xor_si256(hi0, c3), _mm256_set1_epi32(static_cast<int>(k1)));
    c3 = lo0;
    k0 += 0x9E3779B9u;
    k1 += 0xBB67AE85u;
  }
  // Transpose (word w of block l is lane l of c_w) to out[4 * l + w].
  const __m256i t0 = _mm256_unpacklo_epi32(c0, c1);  // b0w0 b0w1 b1w0 b1w1 | b4.. b5..
  const __m256i t1 = _mm256_unpackhi_epi32(c0, c1);  // b2w0 b2w1 b3w0 b3w1 | b6.. b7..
  const __m256i t2 = _mm256_unpacklo_epi32(c2, c3);
  const __m256i t3 = _mm256_unpackhi_epi32(c2, c3);
  const __m256i b01 = _mm256_unpacklo_epi64(t0, t2);  // block 0 | block 4
  const __m256i b11 = _mm256_unpackhi_epi64(t0, t2);  // block 1 | block 5
  const __m256i b21 = _mm256_unpacklo_epi64(t1, t3);  // block 2 | block 6
  const __m256i b31 = _mm256_unpackhi_epi64(t1, t3);  // block 3 | block 7
  auto* o = reinterpret_cast<__m256i*>(out);
  _mm256_storeu_si256(o + 0, _mm256_permute2x128_si256(b01, b11, 0x20));  // blocks 0, 1
  _mm256_storeu_si256(o + 1, _mm256_permute2x128_si256(b21, b31, 0x20));  // blocks 2, 3
  _mm256_storeu_si256(o + 2, _mm256_permute2x128_si256(b01, b11, 0x31));  // blocks 4, 5
  _mm256_storeu_si256(o + 3, _mm256_permute2x128_si256(b21, b31, 0x31));  // blocks 6, 7
}

HVDC_TARGET_AVX2 void fill_blocks_avx2(const PhiloxKey& key, uint64_t first, int64_t count,
                                       uint32_t* out) {
  int64_t b = 0;
  for (; b + 8 <= count; b += 8) philox8(key, first + static_cast<uint64_t>(b), out + 4 * b);
  for (; b < count; ++b) {
    const PhiloxBlock blk = philox_block(key, first + static_cast<uint64_t>(b));
    for (int w = 0; w < 4; ++w) out[4 * b + w] = blk.v[w];
  }
}
#endif

void fill_blocks_portable(const PhiloxKey& key, uint64_t first, int64_t count, uint32_t* out) {
  fill_blocks<4>(key, first, count, out);
}

using FillBlocks = void (*)(const PhiloxKey&, uint64_t, int64_t, uint32_t*);

FillBlocks pick_fill_blocks() {
#if HVDC_PHILOX_AVX2
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx2")) return &fill_blocks_avx2;
#endif
  return &fill_blocks_portable;
}

const FillBlocks kFillBlocks = pick_fill_blocks();

}  // namespace

void philox_fill_u32(const PhiloxKey& key, uint64_t offset, int64_t n, uint32_t* out) {
  if (n <= 0) return;
  uint64_t index = offset;
  int64_t done = 0;
  // A head that is not block-aligned, then whole blocks straight into `out`, then a tail.
  while (done < n && (index & 3) != 0) {
    out[done++] = philox_block(key, index >> 2).v[index & 3];
    ++index;
  }
  const int64_t whole = (n - done) / 4;
  kFillBlocks(key, index >> 2, whole, out + done);
  done += 4 * whole;
  index += 4 * static_cast<uint64_t>(whole);
  while (done < n) {
    out[done++] = philox_block(key, index >> 2).v[index & 3];
    ++index;
  }
}

void philox_fill_uniform(const PhiloxKey& key, uint64_t offset, int64_t n, float* out) {
  // The words are written in place of the floats (same size), then converted.
  philox_fill_u32(key, offset, n, reinterpret_cast<uint32_t*>(out));
  for (int64_t i = 0; i < n; ++i) {
    uint32_t w;
    std::memcpy(&w, out + i, sizeof w);
    out[i] = philox_word_to_uniform(w);
  }
}

}  // namespace hvdc
