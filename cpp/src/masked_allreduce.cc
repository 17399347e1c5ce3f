#include "hvdc/masked_allreduce.h"

#include <cmath>
#include <cstdio>
#include <cstring>

#include "hvdc/dense_allreduce.h"
#include "hvdc/masks.h"
#include "hvdc/stochastic_kernels.h"

namespace hvdc {

void masked_average(Communicator& comm, const TensorView& t, const uint8_t* mask,
                      std::vector<unsigned char>& scratch) {
  const size_t elem = dtype_size(t.dtype);
  const int64_t count = mask_count(mask, t.numel);
  if (scratch.size() < static_cast<size_t>(count) * elem) scratch.resize(count * elem);
  mask_gather(t.data, mask, t.numel, count, elem, scratch.data());
  TensorView dense;
  dense.data = scratch.data();
  dense.numel = count;
  dense.dtype = t.dtype;
  // Even an empty selection joins the exchange shape-wise (dense_allreduce returns at once on 0
  // elements on every rank alike, since the mask, hence the count, is the same on every rank).
  dense_allreduce(comm, dense, ReduceOp::kAverage);
  mask_scatter(scratch.data(), mask, t.numel, count, elem, t.data);
}

CallSignature masked_signature(const TensorView& t, const MaskSpec& spec, const std::string& name,
                               Collective collective) {
  CallSignature sig = signature_of(collective, t, static_cast<int>(spec.kind), name);
  // The mask's arguments: hashed into the shape (compared) and written after the dims (shown), so a
  // rank with another ratio, seed or step is named in the MismatchError.
  char ratio[32];
  std::snprintf(ratio, sizeof(ratio), "%g", spec.ratio);
  // A range of a larger mask (a bucket) also shows and hashes where it lies in the index space.
  const bool range = spec.first != 0 || spec.numel != t.numel;
  const std::string text = std::string(sig.shape) + " k=" + ratio + " seed=" +
                           std::to_string(spec.seed) + " t=" + std::to_string(spec.step) +
                           (range ? " at=" + std::to_string(spec.first) + "/" + std::to_string(spec.numel)
                                  : std::string());
  std::snprintf(sig.shape, sizeof(sig.shape), "%s", text.c_str());
  sig.shape_hash = fnv1a(&spec.ratio, sizeof(spec.ratio), sig.shape_hash);
  sig.shape_hash = fnv1a(&spec.seed, sizeof(spec.seed), sig.shape_hash);
  sig.shape_hash = fnv1a(&spec.step, sizeof(spec.step), sig.shape_hash);
  if (range) {
    sig.shape_hash = fnv1a(&spec.first, sizeof(spec.first), sig.shape_hash);
    sig.shape_hash = fnv1a(&spec.numel, sizeof(spec.numel), sig.shape_hash);
  }
  sig.layout_hash = fnv1a(spec.always.data(), spec.always.size() * sizeof(int64_t));
  return sig;
}

int64_t first_nonfinite(const TensorView& t) {
  switch (t.dtype) {
    case DType::kFloat32:
      return first_nonfinite_f32(static_cast<const float*>(t.data), t.numel);
    case DType::kFloat64: {
      const auto* p = static_cast<const double*>(t.data);
      for (int64_t i = 0; i < t.numel; ++i)
        if (!std::isfinite(p[i])) return i;
      return -1;
    }
    case DType::kFloat16:
    case DType::kBFloat16: {
      // All exponent bits set: Inf or NaN.
      const uint16_t exp = t.dtype == DType::kFloat16 ? 0x7c00 : 0x7f80;
      const auto* p = static_cast<const uint16_t*>(t.data);
      for (int64_t i = 0; i < t.numel; ++i)
        if ((p[i] & exp) == exp) return i;
      return -1;
    }
    default:
      return -1;
  }
}

}  // namespace hvdc
