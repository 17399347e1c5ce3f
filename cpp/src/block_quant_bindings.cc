// _core.block_quant_allreduce: the collective of hvdc/block_quant_allreduce.h on the Runtime's one protocol
// (Runtime::block_quant_allreduce): signature agreement, rejection on every rank.
#include "hvdc/block_quant_bindings.h"

#include <nanobind/stl/string.h>

#include <string>

#include "hvdc/errors.h"
#include "hvdc/runtime.h"
#include "hvdc/signature.h"

namespace nb = nanobind;

namespace hvdc {

void register_block_quant(nb::module_& m) {
  m.def(
      "block_quant_allreduce",
      [](Runtime& rt, nb::handle tensor, nb::handle error, int bits, int op, const std::string& name) {
        TensorView buffer, err;
        try {
          buffer = binding_view_of(tensor, "block_quant_allreduce: tensor");
          if (!error.is_none()) err = binding_view_of(error, "block_quant_allreduce: error buffer");
        } catch (const UsageError& e) {
          nb::gil_scoped_release nogil;  // join the exchange so that no peer waits for this rank
          rt.reject(kBlockQuantAllreduce, e.what(), name);
        }
        CommStats moved;
        {
          nb::gil_scoped_release nogil;
          moved = rt.block_quant_allreduce(buffer, err, bits, static_cast<ReduceOp>(op), name);
        }
        return binding_stats(moved);
      },
      nb::arg("runtime"), nb::arg("tensor"), nb::arg("error").none(), nb::arg("bits"), nb::arg("op"),
      nb::arg("name") = "",
      "In place: `tensor` (contiguous float32, CPU) becomes its int8 (bits 8) or int4 (bits 4) block-quantized "
      "reduction over all ranks (op 0 Average, 1 Sum); `error` (float32, numel, or None) is added before "
      "quantizing and becomes what quantizing lost. Returns this call's bytes.");
}

}  // namespace hvdc
