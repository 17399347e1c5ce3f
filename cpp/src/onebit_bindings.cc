// _core.onebit_padded_numel (see hvdc/compressed_allreduce.h) and the 1-bit kernel hooks. The
// collective itself is Runtime.compressed_allreduce (bindings.cc, runtime.h), on the protocol
// every collective shares.
#include "hvdc/onebit_bindings.h"

#include <nanobind/ndarray.h>
#include <nanobind/stl/map.h>
#include <nanobind/stl/string.h>

#include <string>

#include "hvdc/compressed_allreduce.h"
#include "hvdc/errors.h"
#include "hvdc/onebit_kernel_bench.h"
#include "hvdc/onebit_kernels.h"

namespace nb = nanobind;

namespace hvdc {
namespace {

// float32, float16 or bfloat16 by name (the kernel test and benchmark hooks).
DType dtype_named(const std::string& name) {
  for (DType t : {DType::kFloat32, DType::kFloat16, DType::kBFloat16})
    if (name == dtype_name(t)) return t;
  throw UsageError("1-bit kernels: dtype '" + name + "' is not one of float32, float16, bfloat16");
}

}  // namespace

void register_onebit(nb::module_& m) {
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
  m.def("onebit_kernel_isa", &onebit_kernel_isa,
        "The 1-bit kernels' implementation on this machine: \"avx2\" or \"scalar\".");
  m.def("onebit_padded_numel", &onebit_padded_numel, nb::arg("numel"), nb::arg("world_size"),
        "numel rounded up to a multiple of 8 * world_size: the padded length of a 1-bit buffer.");
}

}  // namespace hvdc
