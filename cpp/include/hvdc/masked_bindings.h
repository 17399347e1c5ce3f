// Python bindings of the random-k masks and the masked allreduce (hvdc/masks.h,
// hvdc/masked_allreduce.h), registered into hvd_compress._core by bindings.cc.
#pragma once
#include <nanobind/nanobind.h>

namespace hvdc {

class Runtime;  // hvdc/runtime.h

// Adds _core.random_mask, _core.cyclic_permutation, _core.mask_gather, _core.mask_scatter, and the
// methods Runtime.masked_allreduce and Runtime.masked_gather to `runtime` (with .def, as
// bindings.cc adds the others).
void register_masked(nanobind::module_& m, nanobind::class_<Runtime>& runtime);

// Adds _core.slamb_momentum, slamb_moments, slamb_direction, slamb_apply and slamb_float32_cpu
// (hvdc/slamb_kernels.h; defined in slamb_bindings.cc).
void register_slamb(nanobind::module_& m);

}  // namespace hvdc
