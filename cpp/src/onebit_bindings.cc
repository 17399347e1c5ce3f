// _core.compressed_allreduce and _core.onebit_padded_numel (see hvdc/compressed_allreduce.h).
// Every way a call can be wrong on one rank (not a tensor, bad dtype or device, error buffers of
// the wrong size or dtype, non-finite input) is carried in the signature exchange, so every rank
// raises the same UsageError before any data or error buffer is touched.
#include "hvdc/onebit_bindings.h"

#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>

#include <cstdio>
#include <string>

#include "hvdc/compressed_allreduce.h"
#include "hvdc/errors.h"
#include "hvdc/onebit_kernels.h"
#include "hvdc/runtime.h"
#include "hvdc/signature.h"

namespace nb = nanobind;

namespace hvdc {
namespace {

DType dtype_of(const nb::dlpack::dtype& dt, const char* what) {
  using Code = nb::dlpack::dtype_code;
  if (dt.lanes == 1 && dt.code == static_cast<uint8_t>(Code::Float)) {
    if (dt.bits == 16) return DType::kFloat16;
    if (dt.bits == 32) return DType::kFloat32;
    if (dt.bits == 64) return DType::kFloat64;
  }
  if (dt.lanes == 1 && dt.code == static_cast<uint8_t>(Code::Bfloat) && dt.bits == 16)
    return DType::kBFloat16;
  throw UsageError(std::string("compressed_allreduce: ") + what + " has an unsupported dtype (code " +
                   std::to_string(dt.code) + ", " + std::to_string(dt.bits) +
                   " bits); use float32, float16 or bfloat16");
}

// A DLPack object as a core view (contiguous, CPU), or UsageError naming `what`.
TensorView view_of(nb::handle obj, const char* what) {
  nb::ndarray<> a;
  try {
    a = nb::cast<nb::ndarray<>>(obj);
  } catch (const std::exception&) {
    throw UsageError(std::string("compressed_allreduce: ") + what +
                     " is not a tensor that supports DLPack");
  }
  TensorView v;
  v.dtype = dtype_of(a.dtype(), what);
  if (a.device_type() != nb::device::cpu::value)
    throw UsageError(std::string("compressed_allreduce: ") + what +
                     " is not on the CPU; this build handles CPU tensors only");
  int64_t expect = 1;
  for (size_t d = a.ndim(); d-- > 0;) {
    if (a.shape(d) != 1 && a.stride(d) != expect)
      throw UsageError(std::string("compressed_allreduce: ") + what +
                       " is not contiguous; call .contiguous() first");
    expect *= a.shape(d);
  }
  v.numel = static_cast<int64_t>(a.size());
  v.data = a.data();
  v.device = Device::kCPU;
  return v;
}

void run(Runtime& rt, nb::handle tensor, nb::handle worker_error, nb::handle server_error,
         const std::string& name) {
  TensorView buf, werr, serr;
  try {
    buf = view_of(tensor, "tensor");
    werr = view_of(worker_error, "worker error");
    serr = view_of(server_error, "server error");
  } catch (const UsageError& e) {
    nb::gil_scoped_release nogil;
    rt.reject(kCompressedAllreduce, e.what(), name);
  }
  // The views point into tensors the caller keeps alive for the call; the GIL is not needed.
  nb::gil_scoped_release nogil;
  const auto lock = rt.serialize();
  CallSignature sig = signature_of(kCompressedAllreduce, buf, 0, name);
  // Local checks (sizes, dtypes, finiteness) ride in the signature: one exchange, and a rank
  // with bad input makes every rank raise before any error buffer changes. The finiteness check
  // is fused into the first (read-only) pass of phase 1, which onebit_prepare runs here.
  OneBitCall call;
  const std::string why = onebit_prepare(buf, werr, serr, rt.size(), call);
  if (!why.empty()) std::snprintf(sig.error, sizeof(sig.error), "%s", why.c_str());
  rt.agree(sig, name.empty() ? "compressed_allreduce" : name);
  rt.world().stats().calls++;
  compressed_allreduce_prepared(rt.world(), call);
}

}  // namespace

void register_onebit(nb::module_& m) {
  m.def("compressed_allreduce", &run, nb::arg("runtime"), nb::arg("tensor"),
        nb::arg("worker_error"), nb::arg("server_error"), nb::arg("name") = "",
        "In place: `tensor` (contiguous CPU float32/float16/bfloat16) becomes the "
        "error-compensated 1-bit average over all ranks (1-bit Adam, paper 003 Alg. 1 lines 7-13); "
        "`worker_error` (numel float32) and `server_error` (onebit_padded_numel(numel, size) / size "
        "float32) are updated.");
  m.def("onebit_kernel_isa", &onebit_kernel_isa,
        "The 1-bit kernels' implementation on this machine: \"avx2\" or \"scalar\".");
  m.def("onebit_padded_numel", &onebit_padded_numel, nb::arg("numel"), nb::arg("world_size"),
        "numel rounded up to a multiple of 8 * world_size: the padded length of a 1-bit buffer.");
}

}  // namespace hvdc
