// Runtime.hierarchical_compressed_allreduce (the collective of hvdc/hierarchical_allreduce.h on
// the runtime's protocol) and the stochastic quantizer of hvdc/stochastic_kernels.h, for Python.
// Every buffer is a contiguous CPU float32 array (DLPack, no copy). A rank whose arguments cannot
// even be read still joins the signature exchange (Runtime::reject), so every rank raises.
#include "hvdc/birder_bindings.h"

#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>

#include <cmath>
#include <string>

#include "hvdc/binding_views.h"
#include "hvdc/errors.h"
#include "hvdc/hierarchical_allreduce.h"
#include "hvdc/runtime.h"
#include "hvdc/stochastic_kernels.h"

namespace nb = nanobind;

namespace hvdc {
namespace {

using F32 = nb::ndarray<float, nb::c_contig, nb::device::cpu>;
using U8 = nb::ndarray<uint8_t, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

// A float32 view of `obj` (None: an empty view), through the one DLPack translator; UsageError naming
// `what` otherwise.
TensorView f32_view(nb::handle obj, const char* what) {
  if (obj.is_none()) return TensorView{};
  const std::string where = std::string("hierarchical_compressed_allreduce: ") + what;
  TensorView v = binding_view_of(obj, where);
  if (v.dtype != DType::kFloat32) throw UsageError(where + " must be a contiguous float32 CPU tensor");
  return v;
}

}  // namespace

void register_birder(nb::module_& m, nb::class_<Runtime>& runtime) {
  runtime.def("node_size", &Runtime::node_size,
              "Ranks in this rank's node (HVDC_LOCAL_SIZE or the shared-memory node).");
  runtime.def(
      "hierarchical_compressed_allreduce",
      [](Runtime& rt, nb::handle tensor, nb::handle worker_error, nb::handle server_error,
         int payload, bool hierarchical, uint64_t seed, uint32_t step, nb::handle m_buf,
         nb::handle b_buf, double beta, double eps, nb::handle worker_uniforms,
         nb::handle server_uniforms, const std::string& name) {
        HierarchicalCall call;
        try {
          call.buffer = f32_view(tensor, "tensor");
          call.worker_error = f32_view(worker_error, "worker error");
          call.server_error = f32_view(server_error, "server error");
          call.m = f32_view(m_buf, "moment m");
          call.b = f32_view(b_buf, "moment b");
          call.worker_uniforms = f32_view(worker_uniforms, "worker uniforms");
          call.server_uniforms = f32_view(server_uniforms, "server uniforms");
          if (tensor.is_none()) throw UsageError("hierarchical_compressed_allreduce: no tensor");
          if (m_buf.is_none() != b_buf.is_none())
            throw UsageError("hierarchical_compressed_allreduce: give both moments m and b, or neither");
          if (worker_uniforms.is_none() != server_uniforms.is_none())
            throw UsageError("hierarchical_compressed_allreduce: inject both worker and server uniforms, or neither");
          if (!(beta >= 0 && beta < 1) || !(eps > 0) || !std::isfinite(eps))
            throw UsageError("hierarchical_compressed_allreduce: need 0 <= beta < 1 and eps > 0");
        } catch (const UsageError& e) {
          nb::gil_scoped_release nogil;
          rt.reject(kHierarchicalCompressedAllreduce, e.what(), name);
        }
        call.payload = static_cast<HierarchicalPayload>(payload);
        call.key.seed = seed;
        call.key.step = step;
        call.has_moments = !m_buf.is_none();
        call.beta = static_cast<float>(beta);
        call.one_minus_beta = static_cast<float>(1.0 - beta);
        call.eps = static_cast<float>(eps);
        CommStats moved;
        {
          nb::gil_scoped_release nogil;
          moved = rt.hierarchical_compressed_allreduce(call, hierarchical, name);
        }
        return binding_stats(moved);
      },
      nb::arg("tensor"), nb::arg("worker_error"), nb::arg("server_error"), nb::arg("payload") = 1,
      nb::arg("hierarchical") = true, nb::arg("seed") = 0, nb::arg("step") = 0,
      nb::arg("m").none() = nb::none(), nb::arg("b").none() = nb::none(), nb::arg("beta") = 0.95,
      nb::arg("eps") = 1e-8, nb::arg("worker_uniforms").none() = nb::none(),
      nb::arg("server_uniforms").none() = nb::none(), nb::arg("name") = "",
      "In place: `tensor` (float32, d) becomes the Hierarchical-1-bit-All-Reduce of paper 004 "
      "Section 4. payload 1: Birder's +/-1 (result +/-1.0), 2: the scaled 1-bit payload of "
      "1-bit Adam/LAMB. worker_error: padded d / ranks per node; server_error: padded d / "
      "world size (padded d = hierarchical_padded_numel(d, size)). m, b (with beta, eps): "
      "Birder's moments of this rank's chunk, updated from the node-mean gradient ('grad' "
      "mode). worker_uniforms (nodes x padded d) and server_uniforms (padded d): injected draws "
      "instead of Philox (seed, step). Returns this call's bytes.");

  m.def(
      "stochastic_quantize",
      [](F32 x, F32 error, U8 bits, uint64_t seed, uint32_t step, uint32_t stream, uint64_t offset,
         nb::handle uniforms) {
        const int64_t n = static_cast<int64_t>(x.size());
        if (static_cast<int64_t>(error.size()) != n || static_cast<int64_t>(bits.size()) * 8 < n)
          throw UsageError("stochastic_quantize: error must have len(x) elements, bits len(x) / 8");
        UniformSource u;
        u.key.seed = seed;
        u.key.step = step;
        u.key.stream = stream;
        u.offset = offset;
        if (!uniforms.is_none()) {
          const F32 given = nb::cast<F32>(uniforms);
          if (static_cast<int64_t>(given.size()) != n)
            throw UsageError("stochastic_quantize: uniforms must have len(x) elements");
          u.injected = given.data();
        }
        nb::gil_scoped_release nogil;
        stochastic_quantize(x.data(), error.data(), nullptr, n,
                            static_cast<int64_t>(bits.size()) * 8, u, bits.data());
      },
      nb::arg("x"), nb::arg("error"), nb::arg("bits"), nb::arg("seed") = 0, nb::arg("step") = 0,
      nb::arg("stream") = 0, nb::arg("offset") = 0, nb::arg("uniforms").none() = nb::none(),
      "Worker pass of Birder's quantizer: y = x + error; bits (8 per byte, element 8i+j is bit j) "
      "= Q(y) = [u < (y + 1) / 2]; error = y - Q(y). u: `uniforms`, or Philox uniform (seed, step, "
      "stream, offset + i).");
  m.def("hierarchical_padded_numel", &hierarchical_padded_numel, nb::arg("numel"),
        nb::arg("world_size"), "numel rounded up to a multiple of 8 * world_size.");
  m.def("stochastic_kernel_isa", &stochastic_kernel_isa,
        "The stochastic quantizer's implementation on this machine: \"avx2\" or \"scalar\".");
}

}  // namespace hvdc
