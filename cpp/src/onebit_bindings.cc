// _core.onebit_padded_numel (see hvdc/compressed_allreduce.h) and the kernels' ISA. The kernel
// self-check and benchmark are not shipped: they live in hvd_compress._kernel_bench
// (cpp/bench/onebit_self_check.cc, onebit_kernel_bench.cc). The collective itself is
// Runtime.compressed_allreduce (bindings.cc, runtime.h), on the protocol every collective shares.
#include "hvdc/onebit_bindings.h"

#include "hvdc/compressed_allreduce.h"
#include "hvdc/onebit_kernels.h"

namespace nb = nanobind;

namespace hvdc {

void register_onebit(nb::module_& m) {
  m.def("onebit_kernel_isa", &onebit_kernel_isa,
        "The 1-bit kernels' implementation on this machine: \"avx2\" or \"scalar\".");
  m.def("onebit_padded_numel", &onebit_padded_numel, nb::arg("numel"), nb::arg("world_size"),
        "numel rounded up to a multiple of 8 * world_size: the padded length of a 1-bit buffer.");
}

}  // namespace hvdc
