// _core.sparse_allreduce and the selection helpers of hvdc/sparse_allreduce.h. The collective runs on
// the Runtime's one protocol (Runtime::sparse_allreduce): signature agreement, rejection on every rank.
#include "hvdc/sparse_bindings.h"

#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "hvdc/errors.h"
#include "hvdc/runtime.h"
#include "hvdc/signature.h"
#include "hvdc/sparse_allreduce.h"

namespace nb = nanobind;

namespace hvdc {

namespace {

template <typename T>
using Flat = nb::ndarray<T, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

}  // namespace

void register_sparse(nb::module_& m) {
  m.def(
      "sparse_allreduce",
      [](Runtime& rt, nb::handle tensor, nb::handle error, int kind, int op, double ratio, uint64_t seed,
         uint64_t step, std::vector<int64_t> sizes, const std::string& name, nb::handle velocity,
         double momentum, bool momentum_masking) {
        TensorView buffer, err, vel;
        try {
          buffer = binding_view_of(tensor, "allreduce(compression): tensor");
          if (!error.is_none()) err = binding_view_of(error, "allreduce(compression): error buffer");
          if (!velocity.is_none()) vel = binding_view_of(velocity, "allreduce(compression): velocity buffer");
        } catch (const UsageError& e) {
          nb::gil_scoped_release nogil;  // join the exchange so that no peer waits for this rank
          rt.reject(kSparseAllreduce, e.what(), name);
        }
        SparseSpec spec;
        spec.kind = static_cast<SparseKind>(kind);
        spec.op = static_cast<ReduceOp>(op);
        spec.ratio = ratio;
        spec.seed = seed;
        spec.step = static_cast<uint32_t>(step);
        spec.segments = std::move(sizes);
        spec.momentum = momentum;
        spec.momentum_masking = momentum_masking;
        CommStats moved;
        {
          nb::gil_scoped_release nogil;
          moved = rt.sparse_allreduce(buffer, err, vel, spec, name);
        }
        return binding_stats(moved);
      },
      nb::arg("runtime"), nb::arg("tensor"), nb::arg("error").none(), nb::arg("kind"), nb::arg("op"),
      nb::arg("ratio") = 1.0, nb::arg("seed") = 0, nb::arg("step") = 0, nb::arg("sizes") = std::vector<int64_t>(), nb::arg("name") = "",
      nb::arg("velocity").none() = nb::none(), nb::arg("momentum") = 0.0,
      nb::arg("momentum_masking") = true,
      "In place: `tensor` (contiguous CPU float) becomes its compressed reduction over all ranks "
      "(kind 1 fp16, 2 bf16, 3 top-k, 4 random-k; op 0 Average, 1 Sum); `error` (numel float32, "
      "top-k/random-k; None otherwise) is updated; `sizes` cuts it into tensors that each send their own k "
      "(empty: one tensor); top-k with `momentum` in (0, 1): DGC momentum correction, `velocity` (numel "
      "float32) updated too (zeroed where this rank sent, unless `momentum_masking` is false). Returns this call's bytes.");
  m.def("sparse_k", &sparse_k, nb::arg("numel"), nb::arg("ratio"),
        "Elements top-k/random-k send of `numel` at `ratio`: floor(ratio * numel + 0.5) in [1, numel].");
  m.def(
      "topk_select",
      [](Flat<const float> c, Flat<uint32_t> idx) {
        nb::gil_scoped_release nogil;
        topk_select(c.data(), static_cast<int64_t>(c.shape(0)), static_cast<int64_t>(idx.shape(0)),
                    idx.data());
      },
      nb::arg("c"), nb::arg("idx"),
      "Fills `idx` (k = len(idx)) with the ascending indices of the k elements of largest |c|.");
  m.def(
      "randomk_select",
      [](int64_t numel, uint64_t seed, uint64_t step, Flat<uint32_t> idx) {
        nb::gil_scoped_release nogil;
        randomk_select(numel, static_cast<int64_t>(idx.shape(0)), seed, static_cast<uint32_t>(step),
                       idx.data());
      },
      nb::arg("numel"), nb::arg("seed"), nb::arg("step"), nb::arg("idx"),
      "Fills `idx` (k = len(idx) <= numel) with random-k's ascending indices of (seed, step).");
}

}  // namespace hvdc
