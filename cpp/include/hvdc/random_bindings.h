// Python bindings of the core's counter-based generator (hvdc/philox.h), registered into
// hvd_compress._core by bindings.cc.
#pragma once
#include <nanobind/nanobind.h>

namespace hvdc {

// Adds _core.philox4x32_10, _core.philox_fill_u32 and _core.philox_fill_uniform.
void register_random(nanobind::module_& m);

}  // namespace hvdc
