// Python bindings of the compressed reductions of the dense path (hvdc/sparse_allreduce.h),
// registered into hvd_compress._core by bindings.cc.
#pragma once
#include <nanobind/nanobind.h>

#include "hvdc/binding_views.h"

namespace hvdc {

// Adds _core.sparse_allreduce (on the Runtime, through Runtime::sparse_allreduce), _core.sparse_k,
// _core.topk_select and _core.randomk_select. Call after the Runtime class is bound.
void register_sparse(nanobind::module_& m);

}  // namespace hvdc
