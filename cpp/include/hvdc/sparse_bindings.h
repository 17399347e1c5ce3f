// Python bindings of the compressed reductions of the dense path (hvdc/sparse_allreduce.h),
// registered into hvd_compress._core by bindings.cc.
#pragma once
#include <nanobind/nanobind.h>

#include <string>

#include "hvdc/comm_stats.h"
#include "hvdc/tensor.h"

namespace hvdc {

// Adds _core.sparse_allreduce (on the Runtime, through Runtime::sparse_allreduce), _core.sparse_k,
// _core.topk_select and _core.randomk_select. Call after the Runtime class is bound.
void register_sparse(nanobind::module_& m);

// Defined in bindings.cc, so that every binding file turns a DLPack object into a core view and
// returns byte counts the one way: the view (UsageError prefixed with `what` if the core cannot
// address it) and the {"bytes_sent", "bytes_received", "calls"} dict.
TensorView binding_view_of(nanobind::handle obj, const std::string& what);
nanobind::dict binding_stats(const CommStats& s);

}  // namespace hvdc
