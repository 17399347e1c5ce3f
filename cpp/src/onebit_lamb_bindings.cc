// _core.onebit_lamb_* (see hvdc/onebit_lamb_kernels.h): 1-bit LAMB's fused compression-stage passes on
// float32 CPU buffers, one call per bucket that loops over its layers without the GIL.
#include <nanobind/nanobind.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <limits>
#include <string>
#include <vector>

#include "hvdc/binding_views.h"
#include "hvdc/errors.h"
#include "hvdc/onebit_lamb_bindings.h"
#include "hvdc/onebit_lamb_kernels.h"

namespace nb = nanobind;

namespace hvdc {

void register_onebit_lamb(nb::module_& m) {
  m.def(
      "onebit_lamb_moments",
      [](nb::handle work_, nb::handle m_, nb::handle fresh_, nb::handle denom_, const std::vector<int64_t>& sizes,
         const std::vector<float>& floors, float neg_b1, float one_minus_b1, float b2, float one_minus_b2,
         float sqrt_bc2, float eps, bool scalar) {
        const char* fn = "onebit_lamb_moments";
        int64_t n = -1;
        const float* wp = binding_float32(work_, std::string(fn) + ": work", &n);
        float* mp = binding_float32(m_, std::string(fn) + ": m", &n);
        float* fp = binding_float32(fresh_, std::string(fn) + ": fresh", &n);
        const float* dp = binding_float32(denom_, std::string(fn) + ": denom", &n);
        binding_check_layers(sizes, n, floors.size(), fn);
        std::vector<float> maxes(sizes.size(), -std::numeric_limits<float>::infinity());  // an empty layer's
        {
          nb::gil_scoped_release nogil;
          for_each_layer(sizes, [&](size_t i, int64_t at) {
            maxes[i] = onebit_lamb_moments(wp + at, dp + at, sizes[i], neg_b1, one_minus_b1, b2, one_minus_b2,
                                           sqrt_bc2, floors[i], eps, mp + at, fp + at, kernel_choice(scalar));
          });
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
        const float* mp = binding_float32(m_, std::string(fn) + ": m", &n);
        const float* dp = binding_float32(denom_, std::string(fn) + ": denom", &n);
        std::vector<int64_t> sizes;
        const std::vector<float*> xs = binding_float32_layers(params, n, scales.size(), fn, &sizes);
        nb::gil_scoped_release nogil;
        for_each_layer(sizes, [&](size_t i, int64_t at) {
          onebit_lamb_apply(mp + at, dp + at, sizes[i], bc1, wd, scales[i], xs[i], kernel_choice(scalar));
        });
      },
      nb::arg("m"), nb::arg("denom"), nb::arg("params"), nb::arg("bc1"), nb::arg("weight_decay"), nb::arg("scales"),
      nb::arg("scalar") = false,
      "Paper 001 Alg. 1 lines 20-21 per layer (float32): x += (m / denom / bc1 + wd x) * scale, the parameters "
      "in the flat buffers' order (None for an empty one). scalar: the portable code instead of AVX2.");
}

}  // namespace hvdc
