// _core.onebit_lamb_* (see hvdc/onebit_lamb_kernels.h): 1-bit LAMB's fused compression-stage passes on
// float32 CPU buffers, one call per segment (bucket) that loops over its layers without the GIL.
#include <nanobind/nanobind.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <string>
#include <vector>

#include "hvdc/binding_views.h"
#include "hvdc/errors.h"
#include "hvdc/onebit_lamb_bindings.h"
#include "hvdc/onebit_lamb_kernels.h"

namespace nb = nanobind;

namespace hvdc {
namespace {

// The float32 data of `obj`, which must hold `numel` elements (numel < 0: take its own).
float* f32(nb::handle obj, const std::string& what, int64_t* numel) {
  const TensorView v = binding_view_of(obj, what);
  if (v.dtype != DType::kFloat32) throw UsageError(what + " must be float32");
  if (*numel < 0) *numel = v.numel;
  if (v.numel != *numel)
    throw UsageError(what + " has " + std::to_string(v.numel) + " elements, expected " + std::to_string(*numel));
  return static_cast<float*>(v.data);
}

// The layer sizes, checked against the flat buffers' length.
void check_sizes(const std::vector<int64_t>& sizes, int64_t n, size_t per_layer, const char* fn) {
  int64_t total = 0;
  for (int64_t s : sizes) {
    if (s < 0) throw UsageError(std::string(fn) + ": negative layer size");
    total += s;
  }
  if (total != n || per_layer != sizes.size())
    throw UsageError(std::string(fn) + ": layer sizes sum to " + std::to_string(total) + " for " + std::to_string(n) +
                     " elements, or per-layer lists of another length");
}

}  // namespace

void register_onebit_lamb(nb::module_& m) {
  m.def(
      "onebit_lamb_moments",
      [](nb::handle work_, nb::handle m_, nb::handle fresh_, nb::handle denom_, const std::vector<int64_t>& sizes,
         const std::vector<float>& floors, float neg_b1, float one_minus_b1, float b2, float one_minus_b2,
         float sqrt_bc2, float eps, bool scalar) {
        const char* fn = "onebit_lamb_moments";
        int64_t n = -1;
        const float* wp = f32(work_, std::string(fn) + ": work", &n);
        float* mp = f32(m_, std::string(fn) + ": m", &n);
        float* fp = f32(fresh_, std::string(fn) + ": fresh", &n);
        const float* dp = f32(denom_, std::string(fn) + ": denom", &n);
        check_sizes(sizes, n, floors.size(), fn);
        const KernelChoice choice = scalar ? KernelChoice::kScalar : KernelChoice::kAuto;
        std::vector<float> maxes(sizes.size());
        {
          nb::gil_scoped_release nogil;
          int64_t at = 0;
          for (size_t i = 0; i < sizes.size(); ++i) {
            maxes[i] = onebit_lamb_moments(wp + at, dp + at, sizes[i], neg_b1, one_minus_b1, b2, one_minus_b2,
                                           sqrt_bc2, floors[i], eps, mp + at, fp + at, choice);
            at += sizes[i];
          }
        }
        return maxes;
      },
      nb::arg("work"), nb::arg("m"), nb::arg("fresh"), nb::arg("denom"), nb::arg("sizes"), nb::arg("floors"),
      nb::arg("neg_beta1"), nb::arg("one_minus_beta1"), nb::arg("beta2"), nb::arg("one_minus_beta2"),
      nb::arg("sqrt_bc2"), nb::arg("eps"), nb::arg("scalar") = false,
      "Paper 001 Alg. 1 lines 14-17 per layer (float32): g = (work - b1 m) / (1 - b1); fresh = b2 fresh + "
      "(1 - b2) g^2; m = work; returns each layer's max of denom / (max(sqrt(fresh) / sqrt_bc2, floor) + eps) "
      "(-inf for an empty layer). scalar: the portable code instead of AVX2.");
  m.def(
      "onebit_lamb_apply",
      [](nb::handle m_, nb::handle denom_, const std::vector<nb::handle>& params, float bc1, float wd,
         const std::vector<float>& scales, bool scalar) {
        const char* fn = "onebit_lamb_apply";
        int64_t n = -1;
        const float* mp = f32(m_, std::string(fn) + ": m", &n);
        const float* dp = f32(denom_, std::string(fn) + ": denom", &n);
        std::vector<int64_t> sizes(params.size());
        std::vector<float*> xs(params.size(), nullptr);
        for (size_t i = 0; i < params.size(); ++i) {
          if (params[i].is_none()) continue;  // an empty layer (its strides may not read as contiguous)
          int64_t k = -1;
          xs[i] = f32(params[i], std::string(fn) + ": param " + std::to_string(i), &k);
          sizes[i] = k;
        }
        check_sizes(sizes, n, scales.size(), fn);
        const KernelChoice choice = scalar ? KernelChoice::kScalar : KernelChoice::kAuto;
        nb::gil_scoped_release nogil;
        int64_t at = 0;
        for (size_t i = 0; i < sizes.size(); ++i) {
          if (sizes[i]) onebit_lamb_apply(mp + at, dp + at, sizes[i], bc1, wd, scales[i], xs[i], choice);
          at += sizes[i];
        }
      },
      nb::arg("m"), nb::arg("denom"), nb::arg("params"), nb::arg("bc1"), nb::arg("weight_decay"), nb::arg("scales"),
      nb::arg("scalar") = false,
      "Paper 001 Alg. 1 lines 20-21 per layer (float32): x += (m / denom / bc1 + wd x) * scale, the parameters "
      "in the flat buffers' order (None for an empty one). scalar: the portable code instead of AVX2.");
}

}  // namespace hvdc
