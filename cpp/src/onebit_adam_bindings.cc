// _core.onebit_local_momentum and _core.onebit_adam_apply (see hvdc/onebit_adam_kernels.h): the fused passes of
// paper 003 Alg. 1 line 6 and lines 12-13 on float32 CPU buffers, one call per bucket without the GIL.
#include <nanobind/nanobind.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "hvdc/binding_views.h"
#include "hvdc/onebit_adam_bindings.h"
#include "hvdc/onebit_adam_kernels.h"

namespace nb = nanobind;

namespace hvdc {

void register_onebit_adam(nb::module_& m) {
  m.def(
      "onebit_local_momentum",
      [](nb::handle g_, nb::handle m_, nb::handle work_, std::optional<std::vector<nb::handle>> params,
         float one_minus_b1, float l2, float b1, bool scalar) {
        const char* fn = "onebit_local_momentum";
        int64_t n = -1;
        const float* gp = binding_float32(g_, std::string(fn) + ": g", &n);
        const float* mp = binding_float32(m_, std::string(fn) + ": m", &n);
        float* wp = binding_float32(work_, std::string(fn) + ": work", &n);
        std::vector<int64_t> sizes{n};
        std::vector<float*> xs{nullptr};
        if (params) xs = binding_float32_layers(*params, n, params->size(), fn, &sizes);
        nb::gil_scoped_release nogil;
        for_each_layer(sizes, [&](size_t i, int64_t at) {
          onebit_local_momentum(gp + at, mp + at, xs[i], sizes[i], one_minus_b1, l2, b1, wp + at,
                                kernel_choice(scalar));
        });
      },
      nb::arg("g"), nb::arg("m"), nb::arg("work"), nb::arg("params").none(), nb::arg("one_minus_beta1"),
      nb::arg("l2"), nb::arg("beta1"), nb::arg("scalar") = false,
      "Paper 003 Alg. 1 line 6 (float32): work = b1 m + (l2 x + (1 - b1) g), the L2 term per layer of params (in the "
      "flat buffers' order, None for an empty one) unless params is None. scalar: the portable code, not AVX2.");
  m.def(
      "onebit_adam_apply",
      [](nb::handle work_, nb::handle m_, nb::handle denom_, const std::vector<nb::handle>& params, float decay,
         float value, const std::optional<std::vector<float>>& floor_denoms, float cap, bool scalar) {
        const char* fn = "onebit_adam_apply";
        int64_t n = -1;
        const float* wp = binding_float32(work_, std::string(fn) + ": work", &n);
        float* mp = binding_float32(m_, std::string(fn) + ": m", &n);
        const float* dp = binding_float32(denom_, std::string(fn) + ": denom", &n);
        std::vector<int64_t> sizes;
        const std::vector<float*> xs = binding_float32_layers(params, n, params.size(), fn, &sizes);
        if (floor_denoms && floor_denoms->size() != sizes.size())
          throw nb::value_error((std::string(fn) + ": need one floor_denom per layer").c_str());
        nb::gil_scoped_release nogil;
        for_each_layer(sizes, [&](size_t i, int64_t at) {
          const float floor_denom = floor_denoms ? (*floor_denoms)[i] : -std::numeric_limits<float>::infinity();
          onebit_adam_apply(wp + at, dp + at, sizes[i], decay, value, floor_denom, cap, mp + at, xs[i],
                            kernel_choice(scalar));
        });
      },
      nb::arg("work"), nb::arg("m"), nb::arg("denom"), nb::arg("params"), nb::arg("decay"), nb::arg("value"),
      nb::arg("floor_denoms").none() = nb::none(), nb::arg("cap") = 1.0f, nb::arg("scalar") = false,
      "Paper 003 Alg. 1 lines 12-13 per layer (float32): m = work; x = x * decay (skipped for 1); d = denom, raised "
      "to |m| * cap where d <= the layer's floor_denom (None: nowhere); x += m * value / d, the parameters in the "
      "flat buffers' order (None for an empty one). scalar: the portable code.");
}

}  // namespace hvdc
