// Python bindings of the random-k masks and the masked allreduce (hvdc/masks.h,
// hvdc/masked_allreduce.h), registered into hvd_compress._core by bindings.cc.
#pragma once
#include <nanobind/nanobind.h>

#include <string>

#include "hvdc/tensor.h"

namespace hvdc {

// bindings.cc's one translation of a DLPack object into a core view (UsageError, prefixed with
// `what`, for anything the core cannot address), so that this file does not keep a second one.
using ViewOf = TensorView (*)(nanobind::handle obj, const std::string& what);

// Adds _core.random_mask, _core.cyclic_permutation, _core.mask_gather, _core.mask_scatter and the
// method Runtime.masked_allreduce (the class must be registered already).
void register_masked(nanobind::module_& m, ViewOf view_of);

}  // namespace hvdc
