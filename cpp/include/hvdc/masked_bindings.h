// Python bindings of the random-k masks and the masked allreduce (hvdc/masks.h,
// hvdc/masked_allreduce.h), registered into hvd_compress._core by bindings.cc.
#pragma once
#include <nanobind/nanobind.h>

namespace hvdc {

// Adds _core.random_mask, _core.cyclic_permutation, _core.mask_gather, _core.mask_scatter and the
// method Runtime.masked_allreduce (the class must be registered already).
void register_masked(nanobind::module_& m);

}  // namespace hvdc
