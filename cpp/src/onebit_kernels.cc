#include "hvdc/onebit_kernels.h"

#include <cmath>
#include <cstring>
#include <string>

#include "hvdc/errors.h"

namespace hvdc {
namespace {

// Element access per storage dtype: load widens to float32 (exact), store rounds once from
// float32 exactly as the rest of the core narrows (dtype.h).
struct F32 {
  using T = float;
  static float load(const T* p, int64_t i) { return p[i]; }
  static void store(T* p, int64_t i, float v) { p[i] = v; }
};
struct F16 {
  using T = uint16_t;
  static float load(const T* p, int64_t i) { return half_to_float(p[i]); }
  static void store(T* p, int64_t i, float v) { p[i] = float_to_half(v); }
};
struct BF16 {
  using T = uint16_t;
  static float load(const T* p, int64_t i) { return bf16_to_float(p[i]); }
  static void store(T* p, int64_t i, float v) { p[i] = float_to_bf16(v); }
};

template <typename F>
auto dispatch(DType dtype, F&& f) {
  switch (dtype) {
    case DType::kFloat32: return f(F32{});
    case DType::kFloat16: return f(F16{});
    case DType::kBFloat16: return f(BF16{});
    default: break;
  }
  throw UsageError(std::string("1-bit compression is not defined for ") + dtype_name(dtype) +
                   "; use float32, float16 or bfloat16");
}

// The common tail of the worker and server steps. On entry error[i] holds the compensated value
// c[i] (i < n_real) and `sumsq` its squared norm: writes scale, then error = c - (+/-scale). The
// sign is re-derived from c (c >= 0, the same test that set the bit), so this loop never reads the
// packed bits and vectorizes.
float finish(float* error, int64_t n_real, double sumsq) {
  if (n_real == 0) return 0.0f;
  const float scale = static_cast<float>(std::sqrt(sumsq / static_cast<double>(n_real)));
  for (int64_t i = 0; i < n_real; ++i) {
    const float c = error[i];
    error[i] = c >= 0.0f ? c - scale : c + scale;
  }
  return scale;
}

// One pass: c = value(i) + error[i] stored back into error, its square summed in double (eight
// lanes in a fixed order, so the compiler can keep them in SIMD registers without -ffast-math),
// and the sign bits packed 8 per byte. Bits of padding positions are 0.
template <typename Value>
double compensate_and_pack(Value value, float* error, int64_t n_real, int64_t n_padded,
                           uint8_t* bits) {
  double lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  const int64_t full = n_real / 8;
  for (int64_t b = 0; b < full; ++b) {
    uint8_t byte = 0;
    for (int j = 0; j < 8; ++j) {
      const int64_t i = 8 * b + j;
      const float c = value(i) + error[i];
      error[i] = c;
      lanes[j] += static_cast<double>(c) * static_cast<double>(c);
      byte |= static_cast<uint8_t>(c >= 0.0f) << j;
    }
    bits[b] = byte;
  }
  int64_t b = full;
  if (full * 8 < n_real) {  // the last, partly real byte
    uint8_t byte = 0;
    for (int j = 0; 8 * b + j < n_real; ++j) {
      const int64_t i = 8 * b + j;
      const float c = value(i) + error[i];
      error[i] = c;
      lanes[j] += static_cast<double>(c) * static_cast<double>(c);
      byte |= static_cast<uint8_t>(c >= 0.0f) << j;
    }
    bits[b++] = byte;
  }
  if (b < n_padded / 8) std::memset(bits + b, 0, static_cast<size_t>(n_padded / 8 - b));
  return ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) +
         ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
}

void check_padding(int64_t n_real, int64_t n_padded) {
  if (n_real < 0 || n_padded % 8 != 0 || n_padded < n_real)
    throw UsageError("1-bit chunk of " + std::to_string(n_real) + " elements in " +
                     std::to_string(n_padded) + " padded: padded size must be a multiple of 8 "
                     "and at least the real size");
}

}  // namespace

int64_t onebit_first_nonfinite(const void* x, DType dtype, const float* error, int64_t n) {
  return dispatch(dtype, [&](auto a) -> int64_t {
    using A = decltype(a);
    const auto* p = static_cast<const typename A::T*>(x);
    // Blocks of 1024: a branch-free finiteness test the compiler vectorizes, and an early exit.
    constexpr int64_t kBlock = 1024;
    for (int64_t lo = 0; lo < n; lo += kBlock) {
      const int64_t hi = lo + kBlock < n ? lo + kBlock : n;
      int bad = 0;
      for (int64_t i = lo; i < hi; ++i) {
        const float c = A::load(p, i) + error[i];
        bad |= !(c - c == 0.0f);  // false for NaN and +/-Inf only
      }
      if (bad)
        for (int64_t i = lo; i < hi; ++i) {
          const float c = A::load(p, i) + error[i];
          if (!(c - c == 0.0f)) return i;
        }
    }
    return -1;
  });
}

float onebit_compress(const void* x, DType dtype, float* error, int64_t n_real, int64_t n_padded,
                      uint8_t* bits) {
  check_padding(n_real, n_padded);
  const double sumsq = dispatch(dtype, [&](auto a) {
    using A = decltype(a);
    const auto* p = static_cast<const typename A::T*>(x);
    return compensate_and_pack([p](int64_t i) { return A::load(p, i); }, error, n_real, n_padded,
                               bits);
  });
  return finish(error, n_real, sumsq);
}

void onebit_accumulate(const uint8_t* bits, float scale, float* acc, int64_t n_real) {
  const int64_t full = n_real / 8;
  for (int64_t b = 0; b < full; ++b) {
    const unsigned byte = bits[b];
    for (int j = 0; j < 8; ++j) acc[8 * b + j] += ((byte >> j) & 1u) ? scale : -scale;
  }
  for (int64_t i = full * 8; i < n_real; ++i)
    acc[i] += ((bits[i >> 3] >> (i & 7)) & 1u) ? scale : -scale;
}

float onebit_server_compress(const float* acc, int nranks, float* error, int64_t n_real,
                             int64_t n_padded, uint8_t* bits) {
  check_padding(n_real, n_padded);
  const float n = static_cast<float>(nranks);
  const double sumsq = compensate_and_pack([acc, n](int64_t i) { return acc[i] / n; }, error,
                                           n_real, n_padded, bits);
  return finish(error, n_real, sumsq);
}

void onebit_decompress(const uint8_t* bits, float scale, void* out, DType dtype, int64_t n_real) {
  dispatch(dtype, [&](auto a) {
    using A = decltype(a);
    auto* p = static_cast<typename A::T*>(out);
    const float pos = scale, neg = -scale;
    for (int64_t i = 0; i < n_real; ++i)
      A::store(p, i, ((bits[i >> 3] >> (i & 7)) & 1u) ? pos : neg);
    return 0;
  });
}

}  // namespace hvdc
