// Python bindings of Birder's core pieces (hvdc/stochastic_kernels.h, hvdc/hierarchical_allreduce.h),
// registered into hvd_compress._core by bindings.cc after the Runtime class.
#pragma once
#include <nanobind/nanobind.h>

namespace hvdc {

// Adds Runtime.hierarchical_compressed_allreduce, _core.stochastic_quantize,
// _core.hierarchical_padded_numel and _core.stochastic_kernel_isa.
void register_birder(nanobind::module_& m);

}  // namespace hvdc
