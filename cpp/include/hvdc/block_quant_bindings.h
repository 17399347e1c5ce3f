// Python binding of the block-quantized allreduce (hvdc/block_quant_allreduce.h), registered into
// hvd_compress._core by bindings.cc.
#pragma once
#include <nanobind/nanobind.h>

#include "hvdc/binding_views.h"

namespace hvdc {

// Adds _core.block_quant_allreduce (through Runtime::block_quant_allreduce). Call after the Runtime class is bound.
void register_block_quant(nanobind::module_& m);

}  // namespace hvdc
