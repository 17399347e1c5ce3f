// Python bindings of the 1-bit collective (compressed_allreduce.h), registered into the module
// hvd_compress._core by bindings.cc.
#pragma once
#include <nanobind/nanobind.h>

namespace hvdc {

// Adds _core.compressed_allreduce(runtime, tensor, worker_error, server_error, name) and
// _core.onebit_padded_numel(numel, world_size).
void register_onebit(nanobind::module_& m);

}  // namespace hvdc
