// _core.random_mask and friends, and Runtime.masked_allreduce (see hvdc/masked_bindings.h).
#include "hvdc/masked_bindings.h"

#include <nanobind/ndarray.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <optional>
#include <vector>

#include "hvdc/binding_views.h"
#include "hvdc/errors.h"
#include "hvdc/masks.h"
#include "hvdc/runtime.h"

namespace nb = nanobind;

namespace hvdc {
namespace {

using BoolFlat = nb::ndarray<bool, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

// The mask of (numel, ...) restricted to [first, first + length) (hvdc/masks.h).
MaskSpec spec_of(int64_t numel, double ratio, uint64_t seed, int64_t step, int kind,
                 std::vector<int64_t> always, int64_t first = 0, int64_t length = -1) {
  MaskSpec s;
  s.numel = numel;
  s.first = first;
  s.length = length;
  s.ratio = ratio;
  s.seed = seed;
  s.step = step;
  s.kind = static_cast<MaskKind>(kind);
  s.always = std::move(always);
  return s;
}

}  // namespace

void register_masked(nb::module_& m, nb::class_<Runtime>& runtime) {
  m.def(
      "random_mask",
      [](BoolFlat out, double ratio, uint64_t seed, int64_t step, int kind,
         std::vector<int64_t> always, int64_t offset, int64_t total) {
        const int64_t n = static_cast<int64_t>(out.shape(0));
        const MaskSpec s = spec_of(total < 0 ? n : total, ratio, seed, step, kind, std::move(always),
                                   offset, n);
        const std::string why = check_mask_spec(s);
        if (!why.empty()) throw UsageError("random_mask: " + why);
        nb::gil_scoped_release nogil;
        random_mask(s, reinterpret_cast<uint8_t*>(out.data()));
      },
      nb::arg("out"), nb::arg("ratio"), nb::arg("seed"), nb::arg("step"), nb::arg("kind") = 0,
      nb::arg("always") = std::vector<int64_t>{}, nb::arg("offset") = 0, nb::arg("total") = -1,
      "Fills the bool array `out` with the random-k mask of (total, ratio, seed, step, kind: "
      "0 cyclic, 1 bernoulli), plus the (offset, length) pairs in `always` (hvdc/masks.h), "
      "elements [offset, offset + len(out)) of it; total < 0: len(out) (the whole mask).");
  m.def(
      "cyclic_permutation",
      [](int64_t numel, uint64_t seed) {
        if (numel < 0 || numel >= (int64_t{1} << 32))
          throw UsageError("cyclic_permutation: numel must be in [0, 2^32)");
        return cyclic_permutation(numel, seed);
      },
      nb::arg("numel"), nb::arg("seed"),
      "The permutation pi of the cyclic masks of (numel, seed), as a list (for tests).");
  m.def(
      "mask_gather",
      [](nb::handle src, BoolFlat mask, nb::handle dst) {
        const TensorView s = binding_view_of(src, "mask_gather: src");
        const TensorView d = binding_view_of(dst, "mask_gather: dst");
        const auto* mk = reinterpret_cast<const uint8_t*>(mask.data());
        if (static_cast<int64_t>(mask.shape(0)) != s.numel || s.dtype != d.dtype)
          throw UsageError("mask_gather: mask and src sizes or src and dst dtypes differ");
        nb::gil_scoped_release nogil;
        const int64_t count = mask_count(mk, s.numel);
        if (count > d.numel) throw UsageError("mask_gather: dst is too small");
        return mask_gather(s.data, mk, s.numel, count, dtype_size(s.dtype), d.data);
      },
      nb::arg("src"), nb::arg("mask"), nb::arg("dst"),
      "dst[:count] = src[mask] (index order); returns count.");
  m.def(
      "mask_scatter",
      [](nb::handle compact, BoolFlat mask, nb::handle dst) {
        const TensorView c = binding_view_of(compact, "mask_scatter: compact");
        const TensorView d = binding_view_of(dst, "mask_scatter: dst");
        const auto* mk = reinterpret_cast<const uint8_t*>(mask.data());
        if (static_cast<int64_t>(mask.shape(0)) != d.numel || c.dtype != d.dtype)
          throw UsageError("mask_scatter: mask and dst sizes or compact and dst dtypes differ");
        nb::gil_scoped_release nogil;
        const int64_t count = mask_count(mk, d.numel);
        if (count > c.numel) throw UsageError("mask_scatter: compact is too small");
        return mask_scatter(c.data, mk, d.numel, count, dtype_size(d.dtype), d.data);
      },
      nb::arg("compact"), nb::arg("mask"), nb::arg("dst"),
      "dst[mask] = compact[:count] (index order), the rest of dst unchanged; returns count.");
  m.def(
      "mask_sum_squares",
      [](nb::handle x, BoolFlat mask) {
        const TensorView v = binding_view_of(x, "mask_sum_squares: x");
        if (v.dtype != DType::kFloat32) throw UsageError("mask_sum_squares: x must be float32");
        if (static_cast<int64_t>(mask.shape(0)) != v.numel)
          throw UsageError("mask_sum_squares: mask and x sizes differ");
        MaskedSumSquares r;
        {
          nb::gil_scoped_release nogil;
          r = mask_sum_squares(static_cast<const float*>(v.data),
                               reinterpret_cast<const uint8_t*>(mask.data()), v.numel);
        }
        return nb::make_tuple(r.selected, r.unselected, r.count);
      },
      nb::arg("x"), nb::arg("mask"),
      "(sum of x[mask]**2, sum of x[~mask]**2, count of mask) for float32 x, in one pass.");
  m.def(
      "mask_freshness",
      [](nb::handle c, BoolFlat mask, float beta3) {
        const TensorView v = binding_view_of(c, "mask_freshness: c");
        if (v.dtype != DType::kFloat32) throw UsageError("mask_freshness: c must be float32");
        if (static_cast<int64_t>(mask.shape(0)) != v.numel)
          throw UsageError("mask_freshness: mask and c sizes differ");
        nb::gil_scoped_release nogil;
        mask_freshness(static_cast<float*>(v.data), reinterpret_cast<const uint8_t*>(mask.data()), v.numel,
                       beta3);
      },
      nb::arg("c"), nb::arg("mask"), nb::arg("beta3"),
      "In place: c = 1 where mask, else beta3 * c (float32, SLAMB's freshness).");

  runtime.def(
      "masked_allreduce",
      [](Runtime& rt, nb::handle tensor, double ratio, uint64_t seed, int64_t step,
                int kind, std::vector<int64_t> always, std::optional<BoolFlat> mask_out,
                bool check_finite, const std::string& name, int64_t offset, int64_t total) {
        TensorView v;
        try {
          v = binding_view_of(tensor, "masked_allreduce");
          if (mask_out && static_cast<int64_t>(mask_out->shape(0)) != v.numel)
            throw UsageError("masked_allreduce: mask_out has " + std::to_string(mask_out->shape(0)) +
                             " elements, the tensor " + std::to_string(v.numel));
        } catch (const UsageError& e) {
          // This rank still joins the exchange, so that no peer waits for it.
          nb::gil_scoped_release nogil;
          rt.reject(kMaskedAllreduce, e.what(), name);
        }
        const MaskSpec s = spec_of(total < 0 ? v.numel : total, ratio, seed, step, kind,
                                   std::move(always), offset, v.numel);
        uint8_t* out = mask_out ? reinterpret_cast<uint8_t*>(mask_out->data()) : nullptr;
        CommStats moved;
        {
          nb::gil_scoped_release nogil;
          moved = rt.masked_allreduce(v, s, out, check_finite, name);
        }
        return binding_stats(moved);
      },
      nb::arg("tensor"),
      nb::arg("ratio"), nb::arg("seed"), nb::arg("step"), nb::arg("kind") = 0,
      nb::arg("always") = std::vector<int64_t>{}, nb::arg("mask_out").none() = nb::none(),
      nb::arg("check_finite") = false, nb::arg("name") = "", nb::arg("offset") = 0,
      nb::arg("total") = -1,
      "In place: the elements of `tensor` that the random-k mask of (total, ratio, seed, step, "
      "kind) plus `always` selects become their average over all ranks; the others stay. `tensor` "
      "holds elements [offset, offset + numel) of the mask's index space (total < 0: numel, the "
      "whole). The mask's arguments are agreed (MismatchError on every rank if they differ). "
      "`mask_out` (bool, numel) receives the mask. `check_finite`: NaN/Inf on any rank raises "
      "UsageError on every rank, tensor unchanged. Returns this call's bytes.");
  runtime.def(
      "masked_gather",
      [](Runtime& rt, nb::handle tensor, nb::handle compact, double ratio, uint64_t seed, int64_t step, int kind,
         std::vector<int64_t> always, BoolFlat mask_out, bool check_finite, const std::string& name, int64_t offset,
         int64_t total) {
        TensorView v, out;
        try {
          v = binding_view_of(tensor, "masked_gather");
          if (!compact.is_none()) {
            out = binding_view_of(compact, "masked_gather: compact");
            if (out.dtype != v.dtype) throw UsageError("masked_gather: compact and tensor dtypes differ");
          }
          if (static_cast<int64_t>(mask_out.shape(0)) != v.numel)
            throw UsageError("masked_gather: mask_out has " + std::to_string(mask_out.shape(0)) +
                             " elements, the tensor " + std::to_string(v.numel));
        } catch (const UsageError& e) {
          nb::gil_scoped_release nogil;  // this rank still joins the exchange, so that no peer waits for it
          rt.reject(kMaskedGather, e.what(), name);
        }
        const MaskSpec s = spec_of(total < 0 ? v.numel : total, ratio, seed, step, kind, std::move(always), offset,
                                   v.numel);
        CommStats moved;
        int64_t count = 0;
        {
          nb::gil_scoped_release nogil;
          moved = rt.masked_gather(v, s, reinterpret_cast<uint8_t*>(mask_out.data()), out.data, out.numel,
                                   check_finite, name, &count);
        }
        nb::dict d = binding_stats(moved);
        d["count"] = count;
        return d;
      },
      nb::arg("tensor"), nb::arg("compact").none(),
      nb::arg("ratio"), nb::arg("seed"), nb::arg("step"), nb::arg("kind") = 0,
      nb::arg("always") = std::vector<int64_t>{}, nb::arg("mask_out"), nb::arg("check_finite") = false,
      nb::arg("name") = "", nb::arg("offset") = 0, nb::arg("total") = -1,
      "The agreement and gather of masked_allreduce without its average: the mask's arguments are agreed "
      "(MismatchError on every rank if they differ; `check_finite`: NaN/Inf in `tensor` on any rank raises "
      "UsageError on every rank), then the mask goes to `mask_out` and tensor[mask], in index order, to the "
      "front of `compact` (same dtype, room for every selected element; None: the mask only). Returns this "
      "call's bytes and the `count` selected.");
}

}  // namespace hvdc
