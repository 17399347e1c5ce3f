// _core.slamb_* (see hvdc/slamb_kernels.h): SLAMB's fused passes on float32 CPU buffers.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>
#include <string>

#include "hvdc/binding_views.h"
#include "hvdc/errors.h"
#include "hvdc/masked_bindings.h"
#include "hvdc/slamb_kernels.h"

namespace nb = nanobind;

namespace hvdc {
namespace {

using BoolFlat = nb::ndarray<bool, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

}  // namespace

void register_slamb(nb::module_& m) {
  m.def(
      "slamb_float32_cpu",
      [](nb::handle obj) {
        try {
          const TensorView v = binding_view_of(obj, "slamb_float32_cpu");
          return v.dtype == DType::kFloat32;
        } catch (const UsageError&) {
          return false;
        }
      },
      nb::arg("x"), "Whether x is a contiguous float32 CPU tensor that the slamb_* kernels accept.");
  m.def(
      "slamb_momentum",
      [](nb::handle m_, nb::handle g_, float b1, nb::handle work_) {
        int64_t n = -1;
        const float* mp = binding_float32(m_, "slamb_momentum: m", &n);
        const float* gp = binding_float32(g_, "slamb_momentum: g", &n);
        float* wp = binding_float32(work_, "slamb_momentum: work", &n);
        nb::gil_scoped_release nogil;
        slamb_momentum(mp, gp, n, b1, wp);
      },
      nb::arg("m"), nb::arg("g"), nb::arg("beta1"), nb::arg("work"), "work = b1 m + (1 - b1) g (float32).");
  m.def(
      "slamb_momentum_gather",
      [](nb::handle m_, nb::handle g_, BoolFlat mask, float b1, nb::handle out_) {
        int64_t n = -1, capacity = -1;
        const float* mp = binding_float32(m_, "slamb_momentum_gather: m", &n);
        const float* gp = binding_float32(g_, "slamb_momentum_gather: g", &n);
        float* op = binding_float32(out_, "slamb_momentum_gather: out", &capacity);
        if (static_cast<int64_t>(mask.shape(0)) != n) throw UsageError("slamb_momentum_gather: mask and m sizes differ");
        int64_t count;
        {
          nb::gil_scoped_release nogil;
          count = slamb_momentum_gather(mp, gp, reinterpret_cast<const uint8_t*>(mask.data()), n, b1, op, capacity);
        }
        if (count < 0)
          throw UsageError("slamb_momentum_gather: the mask selects more than out's " + std::to_string(capacity) +
                           " elements");
        return count;
      },
      nb::arg("m"), nb::arg("g"), nb::arg("mask"), nb::arg("beta1"), nb::arg("out"),
      "out[:count] = b1 m[mask] + (1 - b1) g[mask] (float32, index order); returns count.");
  m.def(
      "slamb_moments",
      [](nb::handle work_, nb::handle g_, float b2, nb::handle m_, nb::handle v_) {
        int64_t n = -1;
        const float* wp = binding_float32(work_, "slamb_moments: work", &n);
        const float* gp = binding_float32(g_, "slamb_moments: g", &n);
        float* mp = binding_float32(m_, "slamb_moments: m", &n);
        float* vp = binding_float32(v_, "slamb_moments: v", &n);
        nb::gil_scoped_release nogil;
        return slamb_moments(wp, gp, n, b2, mp, vp);
      },
      nb::arg("work"), nb::arg("g"), nb::arg("beta2"), nb::arg("m"), nb::arg("v"),
      "m = work; v = b2 v + (1 - b2) g^2 (float32); returns the sum of the new v.");
  m.def(
      "slamb_local_moments",
      [](nb::handle g_, BoolFlat mask, float b1, float b2, nb::handle m_, nb::handle v_) {
        int64_t n = -1;
        const float* gp = binding_float32(g_, "slamb_local_moments: g", &n);
        float* mp = binding_float32(m_, "slamb_local_moments: m", &n);
        float* vp = binding_float32(v_, "slamb_local_moments: v", &n);
        if (static_cast<int64_t>(mask.shape(0)) != n) throw UsageError("slamb_local_moments: mask and g sizes differ");
        nb::gil_scoped_release nogil;
        return slamb_local_moments(gp, reinterpret_cast<const uint8_t*>(mask.data()), n, b1, b2, mp, vp);
      },
      nb::arg("g"), nb::arg("mask"), nb::arg("beta1"), nb::arg("beta2"), nb::arg("m"), nb::arg("v"),
      "m = b1 m + (1 - b1) g where not mask; v = b2 v + (1 - b2) g^2 (float32); returns the sum of the new v.");
  m.def(
      "slamb_direction",
      [](nb::handle m_, nb::handle v_, nb::handle x_, BoolFlat mask, float sqrt_bc2, float floor, float eps,
         float bc1, float wd, nb::handle u_, bool local) {
        int64_t n = -1;
        const float* mp = binding_float32(m_, "slamb_direction: m", &n);
        const float* vp = binding_float32(v_, "slamb_direction: v", &n);
        const float* xp = binding_float32(x_, "slamb_direction: x", &n);
        float* up = binding_float32(u_, "slamb_direction: u", &n);
        if (static_cast<int64_t>(mask.shape(0)) != n) throw UsageError("slamb_direction: mask and x sizes differ");
        SlambNorms r;
        {
          nb::gil_scoped_release nogil;
          const auto* mk = reinterpret_cast<const uint8_t*>(mask.data());
          r = local ? slamb_direction_local(mp, vp, xp, mk, n, sqrt_bc2, floor, eps, bc1, wd, up)
                    : slamb_direction(mp, vp, xp, mk, n, sqrt_bc2, floor, eps, bc1, wd, up);
        }
        return nb::make_tuple(r.x.selected, r.x.unselected, r.u.selected, r.u.unselected, r.x.count);
      },
      nb::arg("m"), nb::arg("v"), nb::arg("x"), nb::arg("mask"), nb::arg("sqrt_bc2"), nb::arg("floor"),
      nb::arg("eps"), nb::arg("bc1"), nb::arg("weight_decay"), nb::arg("u"), nb::arg("local") = false,
      "u = m / (max(sqrt(v) / sqrt_bc2, floor) + eps) / bc1 + wd x (float32); returns the sums of squares "
      "(x[mask], x[~mask], u[mask], u[~mask]) and the count of mask. `local`: "
      "u[mask] = 1 / (max(sqrt(v) / sqrt_bc2, floor) + eps) instead, its sum of squares not meaningful "
      "(slamb_direction_local).");
  m.def(
      "slamb_masked_direction",
      [](nb::handle m_avg_, nb::handle x_, BoolFlat mask, float bc1, float wd, nb::handle m_, nb::handle u_) {
        int64_t count = -1, n = -1;
        const float* ap = binding_float32(m_avg_, "slamb_masked_direction: m_avg", &count);
        const float* xp = binding_float32(x_, "slamb_masked_direction: x", &n);
        float* mp = binding_float32(m_, "slamb_masked_direction: m", &n);
        float* up = binding_float32(u_, "slamb_masked_direction: u", &n);
        if (static_cast<int64_t>(mask.shape(0)) != n) throw UsageError("slamb_masked_direction: mask and x sizes differ");
        MaskedDirection r;
        {
          nb::gil_scoped_release nogil;
          r = slamb_masked_direction(ap, count, xp, reinterpret_cast<const uint8_t*>(mask.data()), n, bc1, wd, mp, up);
        }
        if (r.used != count)
          throw UsageError("slamb_masked_direction: the mask selects " +
                           (r.used < 0 ? std::string("more than ") : std::to_string(r.used) + ", not ") +
                           std::to_string(count) + " elements (the averaged values)");
        return r.sum;
      },
      nb::arg("m_avg"), nb::arg("x"), nb::arg("mask"), nb::arg("bc1"), nb::arg("weight_decay"), nb::arg("m"),
      nb::arg("u"),
      "Where mask is set (the j-th such element), u holding slamb_direction_local's factor d: m = m_avg[j], "
      "u = d m_avg[j] / bc1 + wd x (float32, slamb_direction's bits); returns the sum of the new u[mask]^2.");
  m.def(
      "slamb_apply",
      [](nb::handle u_, nb::handle c_, float dphi, float phi_min, float clip_min, float clip_max, float deta,
         float eta_min, nb::handle x_) {
        int64_t n = -1;
        const float* up = binding_float32(u_, "slamb_apply: u", &n);
        const float* cp = binding_float32(c_, "slamb_apply: c", &n);
        float* xp = binding_float32(x_, "slamb_apply: x", &n);
        nb::gil_scoped_release nogil;
        slamb_apply(up, cp, n, dphi, phi_min, clip_min, clip_max, deta, eta_min, xp);
      },
      nb::arg("u"), nb::arg("c"), nb::arg("dphi"), nb::arg("phi_min"), nb::arg("clip_min"), nb::arg("clip_max"),
      nb::arg("deta"), nb::arg("eta_min"), nb::arg("x"),
      "x -= (u clamp(c dphi + phi_min, clip_min, clip_max)) (c deta + eta_min) (float32).");
}

}  // namespace hvdc
