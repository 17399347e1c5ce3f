// Python bindings of Birder's core pieces (hvdc/stochastic_kernels.h, hvdc/hierarchical_allreduce.h),
// registered into hvd_compress._core by bindings.cc after the Runtime class.
#pragma once
#include <nanobind/nanobind.h>

namespace hvdc {

class Runtime;  // hvdc/runtime.h

// Adds the methods Runtime.node_size and Runtime.hierarchical_compressed_allreduce to `runtime`
// (with .def, as bindings.cc adds the others), _core.stochastic_quantize,
// _core.hierarchical_padded_numel and _core.stochastic_kernel_isa.
void register_birder(nanobind::module_& m, nanobind::class_<Runtime>& runtime);

}  // namespace hvdc
