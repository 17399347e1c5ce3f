// Python bindings of 1-bit LAMB's fused compression-stage passes (hvdc/onebit_lamb_kernels.h),
// registered into hvd_compress._core by bindings.cc.
#pragma once
#include <nanobind/nanobind.h>

namespace hvdc {

// Adds _core.onebit_lamb_moments and _core.onebit_lamb_apply (defined in onebit_lamb_bindings.cc).
void register_onebit_lamb(nanobind::module_& m);

}  // namespace hvdc
