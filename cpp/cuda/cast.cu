// Widening and narrowing between float32 and the half types on the device (hvdc/cast.h), over the
// per-element casts of hvdc/elementwise/half.h.
#include <string>
#include <type_traits>

#include "hvdc/cuda/kernels.h"
#include "hvdc/elementwise/half.h"
#include "hvdc/errors.h"
#include "launch.cuh"

namespace hvdc {
namespace cuda {
namespace {

template <HalfKind K>
__global__ void widen_kernel(const uint16_t* src, float* dst, int64_t n) {
  for (int64_t i = grid_first(); i < n; i += grid_step()) dst[i] = widen<K>(src[i]);
}

template <HalfKind K>
__global__ void narrow_kernel(const float* src, float scale, uint16_t* dst, int64_t n) {
  for (int64_t i = grid_first(); i < n; i += grid_step()) dst[i] = narrow_scaled<K>(src[i], scale);
}

// f(HalfKind tag) for a half dtype.
template <typename F>
void dispatch_half(DType dtype, const char* what, F&& f) {
  if (dtype == DType::kFloat16) return f(std::integral_constant<HalfKind, HalfKind::kFloat16>{});
  if (dtype == DType::kBFloat16) return f(std::integral_constant<HalfKind, HalfKind::kBFloat16>{});
  throw UsageError(std::string(what) + ": not a half type");
}

}  // namespace

void widen_to_float(const void* src, DType dtype, float* dst, int64_t n, cudaStream_t stream) {
  dispatch_half(dtype, "widen_to_float", [&](auto kind) {
    if (n <= 0) return;
    widen_kernel<decltype(kind)::value><<<grid_for(n), kThreads, 0, stream>>>(
        static_cast<const uint16_t*>(src), dst, n);
    check_launch("widen_to_float");
  });
}

void narrow_from_float(const float* src, float scale, void* dst, DType dtype, int64_t n,
                       cudaStream_t stream) {
  dispatch_half(dtype, "narrow_from_float", [&](auto kind) {
    if (n <= 0) return;
    narrow_kernel<decltype(kind)::value><<<grid_for(n), kThreads, 0, stream>>>(
        src, scale, static_cast<uint16_t*>(dst), n);
    check_launch("narrow_from_float");
  });
}

}  // namespace cuda
}  // namespace hvdc
