// Every product and sum is rounded on its own, as the NumPy reference rounds it: no fused
// multiply-add, also in the AVX2/AVX-512 versions below and in the per-element functions they
// inline, hence before the includes (GCC contracts a*b+c by default, and the -std flag does not
// change that for C++).
#if defined(__clang__)
#pragma STDC FP_CONTRACT OFF
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
// The vector types below are passed between inlined helpers only; the ABI note does not apply.
#pragma GCC diagnostic ignored "-Wpsabi"
#endif

#include "hvdc/adasum_kernels.h"

#include <cmath>
#include <cstring>

#include "hvdc/elementwise/adasum.h"
#include "hvdc/errors.h"

namespace hvdc {
namespace {

// Element access per storage dtype (hvdc/elementwise/adasum.h, shared with the CUDA kernels): load
// widens to double, store rounds once from double.
using F32 = AdasumF32;
using F64 = AdasumF64;
using F16 = AdasumF16;
using BF16 = AdasumBF16;

// Eight independent accumulators per sum: a fixed summation order (the result does not depend on
// the compiler) whose lanes the compiler can keep in SIMD registers without -ffast-math.
constexpr int kLanes = 8;

// The end of every dot_norms version: the last n % kLanes elements (i = n - n % kLanes on) go to
// lanes 0, 1, ..., then the lanes are summed in lane order.
template <typename A>
inline __attribute__((always_inline)) AdasumDots finish_dot_norms(
    double* d, double* na, double* nb, const typename A::T* a, const typename A::T* b, int64_t i,
    int64_t n) {
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
  return finish_dot_norms<A>(d, na, nb, a, b, i, n);
}

template <typename A>
void combine(const typename A::T* a, double ca, const typename A::T* b, double cb,
             typename A::T* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) A::store(out, i, adasum_mix(ca, A::load(a, i), cb, A::load(b, i)));
}

// Vector versions for float32 and float64, the dtypes of the bulk of the traffic. The same
// arithmetic in the same order as the templates above (lane j of the kLanes accumulators still
// sums elements i = j mod kLanes), so every version gives the same bits; only how many lanes one
// instruction handles differs: W doubles per hardware vector (W = 4: SSE2 pairs or AVX2; W = 8:
// AVX-512), kLanes / W vectors per accumulator. Memory-bound on large slices; the vectors
// keep the loop from being bound by its additions on small ones.
template <int W>
struct Vec;
template <>
struct Vec<4> {
  typedef double D __attribute__((vector_size(32)));
  typedef float F __attribute__((vector_size(16)));
};
template <>
struct Vec<8> {
  typedef double D __attribute__((vector_size(64)));
  typedef float F __attribute__((vector_size(32)));
};

template <int W, typename T>
inline __attribute__((always_inline)) typename Vec<W>::D load_wide(const T* p) {
  typename Vec<W>::D out;
  if constexpr (sizeof(T) == sizeof(double)) {
    std::memcpy(&out, p, sizeof out);
  } else {
    typename Vec<W>::F f;
    std::memcpy(&f, p, sizeof f);
    out = __builtin_convertvector(f, typename Vec<W>::D);
  }
  return out;
}

template <int W, typename T>
inline __attribute__((always_inline)) void store_narrow(T* p, typename Vec<W>::D v) {
  if constexpr (sizeof(T) == sizeof(double)) {
    std::memcpy(p, &v, sizeof v);
  } else {
    const typename Vec<W>::F f = __builtin_convertvector(v, typename Vec<W>::F);
    std::memcpy(p, &f, sizeof f);
  }
}

template <typename A, int W>
inline __attribute__((always_inline)) AdasumDots dot_norms_vec(const typename A::T* a,
                                                               const typename A::T* b, int64_t n) {
  using D = typename Vec<W>::D;
  constexpr int kVecs = kLanes / W;
  D d[kVecs] = {}, na[kVecs] = {}, nb[kVecs] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (int k = 0; k < kVecs; ++k) {
      const D x = load_wide<W>(a + i + k * W), y = load_wide<W>(b + i + k * W);
      d[k] += x * y;
      na[k] += x * x;
      nb[k] += y * y;
    }
  }
  double dl[kLanes], nal[kLanes], nbl[kLanes];
  std::memcpy(dl, d, sizeof dl);
  std::memcpy(nal, na, sizeof nal);
  std::memcpy(nbl, nb, sizeof nbl);
  return finish_dot_norms<A>(dl, nal, nbl, a, b, i, n);
}

template <typename A, int W>
inline __attribute__((always_inline)) void combine_vec(const typename A::T* a, double ca,
                                                       const typename A::T* b, double cb,
                                                       typename A::T* out, int64_t n) {
  using D = typename Vec<W>::D;
  D vca, vcb;
  for (int k = 0; k < W; ++k) {
    vca[k] = ca;
    vcb[k] = cb;
  }
  int64_t i = 0;
  for (; i + W <= n; i += W) store_narrow<W>(out + i, vca * load_wide<W>(a + i) + vcb * load_wide<W>(b + i));
  for (; i < n; ++i) A::store(out, i, adasum_mix(ca, A::load(a, i), cb, A::load(b, i)));
}

// One function per (dtype, instruction set); picked once, at the first call, from what the CPU
// and OS support.
template <typename A>
struct VecKernels {
  using T = typename A::T;
  using Dot = AdasumDots (*)(const T*, const T*, int64_t);
  using Combine = void (*)(const T*, double, const T*, double, T*, int64_t);
  Dot dot;
  Combine combine;
};

template <typename A>
AdasumDots dot_base(const typename A::T* a, const typename A::T* b, int64_t n) {
  return dot_norms_vec<A, 4>(a, b, n);
}
template <typename A>
void combine_base(const typename A::T* a, double ca, const typename A::T* b, double cb,
                  typename A::T* out, int64_t n) {
  combine_vec<A, 4>(a, ca, b, cb, out, n);
}

#if defined(__GNUC__) && (defined(__x86_64__) || defined(__i386__))
#define HVDC_X86_DISPATCH 1
template <typename A>
__attribute__((target("avx2"))) AdasumDots dot_avx2(const typename A::T* a,
                                                    const typename A::T* b, int64_t n) {
  return dot_norms_vec<A, 4>(a, b, n);
}
template <typename A>
__attribute__((target("avx2"))) void combine_avx2(const typename A::T* a, double ca,
                                                  const typename A::T* b, double cb,
                                                  typename A::T* out, int64_t n) {
  combine_vec<A, 4>(a, ca, b, cb, out, n);
}
template <typename A>
__attribute__((target("avx512f"))) AdasumDots dot_avx512(const typename A::T* a,
                                                        const typename A::T* b, int64_t n) {
  return dot_norms_vec<A, 8>(a, b, n);
}
template <typename A>
__attribute__((target("avx512f"))) void combine_avx512(const typename A::T* a, double ca,
                                                      const typename A::T* b, double cb,
                                                      typename A::T* out, int64_t n) {
  combine_vec<A, 8>(a, ca, b, cb, out, n);
}
#endif

template <typename A>
const VecKernels<A>& vec_kernels() {
  static const VecKernels<A> k = [] {
#ifdef HVDC_X86_DISPATCH
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) return VecKernels<A>{dot_avx512<A>, combine_avx512<A>};
    if (__builtin_cpu_supports("avx2")) return VecKernels<A>{dot_avx2<A>, combine_avx2<A>};
#endif
    return VecKernels<A>{dot_base<A>, combine_base<A>};
  }();
  return k;
}

}  // namespace

AdasumDots adasum_dot_norms(const void* left, const void* right, DType dtype, int64_t n) {
  if (dtype == DType::kFloat32)
    return vec_kernels<F32>().dot(static_cast<const float*>(left), static_cast<const float*>(right), n);
  if (dtype == DType::kFloat64)
    return vec_kernels<F64>().dot(static_cast<const double*>(left), static_cast<const double*>(right),
                                  n);
  return adasum_dispatch(dtype, [&](auto acc) {
    using A = decltype(acc);
    return dot_norms<A>(static_cast<const typename A::T*>(left),
                        static_cast<const typename A::T*>(right), n);
  });
}

double adasum_coefficient(double dot, double norm_sq) {
  return adasum_coefficient_of(dot, norm_sq);
}

void adasum_combine(const void* left, double left_coeff, const void* right, double right_coeff,
                    void* out, DType dtype, int64_t n) {
  if (dtype == DType::kFloat32)
    return vec_kernels<F32>().combine(static_cast<const float*>(left), left_coeff,
                                      static_cast<const float*>(right), right_coeff,
                                      static_cast<float*>(out), n);
  if (dtype == DType::kFloat64)
    return vec_kernels<F64>().combine(static_cast<const double*>(left), left_coeff,
                                      static_cast<const double*>(right), right_coeff,
                                      static_cast<double*>(out), n);
  adasum_dispatch(dtype, [&](auto acc) {
    using A = decltype(acc);
    combine<A>(static_cast<const typename A::T*>(left), left_coeff,
               static_cast<const typename A::T*>(right), right_coeff,
               static_cast<typename A::T*>(out), n);
    return 0;
  });
}

void widen_to_double(const void* src, DType dtype, double* dst, int64_t n) {
  adasum_dispatch(dtype, [&](auto acc) {
    using A = decltype(acc);
    const auto* s = static_cast<const typename A::T*>(src);
    for (int64_t i = 0; i < n; ++i) dst[i] = A::load(s, i);
    return 0;
  });
}

void narrow_from_double(const double* src, double divisor, void* dst, DType dtype, int64_t n) {
  adasum_dispatch(dtype, [&](auto acc) {
    using A = decltype(acc);
    auto* d = static_cast<typename A::T*>(dst);
    for (int64_t i = 0; i < n; ++i) A::store(d, i, src[i] / divisor);
    return 0;
  });
}

}  // namespace hvdc
