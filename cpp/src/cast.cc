#include "hvdc/cast.h"

#include "hvdc/elementwise/half.h"
#include "hvdc/errors.h"

namespace hvdc {

void widen_to_float(const void* src, DType dtype, float* dst, int64_t n) {
  const auto* s = static_cast<const uint16_t*>(src);
  if (dtype == DType::kFloat16) {
    for (int64_t i = 0; i < n; ++i) dst[i] = widen<HalfKind::kFloat16>(s[i]);
  } else if (dtype == DType::kBFloat16) {
    for (int64_t i = 0; i < n; ++i) dst[i] = widen<HalfKind::kBFloat16>(s[i]);
  } else {
    throw UsageError("widen_to_float: not a half type");
  }
}

void narrow_from_float(const float* src, float scale, void* dst, DType dtype, int64_t n) {
  auto* d = static_cast<uint16_t*>(dst);
  if (dtype == DType::kFloat16) {
    for (int64_t i = 0; i < n; ++i) d[i] = narrow_scaled<HalfKind::kFloat16>(src[i], scale);
  } else if (dtype == DType::kBFloat16) {
    for (int64_t i = 0; i < n; ++i) d[i] = narrow_scaled<HalfKind::kBFloat16>(src[i], scale);
  } else {
    throw UsageError("narrow_from_float: not a half type");
  }
}

void scale_in_place(void* buf, DType dtype, double scale, int64_t n) {
  if (dtype == DType::kFloat32) {
    auto* p = static_cast<float*>(buf);
    const float s = static_cast<float>(scale);
    for (int64_t i = 0; i < n; ++i) p[i] *= s;
  } else if (dtype == DType::kFloat64) {
    auto* p = static_cast<double*>(buf);
    for (int64_t i = 0; i < n; ++i) p[i] *= scale;
  } else {
    throw UsageError("scale_in_place: float32 or float64 only");
  }
}

}  // namespace hvdc
