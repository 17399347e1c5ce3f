// 1-bit kernels (see hvdc/onebit_kernels.h for the wire format and the rounding points): a
// portable scalar version of each, and an AVX2 (+F16C) version chosen at run time. Both run the
// same float32 operations in the same order per element, so they produce the same bytes; only
// the order of the double sum of squares differs (harmless, see the header).
//
// Layout of the code: a "source" gives the value v[i] that the compensated value c = v[i] + e[i]
// is built from (the buffer element widened to float32 for the worker step; acc[i] / n, or the
// sum over ranks of +/-scale_r divided by n, for the server step). The two passes (signs and sum
// of squares; error update) are written once per implementation over any source. The AVX2 loops
// take 32 elements (one 32-bit word of bits, four 8-lane vectors) per iteration; the scalar code
// finishes the last < 32 elements, so both implementations share the tail.
#include "hvdc/onebit_kernels.h"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>

#include "hvdc/elementwise/onebit.h"
#include "hvdc/errors.h"
#include "hvdc/packed_chunk.h"
#include "hvdc/kernel_isa.h"

#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#include <immintrin.h>
#define HVDC_ONEBIT_AVX2 1
#define HVDC_AVX2 __attribute__((target("avx2,f16c,fma")))
#else
#define HVDC_ONEBIT_AVX2 0
#endif

namespace hvdc {
namespace {

enum class Isa { kScalar, kAvx2 };

// AVX2 where the CPU has it, unless the caller's choice (the runtime's configuration,
// hvdc/kernel_isa.h) asks for the portable code.
Isa active_isa(KernelChoice choice) {
#if HVDC_ONEBIT_AVX2
  return use_avx2_kernels(choice) ? Isa::kAvx2 : Isa::kScalar;
#else
  (void)choice;
  return Isa::kScalar;
#endif
}

#if HVDC_ONEBIT_AVX2
// Streams read one core's memory bandwidth only with more misses in flight than the hardware
// prefetcher keeps: the loops below ask for the data kPrefetch elements ahead (past the end of
// an array it is harmless: a prefetch never faults).
constexpr int64_t kPrefetch = 512;
inline void prefetch_line(const void* p) {
  _mm_prefetch(static_cast<const char*>(p), _MM_HINT_T0);
}
inline void prefetch32(const float* p) {  // 32 floats: two 64-byte lines
  prefetch_line(p);
  prefetch_line(p + 16);
}
#endif

// ---------------------------------------------------------------------------------------------
// Sources. value(i): the scalar value; load32(i, v) (AVX2 only): v[k] = values i + 8k ..
// i + 8k + 7.

struct SrcF32 {
  const float* p;
  float value(int64_t i) const { return p[i]; }
#if HVDC_ONEBIT_AVX2
  HVDC_AVX2 void load32(int64_t i, __m256* v) const {
    for (int k = 0; k < 4; ++k) v[k] = _mm256_loadu_ps(p + i + 8 * k);
  }
  HVDC_AVX2 void prefetch(int64_t i) const { prefetch32(p + i); }
#endif
};

struct SrcF16 {
  const uint16_t* p;
  float value(int64_t i) const { return half_to_float(p[i]); }
#if HVDC_ONEBIT_AVX2
  HVDC_AVX2 void load32(int64_t i, __m256* v) const {  // F16C: exact widening
    for (int k = 0; k < 4; ++k)
      v[k] = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p + i + 8 * k)));
  }
  HVDC_AVX2 void prefetch(int64_t i) const { prefetch_line(p + i); }
#endif
};

struct SrcBF16 {
  const uint16_t* p;
  float value(int64_t i) const { return bf16_to_float(p[i]); }
#if HVDC_ONEBIT_AVX2
  HVDC_AVX2 void load32(int64_t i, __m256* v) const {  // bfloat16 is the top half of a float32
    for (int k = 0; k < 4; ++k) {
      const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + i + 8 * k));
      v[k] = _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
    }
  }
  HVDC_AVX2 void prefetch(int64_t i) const { prefetch_line(p + i); }
#endif
};

// Division by the rank count (OneBitDivide, hvdc/elementwise/onebit.h), eight lanes at a time.
struct DivideBy : OneBitDivide {
  using OneBitDivide::OneBitDivide;
  using OneBitDivide::operator();
#if HVDC_ONEBIT_AVX2
  HVDC_AVX2 __m256 operator()(__m256 a) const {
    return pow2 ? _mm256_mul_ps(a, _mm256_set1_ps(inv)) : _mm256_div_ps(a, _mm256_set1_ps(n));
  }
#endif
};

struct SrcAccDiv {  // server step from an accumulated buffer: acc[i] / n
  const float* acc;
  DivideBy div;
  float value(int64_t i) const { return div(acc[i]); }
#if HVDC_ONEBIT_AVX2
  HVDC_AVX2 void load32(int64_t i, __m256* v) const {
    for (int k = 0; k < 4; ++k) v[k] = div(_mm256_loadu_ps(acc + i + 8 * k));
  }
  HVDC_AVX2 void prefetch(int64_t i) const { prefetch32(acc + i); }
#endif
};

#if HVDC_ONEBIT_AVX2
inline uint32_t load_word(const uint8_t* bits, int64_t i) {  // the 32 bits of elements i..i+31
  uint32_t w;
  std::memcpy(&w, bits + (i >> 3), 4);
  return w;
}

// Bit 8k + j of a 32-bit word, broadcast to every lane, moved to the sign position (bit 31) of
// lane j of vector k: shift left by 31 - (8k + j).
struct SignBits {
  __m256i shift[4];
  HVDC_AVX2 SignBits() {
    for (int k = 0; k < 4; ++k)
      shift[k] = _mm256_sub_epi32(_mm256_set1_epi32(31 - 8 * k),
                                  _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
  // Lane j of v[k] is `pos` if bit 8k + j of `word` is set, else -pos (a sign flip: exact).
  HVDC_AVX2 void select(uint32_t word, float pos, __m256* v) const {
    const __m256i w = _mm256_set1_epi32(static_cast<int>(word));
    const __m256i neg = _mm256_castps_si256(_mm256_set1_ps(-pos));
    const __m256i sign = _mm256_set1_epi32(static_cast<int>(0x80000000u));
    for (int k = 0; k < 4; ++k)
      v[k] = _mm256_castsi256_ps(
          _mm256_xor_si256(neg, _mm256_and_si256(_mm256_sllv_epi32(w, shift[k]), sign)));
  }
};
#endif

// Fused server step: (sum over ranks of +/-scale_r, in rank order, from 0.0f) / n. With N > 0 the
// rank count is N, known at compile time, and the pointers and scales are held by value (so the
// loops keep them in registers); N == 0 takes any count from the arrays.
template <int N>
struct SrcBitsSum {
  static constexpr int kHeld = N > 0 ? N : 1;
  const uint8_t* const* bits;
  const float* scales;
  int nranks;
  DivideBy div;
  const uint8_t* held_bits[kHeld];
  float held_scale[kHeld];

  SrcBitsSum(const uint8_t* const* b, const float* s, int n)
      : bits(b), scales(s), nranks(n), div(n) {
    for (int r = 0; r < kHeld; ++r) {
      held_bits[r] = N > 0 ? b[r] : nullptr;
      held_scale[r] = N > 0 ? s[r] : 0.0f;
    }
  }
  int count() const { return N > 0 ? N : nranks; }
  const uint8_t* bits_of(int r) const { return N > 0 ? held_bits[r] : bits[r]; }
  float scale_of(int r) const { return N > 0 ? held_scale[r] : scales[r]; }

  float value(int64_t i) const {
    float acc = 0.0f;
    for (int r = 0; r < count(); ++r) acc = onebit_add_rank(acc, bit_of(bits_of(r), i), scale_of(r));
    return div(acc);
  }
#if HVDC_ONEBIT_AVX2
  HVDC_AVX2 void load32(int64_t i, __m256* v) const {
    const SignBits sb;
    for (int k = 0; k < 4; ++k) v[k] = _mm256_setzero_ps();
    for (int r = 0; r < count(); ++r) {
      __m256 t[4];
      sb.select(load_word(bits_of(r), i), scale_of(r), t);
      for (int k = 0; k < 4; ++k) v[k] = _mm256_add_ps(v[k], t[k]);
    }
    for (int k = 0; k < 4; ++k) v[k] = div(v[k]);
  }
  HVDC_AVX2 void prefetch(int64_t) const {}  // a few bytes per rank: the hardware keeps up
#endif
};

// ---------------------------------------------------------------------------------------------
// The two passes, scalar. Both start at element `lo` (a multiple of 8) so that the AVX2 versions
// can hand them their tail.

// Pass 1: bytes lo / 8 .. ceil(n_real / 8) - 1 of `bits` (bits of positions >= n_real are 0) and
// the double sum of squares of c over [lo, n_real). With kStoreC, c is also written to c_out[i]
// (the server step passes its error buffer, and pass 2 reads c there instead of recomputing it);
// without, c_out is unused and the pass only reads.
// The sum of squares goes to the four scalar accumulators of `acc` (OneBitSumSq), so that a chunk
// split into pieces accumulates the very same double operations as the whole chunk in one call.
template <bool kStoreC, typename Src>
void signs_scalar(const Src& src, const float* error, float* c_out, int64_t lo, int64_t n_real,
                  uint8_t* bits, OneBitSumSq& acc) {
  double* s = acc.tail;
  for (int64_t b = lo >> 3; 8 * b < n_real; ++b) {
    const int64_t base = 8 * b;
    const int m = n_real - base < 8 ? static_cast<int>(n_real - base) : 8;
    unsigned byte = 0;
    for (int j = 0; j < m; ++j) {
      const float c = onebit_compensated(src.value(base + j), error[base + j]);
      if (kStoreC) c_out[base + j] = c;
      byte |= static_cast<unsigned>(onebit_sign(c)) << j;
      s[j & 3] += onebit_square(c);
    }
    bits[b] = static_cast<uint8_t>(byte);
  }
}

// Pass 2: error = c - (+/-scale) over [lo, n_real); c = error[i] if pass 1 stored it.
template <bool kStoredC, typename Src>
void error_scalar(const Src& src, float* error, int64_t lo, int64_t n_real, float scale) {
  for (int64_t i = lo; i < n_real; ++i) {
    const float c = kStoredC ? error[i] : onebit_compensated(src.value(i), error[i]);
    error[i] = onebit_error(c, scale);
  }
}

#if HVDC_ONEBIT_AVX2
// The vector accumulators start from and return to acc.lanes, the scalar tail goes to acc.tail
// (see signs_scalar).
template <bool kStoreC, typename Src>
HVDC_AVX2 void signs_avx2(const Src& source, const float* error, float* c_out, int64_t n_real,
                          uint8_t* bits, OneBitSumSq& acc) {
  const Src src = source;  // a local copy: stores through `error` cannot alias it
  const __m256 zero = _mm256_setzero_ps();
  __m256d s0 = _mm256_loadu_pd(acc.lanes), s1 = _mm256_loadu_pd(acc.lanes + 4),
          s2 = _mm256_loadu_pd(acc.lanes + 8), s3 = _mm256_loadu_pd(acc.lanes + 12);
  int64_t i = 0;
  for (; i + 32 <= n_real; i += 32) {
    src.prefetch(i + kPrefetch);
    prefetch32(error + i + kPrefetch);
    __m256 v[4];
    src.load32(i, v);
    __m256 c[4];
    uint32_t word = 0;
    for (int k = 0; k < 4; ++k) {
      c[k] = _mm256_add_ps(v[k], _mm256_loadu_ps(error + i + 8 * k));
      if (kStoreC) _mm256_storeu_ps(c_out + i + 8 * k, c[k]);
      word |= static_cast<uint32_t>(_mm256_movemask_ps(_mm256_cmp_ps(c[k], zero, _CMP_GE_OQ)))
              << (8 * k);
    }
    std::memcpy(bits + (i >> 3), &word, 4);
    // Squares of float32 values are exact in double, so fma(c, c, s) rounds once, as s + c * c
    // does; four accumulators, two fmas each.
    const __m256d lo0 = _mm256_cvtps_pd(_mm256_castps256_ps128(c[0]));
    const __m256d hi0 = _mm256_cvtps_pd(_mm256_extractf128_ps(c[0], 1));
    const __m256d lo1 = _mm256_cvtps_pd(_mm256_castps256_ps128(c[1]));
    const __m256d hi1 = _mm256_cvtps_pd(_mm256_extractf128_ps(c[1], 1));
    const __m256d lo2 = _mm256_cvtps_pd(_mm256_castps256_ps128(c[2]));
    const __m256d hi2 = _mm256_cvtps_pd(_mm256_extractf128_ps(c[2], 1));
    const __m256d lo3 = _mm256_cvtps_pd(_mm256_castps256_ps128(c[3]));
    const __m256d hi3 = _mm256_cvtps_pd(_mm256_extractf128_ps(c[3], 1));
    s0 = _mm256_fmadd_pd(hi0, hi0, _mm256_fmadd_pd(lo0, lo0, s0));
    s1 = _mm256_fmadd_pd(hi1, hi1, _mm256_fmadd_pd(lo1, lo1, s1));
    s2 = _mm256_fmadd_pd(hi2, hi2, _mm256_fmadd_pd(lo2, lo2, s2));
    s3 = _mm256_fmadd_pd(hi3, hi3, _mm256_fmadd_pd(lo3, lo3, s3));
  }
  _mm256_storeu_pd(acc.lanes, s0);
  _mm256_storeu_pd(acc.lanes + 4, s1);
  _mm256_storeu_pd(acc.lanes + 8, s2);
  _mm256_storeu_pd(acc.lanes + 12, s3);
  signs_scalar<kStoreC>(src, error, c_out, i, n_real, bits, acc);
}

// The one sum of the accumulators, in the order the single-call kernels always summed them:
// the four vectors lane-wise ((s0 + s1) + (s2 + s3)), their lanes ((l0 + l1) + (l2 + l3)),
// then the scalar tail ((t0 + t1) + (t2 + t3)).
HVDC_AVX2 double finish_avx2(const OneBitSumSq& acc) {
  const __m256d s = _mm256_add_pd(
      _mm256_add_pd(_mm256_loadu_pd(acc.lanes), _mm256_loadu_pd(acc.lanes + 4)),
      _mm256_add_pd(_mm256_loadu_pd(acc.lanes + 8), _mm256_loadu_pd(acc.lanes + 12)));
  alignas(32) double lanes[4];
  _mm256_store_pd(lanes, s);
  const double* t = acc.tail;
  return ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((t[0] + t[1]) + (t[2] + t[3]));
}

template <bool kStoredC, typename Src>
HVDC_AVX2 void error_avx2(const Src& source, float* error, int64_t n_real, float scale) {
  const Src src = source;  // a local copy: stores through `error` cannot alias it
  // c + scale equals c - (-scale) exactly: e = c - (c >= 0 ? scale : -scale), the sign of the
  // subtrahend flipped by the comparison mask's sign bit.
  const __m256 zero = _mm256_setzero_ps(), neg = _mm256_set1_ps(-scale);
  const __m256 sign = _mm256_castsi256_ps(_mm256_set1_epi32(static_cast<int>(0x80000000u)));
  int64_t i = 0;
  for (; i + 32 <= n_real; i += 32) {
    if (!kStoredC) src.prefetch(i + kPrefetch);
    prefetch32(error + i + kPrefetch);
    __m256 v[4];
    if (!kStoredC) src.load32(i, v);
    for (int k = 0; k < 4; ++k) {
      float* e = error + i + 8 * k;
      const __m256 c = kStoredC ? _mm256_loadu_ps(e) : _mm256_add_ps(v[k], _mm256_loadu_ps(e));
      const __m256 nonneg = _mm256_cmp_ps(c, zero, _CMP_GE_OQ);
      const __m256 sub = _mm256_xor_ps(neg, _mm256_and_ps(nonneg, sign));
      _mm256_storeu_ps(e, _mm256_sub_ps(c, sub));
    }
  }
  error_scalar<kStoredC>(src, error, i, n_real, scale);
}
#endif

// The scalar implementation's sum: only the tail accumulators were used.
double finish_scalar(const OneBitSumSq& acc) {
  const double* t = acc.tail;
  return (t[0] + t[1]) + (t[2] + t[3]);
}

double finish(Isa isa, const OneBitSumSq& acc) {
#if HVDC_ONEBIT_AVX2
  if (isa == Isa::kAvx2) return finish_avx2(acc);
#endif
  (void)isa;
  return finish_scalar(acc);
}

// Pass 1 over one piece of a chunk (or the whole chunk) with `isa`, padding bytes zeroed, the sum
// of squares added to `acc`. kStoreC, c_out: see signs_scalar.
template <bool kStoreC = false, typename Src>
void signs_into(Isa isa, const Src& src, const float* error, float* c_out, int64_t n_real,
                int64_t n_padded, uint8_t* bits, OneBitSumSq& acc) {
#if HVDC_ONEBIT_AVX2
  if (isa == Isa::kAvx2)
    signs_avx2<kStoreC>(src, error, c_out, n_real, bits, acc);
  else
#endif
    signs_scalar<kStoreC>(src, error, c_out, 0, n_real, bits, acc);
  const int64_t written = (n_real + 7) / 8;
  if (written < n_padded / 8)
    std::memset(bits + written, 0, static_cast<size_t>(n_padded / 8 - written));
}

// Pass 1 over a whole chunk: its double sum of squares.
template <bool kStoreC = false, typename Src>
double signs(Isa isa, const Src& src, const float* error, float* c_out, int64_t n_real,
             int64_t n_padded, uint8_t* bits) {
  OneBitSumSq acc;
  signs_into<kStoreC>(isa, src, error, c_out, n_real, n_padded, bits, acc);
  return finish(isa, acc);
}

template <bool kStoredC = false, typename Src>
void update_error(Isa isa, const Src& src, float* error, int64_t n_real, float scale) {
#if HVDC_ONEBIT_AVX2
  if (isa == Isa::kAvx2) return error_avx2<kStoredC>(src, error, n_real, scale);
#endif
  (void)isa;
  error_scalar<kStoredC>(src, error, 0, n_real, scale);
}

[[noreturn]] void unsupported(DType dtype) {
  throw UsageError(std::string("1-bit compression is not defined for ") + dtype_name(dtype) +
                   "; use float32, float16 or bfloat16");
}

template <typename F>
auto dispatch(DType dtype, const void* x, F&& f) {
  switch (dtype) {
    case DType::kFloat32: return f(SrcF32{static_cast<const float*>(x)});
    case DType::kFloat16: return f(SrcF16{static_cast<const uint16_t*>(x)});
    case DType::kBFloat16: return f(SrcBF16{static_cast<const uint16_t*>(x)});
    default: break;
  }
  unsupported(dtype);
}

// ---------------------------------------------------------------------------------------------
// Non-finite scan: blocks of 1024, a branch-free test per block, the index found in the block.

template <typename Src>
int64_t first_nonfinite_in(const Src& src, const float* error, int64_t lo, int64_t hi) {
  for (int64_t i = lo; i < hi; ++i) {
    const float c = onebit_compensated(src.value(i), error[i]);
    if (!std::isfinite(c)) return i;
  }
  return -1;
}

template <typename Src>
int64_t first_nonfinite_scalar(const Src& src, const float* error, int64_t n) {
  constexpr int64_t kBlock = 1024;
  for (int64_t lo = 0; lo < n; lo += kBlock) {
    const int64_t hi = lo + kBlock < n ? lo + kBlock : n;
    int bad = 0;
    for (int64_t i = lo; i < hi; ++i) {
      const uint32_t u = float_bits(onebit_compensated(src.value(i), error[i]));
      bad |= (u & 0x7f800000u) == 0x7f800000u;  // exponent all ones: Inf or NaN
    }
    if (bad) return first_nonfinite_in(src, error, lo, hi);
  }
  return -1;
}

#if HVDC_ONEBIT_AVX2
template <typename Src>
HVDC_AVX2 int64_t first_nonfinite_avx2(const Src& src, const float* error, int64_t n) {
  constexpr int64_t kBlock = 1024;  // a multiple of 32
  const __m256i exp = _mm256_set1_epi32(0x7f800000);
  int64_t lo = 0;
  for (; lo + kBlock <= n; lo += kBlock) {
    __m256i bad = _mm256_setzero_si256();
    for (int64_t i = lo; i < lo + kBlock; i += 32) {
      __m256 v[4];
      src.load32(i, v);
      for (int k = 0; k < 4; ++k) {
        const __m256 e = _mm256_loadu_ps(error + i + 8 * k);
        const __m256i c = _mm256_castps_si256(_mm256_add_ps(v[k], e));
        bad = _mm256_or_si256(bad, _mm256_cmpeq_epi32(_mm256_and_si256(c, exp), exp));
      }
    }
    if (!_mm256_testz_si256(bad, bad)) return first_nonfinite_in(src, error, lo, lo + kBlock);
  }
  return first_nonfinite_in(src, error, lo, n);
}
#endif

int64_t first_nonfinite(Isa isa, const void* x, DType dtype, const float* error, int64_t n) {
  return dispatch(dtype, x, [&](const auto& src) -> int64_t {
#if HVDC_ONEBIT_AVX2
    if (isa == Isa::kAvx2) return first_nonfinite_avx2(src, error, n);
#endif
    (void)isa;
    return first_nonfinite_scalar(src, error, n);
  });
}

// ---------------------------------------------------------------------------------------------
// Accumulate and decompress: bits to +/-scale.

void accumulate_scalar(const uint8_t* bits, float scale, float* acc, int64_t lo, int64_t n_real) {
  for (int64_t i = lo; i < n_real; ++i) acc[i] = onebit_add_rank(acc[i], bit_of(bits, i), scale);
}

// Writes the two patterns of `out` (T = float or uint16_t) for bit 1 and bit 0.
template <typename T>
void decompress_scalar(const uint8_t* bits, T pos, T neg, T* out, int64_t lo, int64_t n_real) {
  for (int64_t i = lo; i < n_real; ++i) out[i] = onebit_pick(bit_of(bits, i), pos, neg);
}

#if HVDC_ONEBIT_AVX2
HVDC_AVX2 void accumulate_avx2(const uint8_t* bits, float scale, float* acc, int64_t n_real) {
  const SignBits sb;
  int64_t i = 0;
  for (; i + 32 <= n_real; i += 32) {
    __m256 t[4];
    sb.select(load_word(bits, i), scale, t);
    for (int k = 0; k < 4; ++k) {
      float* a = acc + i + 8 * k;
      _mm256_storeu_ps(a, _mm256_add_ps(_mm256_loadu_ps(a), t[k]));
    }
  }
  accumulate_scalar(bits, scale, acc, i, n_real);
}

// float32 result: the select of accumulate with the float scale (its two patterns are exactly
// +scale and -scale).
HVDC_AVX2 void decompress32_avx2(const uint8_t* bits, float scale, float* out, int64_t n_real) {
  const SignBits sb;
  int64_t i = 0;
  for (; i + 32 <= n_real; i += 32) {
    __m256 t[4];
    sb.select(load_word(bits, i), scale, t);
    for (int k = 0; k < 4; ++k) _mm256_storeu_ps(out + i + 8 * k, t[k]);
  }
  decompress_scalar(bits, scale, -scale, out, i, n_real);
}

HVDC_AVX2 void decompress16_avx2(const uint8_t* bits, uint16_t pos, uint16_t neg, uint16_t* out,
                                 int64_t n_real) {
  const __m256i p = _mm256_set1_epi16(static_cast<short>(pos));
  const __m256i q = _mm256_set1_epi16(static_cast<short>(neg));
  const __m256i pq = _mm256_xor_si256(p, q);  // q ^ (p ^ q) = p where the bit is set
  const __m256i bit = _mm256_setr_epi16(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096,
                                        8192, 16384, static_cast<short>(0x8000));
  int64_t i = 0;
  for (; i + 32 <= n_real; i += 32) {
    const uint32_t word = load_word(bits, i);
    for (int k = 0; k < 2; ++k) {
      const __m256i w = _mm256_set1_epi16(static_cast<short>(word >> (16 * k)));
      const __m256i m = _mm256_cmpeq_epi16(_mm256_and_si256(w, bit), bit);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i + 16 * k),
                          _mm256_xor_si256(q, _mm256_and_si256(m, pq)));
    }
  }
  decompress_scalar(bits, pos, neg, out, i, n_real);
}
#endif

void accumulate(Isa isa, const uint8_t* bits, float scale, float* acc, int64_t n_real) {
#if HVDC_ONEBIT_AVX2
  if (isa == Isa::kAvx2) return accumulate_avx2(bits, scale, acc, n_real);
#endif
  (void)isa;
  accumulate_scalar(bits, scale, acc, 0, n_real);
}

// The result takes only two values, +/-scale rounded once to the buffer dtype: the kernels copy
// their bit patterns.
void decompress(Isa isa, const uint8_t* bits, float scale, void* out, DType dtype,
                int64_t n_real) {
  if (dtype == DType::kFloat32) {
    auto* o = static_cast<float*>(out);
#if HVDC_ONEBIT_AVX2
    if (isa == Isa::kAvx2) return decompress32_avx2(bits, scale, o, n_real);
#endif
    return decompress_scalar(bits, scale, -scale, o, 0, n_real);
  }
  if (!is_half(dtype)) unsupported(dtype);
  const bool f16 = dtype == DType::kFloat16;
  const uint16_t pos = f16 ? float_to_half(scale) : float_to_bf16(scale);
  const uint16_t neg = f16 ? float_to_half(-scale) : float_to_bf16(-scale);
  auto* o = static_cast<uint16_t*>(out);
#if HVDC_ONEBIT_AVX2
  if (isa == Isa::kAvx2) return decompress16_avx2(bits, pos, neg, o, n_real);
#endif
  (void)isa;
  decompress_scalar(bits, pos, neg, o, 0, n_real);
}

// ---------------------------------------------------------------------------------------------
// Pass 2 of the worker step fused with the result of the same chunk (one pass over the buffer
// instead of two): error = c - (+/-wscale) with c = x + error, then x = bit ? pos : neg (the
// result's two bit patterns in the buffer dtype). x is read before it is overwritten.

template <typename Src, typename T>
void error_result_scalar(const Src& src, float* error, float wscale, const uint8_t* bits, T pos,
                         T neg, T* out, int64_t lo, int64_t n_real) {
  for (int64_t i = lo; i < n_real; ++i) {
    error[i] = onebit_error(onebit_compensated(src.value(i), error[i]), wscale);
    out[i] = onebit_pick(bit_of(bits, i), pos, neg);
  }
}

#if HVDC_ONEBIT_AVX2
// The error half of error_avx2 on 32 elements whose values are v.
HVDC_AVX2 inline void error32_avx2(const __m256* v, float* error, __m256 neg) {
  const __m256 zero = _mm256_setzero_ps();
  const __m256 sign = _mm256_castsi256_ps(_mm256_set1_epi32(static_cast<int>(0x80000000u)));
  for (int k = 0; k < 4; ++k) {
    float* e = error + 8 * k;
    const __m256 c = _mm256_add_ps(v[k], _mm256_loadu_ps(e));
    const __m256 nonneg = _mm256_cmp_ps(c, zero, _CMP_GE_OQ);
    _mm256_storeu_ps(e, _mm256_sub_ps(c, _mm256_xor_ps(neg, _mm256_and_ps(nonneg, sign))));
  }
}

HVDC_AVX2 void error_result_f32_avx2(const float* x, float* error, float wscale,
                                     const uint8_t* bits, float rscale, float* out,
                                     int64_t n_real) {
  const SrcF32 src{x};
  const SignBits sb;
  const __m256 neg = _mm256_set1_ps(-wscale);
  int64_t i = 0;
  for (; i + 32 <= n_real; i += 32) {
    src.prefetch(i + kPrefetch);
    prefetch32(error + i + kPrefetch);
    __m256 v[4], t[4];
    src.load32(i, v);
    error32_avx2(v, error + i, neg);
    sb.select(load_word(bits, i), rscale, t);
    for (int k = 0; k < 4; ++k) _mm256_storeu_ps(out + i + 8 * k, t[k]);
  }
  error_result_scalar(src, error, wscale, bits, rscale, -rscale, out, i, n_real);
}

template <typename Src>
HVDC_AVX2 void error_result_16_avx2(const Src& source, float* error, float wscale,
                                    const uint8_t* bits, uint16_t pos, uint16_t neg,
                                    uint16_t* out, int64_t n_real) {
  const Src src = source;
  const __m256 negw = _mm256_set1_ps(-wscale);
  const __m256i p = _mm256_set1_epi16(static_cast<short>(pos));
  const __m256i q = _mm256_set1_epi16(static_cast<short>(neg));
  const __m256i pq = _mm256_xor_si256(p, q);
  const __m256i bit = _mm256_setr_epi16(1, 2, 4, 8, 16, 32, 64, 128, 256, 512, 1024, 2048, 4096,
                                        8192, 16384, static_cast<short>(0x8000));
  int64_t i = 0;
  for (; i + 32 <= n_real; i += 32) {
    src.prefetch(i + kPrefetch);
    prefetch32(error + i + kPrefetch);
    __m256 v[4];
    src.load32(i, v);
    error32_avx2(v, error + i, negw);
    const uint32_t word = load_word(bits, i);
    for (int k = 0; k < 2; ++k) {
      const __m256i w = _mm256_set1_epi16(static_cast<short>(word >> (16 * k)));
      const __m256i m = _mm256_cmpeq_epi16(_mm256_and_si256(w, bit), bit);
      _mm256_storeu_si256(reinterpret_cast<__m256i*>(out + i + 16 * k),
                          _mm256_xor_si256(q, _mm256_and_si256(m, pq)));
    }
  }
  error_result_scalar(src, error, wscale, bits, pos, neg, out, i, n_real);
}
#endif

void compress_error_result(Isa isa, void* x, DType dtype, float* error, int64_t n_real,
                           float wscale, const uint8_t* bits, float rscale) {
  if (dtype == DType::kFloat32) {
    auto* o = static_cast<float*>(x);
#if HVDC_ONEBIT_AVX2
    if (isa == Isa::kAvx2) return error_result_f32_avx2(o, error, wscale, bits, rscale, o, n_real);
#endif
    return error_result_scalar(SrcF32{o}, error, wscale, bits, rscale, -rscale, o, 0, n_real);
  }
  if (!is_half(dtype)) unsupported(dtype);
  const bool f16 = dtype == DType::kFloat16;
  const uint16_t pos = f16 ? float_to_half(rscale) : float_to_bf16(rscale);
  const uint16_t neg = f16 ? float_to_half(-rscale) : float_to_bf16(-rscale);
  auto* o = static_cast<uint16_t*>(x);
  if (f16) {
#if HVDC_ONEBIT_AVX2
    if (isa == Isa::kAvx2)
      return error_result_16_avx2(SrcF16{o}, error, wscale, bits, pos, neg, o, n_real);
#endif
    return error_result_scalar(SrcF16{o}, error, wscale, bits, pos, neg, o, 0, n_real);
  }
#if HVDC_ONEBIT_AVX2
  if (isa == Isa::kAvx2)
    return error_result_16_avx2(SrcBF16{o}, error, wscale, bits, pos, neg, o, n_real);
#endif
  (void)isa;
  error_result_scalar(SrcBF16{o}, error, wscale, bits, pos, neg, o, 0, n_real);
}

// ---------------------------------------------------------------------------------------------
// The steps, with an explicit implementation (the public functions pass the ISA of the caller's choice).

double compress_signs(Isa isa, const void* x, DType dtype, const float* error, int64_t n_real,
                      int64_t n_padded, uint8_t* bits) {
  check_packed_chunk("1-bit", n_real, n_padded);
  return dispatch(dtype, x, [&](const auto& src) {
    return signs(isa, src, error, nullptr, n_real, n_padded, bits);
  });
}

void compress_error(Isa isa, const void* x, DType dtype, float* error, int64_t n_real,
                    float scale) {
  dispatch(dtype, x, [&](const auto& src) {
    update_error(isa, src, error, n_real, scale);
    return 0;
  });
}

float server_compress(Isa isa, const float* acc, int nranks, float* error, int64_t n_real,
                      int64_t n_padded, uint8_t* bits) {
  check_packed_chunk("1-bit", n_real, n_padded);
  const SrcAccDiv src{acc, DivideBy(nranks)};
  const float scale = onebit_scale(signs(isa, src, error, nullptr, n_real, n_padded, bits), n_real);
  update_error(isa, src, error, n_real, scale);
  return scale;
}

// Pass 1 of the fused server step over one piece (or all) of a chunk. The sum over ranks costs
// more to recompute than c costs to store: it stores c in `error` for pass 2.
void server_reduce_signs(Isa isa, const uint8_t* const* bits, const float* scales, int nranks,
                         float* error, int64_t n_real, int64_t n_padded, uint8_t* out_bits,
                         OneBitSumSq& acc) {
  check_packed_chunk("1-bit", n_real, n_padded);
  const auto run = [&](const auto& src) {
    signs_into<true>(isa, src, error, error, n_real, n_padded, out_bits, acc);
  };
  switch (nranks) {
    case 1: return run(SrcBitsSum<1>(bits, scales, nranks));
    case 2: return run(SrcBitsSum<2>(bits, scales, nranks));
    case 3: return run(SrcBitsSum<3>(bits, scales, nranks));
    case 4: return run(SrcBitsSum<4>(bits, scales, nranks));
    default: return run(SrcBitsSum<0>(bits, scales, nranks));
  }
}

// Pass 2 of the fused server step: c was stored in `error` by pass 1, so no source is read
// (SrcF32 only names a type for the template; kStoredC never reads it).
void server_stored_error(Isa isa, float* error, int64_t n_real, float scale) {
  update_error<true>(isa, SrcF32{error}, error, n_real, scale);
}

float server_reduce_compress(Isa isa, const uint8_t* const* bits, const float* scales, int nranks,
                             float* error, int64_t n_real, int64_t n_padded, uint8_t* out_bits) {
  OneBitSumSq acc;
  server_reduce_signs(isa, bits, scales, nranks, error, n_real, n_padded, out_bits, acc);
  const float scale = onebit_scale(finish(isa, acc), n_real);
  server_stored_error(isa, error, n_real, scale);
  return scale;
}

}  // namespace

int64_t onebit_first_nonfinite(const void* x, DType dtype, const float* error, int64_t n,
                               KernelChoice choice) {
  return first_nonfinite(active_isa(choice), x, dtype, error, n);
}

float onebit_scale(double sumsq, int64_t n_real) { return onebit_scale_of(sumsq, n_real); }

double onebit_compress_signs(const void* x, DType dtype, const float* error, int64_t n_real,
                             int64_t n_padded, uint8_t* bits, KernelChoice choice) {
  return compress_signs(active_isa(choice), x, dtype, error, n_real, n_padded, bits);
}

void onebit_compress_error(const void* x, DType dtype, float* error, int64_t n_real,
                           float scale, KernelChoice choice) {
  compress_error(active_isa(choice), x, dtype, error, n_real, scale);
}

float onebit_compress(const void* x, DType dtype, float* error, int64_t n_real, int64_t n_padded,
                      uint8_t* bits, KernelChoice choice) {
  const Isa isa = active_isa(choice);
  const float scale =
      onebit_scale(compress_signs(isa, x, dtype, error, n_real, n_padded, bits), n_real);
  compress_error(isa, x, dtype, error, n_real, scale);
  return scale;
}

void onebit_accumulate(const uint8_t* bits, float scale, float* acc, int64_t n_real,
                       KernelChoice choice) {
  accumulate(active_isa(choice), bits, scale, acc, n_real);
}

float onebit_server_compress(const float* acc, int nranks, float* error, int64_t n_real,
                             int64_t n_padded, uint8_t* bits, KernelChoice choice) {
  return server_compress(active_isa(choice), acc, nranks, error, n_real, n_padded, bits);
}

float onebit_server_reduce_compress(const uint8_t* const* bits, const float* scales, int nranks,
                                    float* error, int64_t n_real, int64_t n_padded,
                                    uint8_t* out_bits, KernelChoice choice) {
  return server_reduce_compress(active_isa(choice), bits, scales, nranks, error, n_real, n_padded,
                                out_bits);
}

void onebit_server_reduce_signs(const uint8_t* const* bits, const float* scales, int nranks,
                                float* error, int64_t n_real, int64_t n_padded,
                                uint8_t* out_bits, OneBitSumSq& acc, KernelChoice choice) {
  // A piece after a partial one would meet the AVX2 loop's 32-element blocks out of step (other
  // accumulators, another sum): every piece but the chunk's last real one must be whole.
  if (acc.ended && n_real > 0)
    throw UsageError("onebit_server_reduce_signs: a piece with real elements after a piece that "
                     "was not 32-aligned and whole");
  server_reduce_signs(active_isa(choice), bits, scales, nranks, error, n_real, n_padded, out_bits,
                      acc);
  if (n_real != n_padded || n_padded % 32 != 0) acc.ended = true;
}

double onebit_sumsq(const OneBitSumSq& acc, KernelChoice choice) {
  return finish(active_isa(choice), acc);
}

void onebit_server_error(float* error, int64_t n_real, float scale, KernelChoice choice) {
  server_stored_error(active_isa(choice), error, n_real, scale);
}

void onebit_decompress(const uint8_t* bits, float scale, void* out, DType dtype, int64_t n_real,
                       KernelChoice choice) {
  decompress(active_isa(choice), bits, scale, out, dtype, n_real);
}

void onebit_compress_error_decompress(void* x, DType dtype, float* error, int64_t n_real,
                                      float scale, const uint8_t* result_bits,
                                      float result_scale, KernelChoice choice) {
  compress_error_result(active_isa(choice), x, dtype, error, n_real, scale, result_bits,
                        result_scale);
}

const char* onebit_kernel_isa() {
  return active_isa(KernelChoice::kAuto) == Isa::kAvx2 ? "avx2" : "scalar";
}

}  // namespace hvdc
