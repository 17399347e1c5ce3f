// Python bindings of 1-bit Adam's fused compression-stage passes (hvdc/onebit_adam_kernels.h),
// registered into hvd_compress._core by bindings.cc.
#pragma once
#include <nanobind/nanobind.h>

namespace hvdc {

// Adds _core.onebit_local_momentum and _core.onebit_adam_apply (defined in onebit_adam_bindings.cc).
void register_onebit_adam(nanobind::module_& m);

}  // namespace hvdc
