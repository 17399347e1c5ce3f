// Python bindings of the 1-bit helpers (padded length, kernel ISA), registered into the module
// hvd_compress._core by bindings.cc; the collective is Runtime.compressed_allreduce.
#pragma once
#include <nanobind/nanobind.h>

namespace hvdc {

// Adds _core.onebit_padded_numel(numel, world_size) and _core.onebit_kernel_isa().
void register_onebit(nanobind::module_& m);

}  // namespace hvdc
