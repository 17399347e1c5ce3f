// Python binding of the float32 scaled add (hvdc/scaled_add_kernels.h), registered into hvd_compress._core by
// bindings.cc.
#pragma once
#include <nanobind/nanobind.h>

namespace hvdc {

// Adds _core.scaled_add (defined in scaled_add_bindings.cc).
void register_scaled_add(nanobind::module_& m);

}  // namespace hvdc
