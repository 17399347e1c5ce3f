#include "hvdc/adasum_kernels.h"

#include <cfloat>
#include <cmath>
#include <cstring>

#include "hvdc/errors.h"

namespace hvdc {
namespace {

// Element access per storage dtype: load widens to double, store rounds once from double. The
// half types go through the compiler's _Float16 (one correct rounding from double) and, for
// bfloat16, through float32 exactly as the rest of the core narrows it (see dtype.h).
struct F32 {
  using T = float;
  static double load(const T* p, int64_t i) { return p[i]; }
  static void store(T* p, int64_t i, double v) { p[i] = static_cast<float>(v); }
};
struct F64 {
  using T = double;
  static double load(const T* p, int64_t i) { return p[i]; }
  static void store(T* p, int64_t i, double v) { p[i] = v; }
};
struct F16 {
  using T = uint16_t;
  static double load(const T* p, int64_t i) {
    _Float16 h;
    std::memcpy(&h, p + i, 2);
    return static_cast<double>(h);
  }
  static void store(T* p, int64_t i, double v) {
    const _Float16 h = static_cast<_Float16>(v);
    std::memcpy(p + i, &h, 2);
  }
};
struct BF16 {
  using T = uint16_t;
  static double load(const T* p, int64_t i) { return bf16_to_float(p[i]); }
  static void store(T* p, int64_t i, double v) { p[i] = float_to_bf16(static_cast<float>(v)); }
};

// Calls f.template operator()<Access>() for the storage dtype.
template <typename F>
auto dispatch(DType dtype, F&& f) {
  switch (dtype) {
    case DType::kFloat32: return f(F32{});
    case DType::kFloat64: return f(F64{});
    case DType::kFloat16: return f(F16{});
    case DType::kBFloat16: return f(BF16{});
    default: break;
  }
  throw UsageError(std::string("Adasum is not defined for ") + dtype_name(dtype));
}

// Eight independent accumulators per sum: a fixed summation order (the result does not depend on
// the compiler) whose lanes the compiler can keep in SIMD registers without -ffast-math.
constexpr int kLanes = 8;

template <typename A>
AdasumDots dot_norms(const typename A::T* a, const typename A::T* b, int64_t n) {
  double d[kLanes] = {}, na[kLanes] = {}, nb[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int j = 0; j < kLanes; ++j) {
      const double x = A::load(a, i + j), y = A::load(b, i + j);
      d[j] += x * y;
      na[j] += x * x;
      nb[j] += y * y;
    }
  }
  for (int j = 0; i < n; ++i, ++j) {
    const double x = A::load(a, i), y = A::load(b, i);
    d[j] += x * y;
    na[j] += x * x;
    nb[j] += y * y;
  }
  AdasumDots out;
  for (int j = 0; j < kLanes; ++j) {
    out.dot += d[j];
    out.left_sq += na[j];
    out.right_sq += nb[j];
  }
  return out;
}

template <typename A>
void combine(const typename A::T* a, double ca, const typename A::T* b, double cb,
             typename A::T* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) A::store(out, i, ca * A::load(a, i) + cb * A::load(b, i));
}

}  // namespace

AdasumDots adasum_dot_norms(const void* left, const void* right, DType dtype, int64_t n) {
  return dispatch(dtype, [&](auto acc) {
    using A = decltype(acc);
    return dot_norms<A>(static_cast<const typename A::T*>(left),
                        static_cast<const typename A::T*>(right), n);
  });
}

double adasum_coefficient(double dot, double norm_sq) {
  // sqrt(DBL_MIN) = 2^-511: below it dot / norm_sq could overflow or be pure rounding noise.
  static const double kTiny = std::sqrt(DBL_MIN);
  if (norm_sq < kTiny) return 1.0;
  return 1.0 - dot / norm_sq * 0.5;
}

void adasum_combine(const void* left, double left_coeff, const void* right, double right_coeff,
                    void* out, DType dtype, int64_t n) {
  dispatch(dtype, [&](auto acc) {
    using A = decltype(acc);
    combine<A>(static_cast<const typename A::T*>(left), left_coeff,
               static_cast<const typename A::T*>(right), right_coeff,
               static_cast<typename A::T*>(out), n);
    return 0;
  });
}

void widen_to_double(const void* src, DType dtype, double* dst, int64_t n) {
  dispatch(dtype, [&](auto acc) {
    using A = decltype(acc);
    const auto* s = static_cast<const typename A::T*>(src);
    for (int64_t i = 0; i < n; ++i) dst[i] = A::load(s, i);
    return 0;
  });
}

void narrow_from_double(const double* src, double divisor, void* dst, DType dtype, int64_t n) {
  dispatch(dtype, [&](auto acc) {
    using A = decltype(acc);
    auto* d = static_cast<typename A::T*>(dst);
    for (int64_t i = 0; i < n; ++i) A::store(d, i, src[i] / divisor);
    return 0;
  });
}

}  // namespace hvdc
