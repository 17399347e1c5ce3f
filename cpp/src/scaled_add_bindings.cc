// _core.scaled_add (see hvdc/scaled_add_kernels.h): out = fma(p, q, base) on float32 CPU buffers, without the GIL.
#include <nanobind/nanobind.h>

#include <cstdint>

#include "hvdc/binding_views.h"
#include "hvdc/scaled_add_bindings.h"
#include "hvdc/scaled_add_kernels.h"

namespace nb = nanobind;

namespace hvdc {

void register_scaled_add(nb::module_& m) {
  m.def(
      "scaled_add",
      [](nb::handle base_, nb::handle p_, float q, nb::handle out_, bool scalar) {
        int64_t n = -1;
        const float* bp = binding_float32(base_, "scaled_add: base", &n);
        const float* pp = binding_float32(p_, "scaled_add: p", &n);
        float* op = binding_float32(out_, "scaled_add: out", &n);
        nb::gil_scoped_release nogil;
        scaled_add(bp, pp, n, q, op, kernel_choice(scalar));
      },
      nb::arg("base"), nb::arg("p"), nb::arg("q"), nb::arg("out"), nb::arg("scalar") = false,
      "out = fma(p, q, base) per element (float32, one rounding; out may be base). scalar: the portable code.");
}

}  // namespace hvdc
