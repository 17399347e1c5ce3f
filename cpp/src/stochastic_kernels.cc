// Birder's stochastic binary quantization: see hvdc/stochastic_kernels.h for the rule, the wire
// format and the rounding points. Portable and AVX2 versions give identical bits and errors: the
// same float32 operations in the same order (no FMA: the AVX2 target leaves out "fma" so that the
// compiler cannot contract a multiply and an add, which the NumPy reference does not do).
#include "hvdc/stochastic_kernels.h"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>

#include "hvdc/elementwise/onebit.h"
#include "hvdc/elementwise/stochastic.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define HVDC_STOCHASTIC_AVX2 1
#define HVDC_AVX2_ONLY __attribute__((target("avx2")))
#else
#define HVDC_STOCHASTIC_AVX2 0
#endif

namespace hvdc {
namespace {

// Elements per tile: the uniforms of one tile live in a 1 KiB stack buffer, in L1 while used. Small
// tiles keep the streaming of the data (prefetched one tile ahead, prefetch_next_tile) close to the
// Philox work in time, so that the two overlap (`make bench-kernels` times the worker pass).
constexpr int64_t kTile = 256;

// AVX2 where the CPU has it, unless the caller's choice (the runtime's configuration,
// hvdc/kernel_isa.h) asks for the portable code.
bool use_avx2(KernelChoice choice) {
#if HVDC_STOCHASTIC_AVX2
  return use_avx2_kernels(choice);
#else
  (void)choice;
  return false;
#endif
}

// The uniforms of elements [i, i + len) of a call: injected, or drawn into `tile`.
const float* uniforms_of(const UniformSource& u, int64_t i, int64_t len, float* tile) {
  if (u.injected != nullptr) return u.injected + i;
  philox_fill_uniform(u.key, u.offset + static_cast<uint64_t>(i), len, tile);
  return tile;
}

// The compensated value y of element i (worker), updating the moments when there are any.
inline float worker_y(const float* x, const float* error, const BirderMoments* mo, int64_t i) {
  if (mo == nullptr) return x[i] + error[i];
  return birder_moments(x[i], mo->beta, mo->one_minus_beta, mo->eps, mo->m[i], mo->b[i]) + error[i];
}

void worker_scalar(const float* x, float* error, const BirderMoments* mo, int64_t i0, int64_t len,
                   const float* u, uint8_t* bits) {
  for (int64_t k = 0; k < len; ++k) {
    const int64_t i = i0 + k;
    const float y = worker_y(x, error, mo, i);
    if (birder_quantize(y, u[k], error[i])) bits[i >> 3] |= static_cast<uint8_t>(1u << (i & 7));
  }
}

inline float server_s(const uint8_t* const* bits, int nranks, const float* error, int64_t i) {
  int ones = 0;
  for (int r = 0; r < nranks; ++r) ones += bit_of(bits[r], i);
  return birder_server_value(ones, nranks, error[i]);
}

void server_scalar(const uint8_t* const* bits, int nranks, float* error, int64_t i0, int64_t len,
                   const float* u, uint8_t* out) {
  for (int64_t k = 0; k < len; ++k) {
    const int64_t i = i0 + k;
    if (birder_quantize(server_s(bits, nranks, error, i), u[k], error[i]))
      out[i >> 3] |= static_cast<uint8_t>(1u << (i & 7));
  }
}

#if HVDC_STOCHASTIC_AVX2
// Asks for the data of the next tile (elements i + kTile...), so that it streams in while this tile
// is quantized and the next tile's uniforms are computed (registers and L1 only) instead of after.
// The address is computed as an integer: it may lie past the end of an array, where a prefetch is
// harmless but pointer arithmetic would not be.
template <typename... Arrays>
inline void prefetch_next_tile(int64_t i, const Arrays*... arrays) {
  (_mm_prefetch(reinterpret_cast<const char*>(reinterpret_cast<uintptr_t>(arrays + i) + kTile * sizeof(Arrays)),
                _MM_HINT_T0),
   ...);
}

// Q of eight values: the byte of bits, and the new errors stored at `error`.
HVDC_AVX2_ONLY inline uint8_t quantize8(__m256 y, const float* u, float* error) {
  const __m256 one = _mm256_set1_ps(1.0f);
  const __m256 p = _mm256_mul_ps(_mm256_add_ps(y, one), _mm256_set1_ps(0.5f));
  const __m256 plus = _mm256_cmp_ps(_mm256_loadu_ps(u), p, _CMP_LT_OQ);
  const __m256 q = _mm256_blendv_ps(_mm256_set1_ps(-1.0f), one, plus);
  _mm256_storeu_ps(error, _mm256_sub_ps(y, q));
  return static_cast<uint8_t>(_mm256_movemask_ps(plus));
}

// `i0` and `len` multiples of 8 (whole bytes).
HVDC_AVX2_ONLY void worker_avx2(const float* x, float* error, const BirderMoments* mo, int64_t i0,
                                int64_t len, const float* u, uint8_t* bits) {
  if (mo == nullptr) {
    for (int64_t k = 0; k < len; k += 8) {
      const int64_t i = i0 + k;
      prefetch_next_tile(i, x, error);
      const __m256 y = _mm256_add_ps(_mm256_loadu_ps(x + i), _mm256_loadu_ps(error + i));
      bits[i >> 3] = quantize8(y, u + k, error + i);
    }
    return;
  }
  const __m256 beta = _mm256_set1_ps(mo->beta), omb = _mm256_set1_ps(mo->one_minus_beta);
  const __m256 eps = _mm256_set1_ps(mo->eps);
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff));
  for (int64_t k = 0; k < len; k += 8) {
    const int64_t i = i0 + k;
    prefetch_next_tile(i, x, error, mo->m, mo->b);
    const __m256 a = _mm256_loadu_ps(x + i);
    const __m256 m = _mm256_add_ps(_mm256_mul_ps(beta, _mm256_loadu_ps(mo->m + i)), _mm256_mul_ps(omb, a));
    const __m256 b = _mm256_add_ps(_mm256_mul_ps(beta, _mm256_loadu_ps(mo->b + i)),
                                   _mm256_mul_ps(omb, _mm256_and_ps(a, abs_mask)));
    _mm256_storeu_ps(mo->m + i, m);
    _mm256_storeu_ps(mo->b + i, b);
    const __m256 y = _mm256_add_ps(_mm256_div_ps(m, _mm256_add_ps(b, eps)), _mm256_loadu_ps(error + i));
    bits[i >> 3] = quantize8(y, u + k, error + i);
  }
}

HVDC_AVX2_ONLY void server_avx2(const uint8_t* const* bits, int nranks, float* error, int64_t i0,
                                int64_t len, const float* u, uint8_t* out) {
  const __m256i lane_bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
  const __m256 n = _mm256_set1_ps(static_cast<float>(nranks));
  const __m256i minus_n = _mm256_set1_epi32(-nranks);
  for (int64_t k = 0; k < len; k += 8) {
    const int64_t i = i0 + k;
    prefetch_next_tile(i, static_cast<const float*>(error));
    __m256i ones = _mm256_setzero_si256();
    for (int r = 0; r < nranks; ++r) {
      const __m256i byte = _mm256_set1_epi32(bits[r][i >> 3]);
      // A set bit gives -1 in its lane (compare), so `ones` counts down; negated below.
      ones = _mm256_add_epi32(ones, _mm256_cmpeq_epi32(_mm256_and_si256(byte, lane_bit), lane_bit));
    }
    // 2 * ones - n with ones = -count: -2 * count... written as (-count) * -2 - n.
    const __m256i twice = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_add_epi32(ones, ones));
    const __m256 s = _mm256_add_ps(_mm256_div_ps(_mm256_cvtepi32_ps(_mm256_add_epi32(twice, minus_n)), n),
                                   _mm256_loadu_ps(error + i));
    out[i >> 3] = quantize8(s, u + k, error + i);
  }
}

HVDC_AVX2_ONLY void unpack_avx2(const uint8_t* bits, float* out, int64_t n8) {
  const __m256i lane_bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
  const __m256 one = _mm256_set1_ps(1.0f), minus = _mm256_set1_ps(-1.0f);
  for (int64_t i = 0; i < n8; i += 8) {
    const __m256i byte = _mm256_set1_epi32(bits[i >> 3]);
    const __m256 set = _mm256_castsi256_ps(_mm256_cmpeq_epi32(_mm256_and_si256(byte, lane_bit), lane_bit));
    _mm256_storeu_ps(out + i, _mm256_blendv_ps(minus, one, set));
  }
}
#endif

// Runs `body(i0, len, uniforms)` over [0, n_real) in tiles; the AVX2 bodies need whole bytes, so
// the last partial byte goes to `tail` (scalar).
template <typename Vector, typename Scalar>
void tiles(int64_t n_real, const UniformSource& u, KernelChoice choice, Vector vector,
           Scalar scalar) {
  alignas(32) float tile[kTile];
  const bool avx2 = use_avx2(choice);
  for (int64_t i0 = 0; i0 < n_real; i0 += kTile) {
    const int64_t len = std::min(kTile, n_real - i0);
    const float* uni = uniforms_of(u, i0, len, tile);
    const int64_t whole = avx2 ? len / 8 * 8 : 0;
    if (whole > 0) vector(i0, whole, uni);
    if (whole < len) scalar(i0 + whole, len - whole, uni + whole);
  }
}

}  // namespace

void stochastic_quantize(const float* x, float* error, const BirderMoments* moments,
                         int64_t n_real, int64_t n_padded, const UniformSource& u, uint8_t* bits,
                         KernelChoice choice) {
  // Bytes that the scalar path ORs into, and the padding, start at 0 (the AVX2 path writes whole
  // bytes, which it also clears).
  std::memset(bits, 0, static_cast<size_t>(n_padded / 8));
  tiles(
      n_real, u, choice,
      [&](int64_t i0, int64_t len, const float* uni) {
#if HVDC_STOCHASTIC_AVX2
        worker_avx2(x, error, moments, i0, len, uni, bits);
#else
        worker_scalar(x, error, moments, i0, len, uni, bits);
#endif
      },
      [&](int64_t i0, int64_t len, const float* uni) {
        worker_scalar(x, error, moments, i0, len, uni, bits);
      });
}

void stochastic_server_quantize(const uint8_t* const* bits, int nranks, float* error,
                                int64_t n_real, int64_t n_padded, const UniformSource& u,
                                uint8_t* out_bits, KernelChoice choice) {
  std::memset(out_bits, 0, static_cast<size_t>(n_padded / 8));
  tiles(
      n_real, u, choice,
      [&](int64_t i0, int64_t len, const float* uni) {
#if HVDC_STOCHASTIC_AVX2
        server_avx2(bits, nranks, error, i0, len, uni, out_bits);
#else
        server_scalar(bits, nranks, error, i0, len, uni, out_bits);
#endif
      },
      [&](int64_t i0, int64_t len, const float* uni) {
        server_scalar(bits, nranks, error, i0, len, uni, out_bits);
      });
}

void sign_unpack(const uint8_t* bits, float* out, int64_t n, KernelChoice choice) {
  int64_t i = 0;
#if HVDC_STOCHASTIC_AVX2
  if (use_avx2(choice)) {
    i = n / 8 * 8;
    unpack_avx2(bits, out, i);
  }
#endif
  for (; i < n; ++i) out[i] = onebit_pick(bit_of(bits, i), 1.0f, -1.0f);
}

int64_t first_nonfinite_f32(const float* x, int64_t n) {
  // Blocks with a branch-free test of the exponent bits (an integer OR vectorizes; a float sum does not
  // without reassociation, and a per-element exit does not at all), the index found in the block.
  constexpr int64_t kBlock = 1024;
  for (int64_t lo = 0; lo < n; lo += kBlock) {
    const int64_t hi = std::min(lo + kBlock, n);
    uint32_t bad = 0;
    for (int64_t i = lo; i < hi; ++i) {
      uint32_t u;
      std::memcpy(&u, x + i, sizeof u);
      bad |= static_cast<uint32_t>((u & 0x7f800000u) == 0x7f800000u);  // exponent all ones: Inf or NaN
    }
    if (bad)
      for (int64_t i = lo; i < hi; ++i)
        if (!std::isfinite(x[i])) return i;
  }
  return -1;
}

const char* stochastic_kernel_isa() { return use_avx2(KernelChoice::kAuto) ? "avx2" : "scalar"; }

}  // namespace hvdc
