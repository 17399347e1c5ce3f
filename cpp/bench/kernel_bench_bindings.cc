// hvd_compress._kernel_bench: the 1-bit kernels' self-check and micro-benchmark
// (hvdc/onebit_kernel_bench.h) and that of Birder's stochastic quantizer
// (hvdc/stochastic_kernel_bench.h), a small extension of their own so that the shipped
// hvd_compress._core carries no test or benchmark hook. It holds its own copy of the kernels
// (cpp/src/onebit_kernels.cc, compiled as for _core), which choose their implementation exactly
// as _core's do (CPU features, HVDC_ONEBIT_KERNELS).
#include <nanobind/nanobind.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <string>

#include "hvdc/errors.h"
#include "hvdc/onebit_kernel_bench.h"
#include "hvdc/onebit_kernels.h"
#include "hvdc/stochastic_kernel_bench.h"
#include "hvdc/stochastic_kernels.h"

namespace nb = nanobind;
using namespace hvdc;

namespace {

// float32, float16 or bfloat16 by name.
DType dtype_named(const std::string& name) {
  for (DType t : {DType::kFloat32, DType::kFloat16, DType::kBFloat16})
    if (name == dtype_name(t)) return t;
  throw UsageError("1-bit kernels: dtype '" + name + "' is not one of float32, float16, bfloat16");
}

}  // namespace

NB_MODULE(_kernel_bench, m) {
  m.doc() = "Self-check and micro-benchmark of the 1-bit kernels (not part of hvd_compress._core).";
  m.def(
      "onebit_kernel_bench",
      [](int64_t numel, const std::string& dtype, int reps) {
        const DType t = dtype_named(dtype);
        nb::gil_scoped_release nogil;
        return onebit_kernel_bench(numel, t, reps);
      },
      nb::arg("numel"), nb::arg("dtype") = "float32", nb::arg("reps") = 7,
      "Median seconds (one thread) of each 1-bit kernel on one chunk of `numel` elements and of "
      "memcpy of the bytes it streams: keys compress, compress_signs, accumulate, "
      "server_compress, server_fused, decompress, error_decompress and memcpy_<kernel> (see "
      "hvdc/onebit_kernel_bench.h), plus numel.");
  m.def(
      "onebit_kernels_self_check",
      [](int64_t numel, const std::string& dtype, uint64_t seed) {
        const DType t = dtype_named(dtype);
        nb::gil_scoped_release nogil;
        return onebit_kernels_self_check(numel, t, seed);
      },
      nb::arg("numel"), nb::arg("dtype"), nb::arg("seed") = 0,
      "\"\" if the scalar and AVX2 kernels give identical bytes on `numel` pseudo-random "
      "elements (or this machine has no AVX2), else what differed.");
  m.def(
      "stochastic_kernel_bench",
      [](int64_t numel, int reps) {
        nb::gil_scoped_release nogil;
        return stochastic_kernel_bench(numel, reps);
      },
      nb::arg("numel"), nb::arg("reps") = 7,
      "Median seconds (one thread) of Birder's stochastic quantizer kernels on `numel` float32 "
      "elements (Philox draws) and of memcpy of the bytes each streams: keys stochastic_quantize, "
      "stochastic_quantize_moments, stochastic_server, sign_unpack, philox_fill and "
      "memcpy_<kernel> (see hvdc/stochastic_kernel_bench.h), plus numel.");
  m.def("stochastic_kernel_isa", &stochastic_kernel_isa,
        "The implementation this module's stochastic kernels run: \"avx2\" or \"scalar\".");
  m.def("onebit_kernel_isa", &onebit_kernel_isa,
        "The implementation this module's kernels run: \"avx2\" or \"scalar\".");
}
