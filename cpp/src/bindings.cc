// Python bindings of the core (module hvd_compress._core). Tensors arrive through DLPack as
// nanobind ndarrays: the core reads and writes the framework's own memory, no copy.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "hvdc/errors.h"
#include "hvdc/runtime.h"
#include "hvdc/onebit_bindings.h"

namespace nb = nanobind;
using namespace hvdc;

namespace {

DType to_dtype(const nb::dlpack::dtype& dt) {
  using Code = nb::dlpack::dtype_code;
  if (dt.lanes == 1) {
    if (dt.code == static_cast<uint8_t>(Code::Float) && dt.bits == 16) return DType::kFloat16;
    if (dt.code == static_cast<uint8_t>(Code::Float) && dt.bits == 32) return DType::kFloat32;
    if (dt.code == static_cast<uint8_t>(Code::Float) && dt.bits == 64) return DType::kFloat64;
    if (dt.code == static_cast<uint8_t>(Code::Bfloat) && dt.bits == 16) return DType::kBFloat16;
    if (dt.code == static_cast<uint8_t>(Code::UInt) && dt.bits == 8) return DType::kUInt8;
  }
  static const char* kinds[] = {"int", "uint", "float", "opaque", "bfloat", "complex", "bool"};
  const std::string kind = dt.code < 7 ? kinds[dt.code] : "code" + std::to_string(dt.code);
  throw UsageError("unsupported dtype " + kind + std::to_string(dt.bits) +
                   ": hvd_compress reduces float16, bfloat16, float32 and float64");
}

// The one translation from a DLPack tensor to a core view; rejects what the core cannot address.
TensorView view_of(const nb::ndarray<>& a, bool allow_bytes = false) {
  TensorView v;
  v.dtype = to_dtype(a.dtype());
  if (v.dtype == DType::kUInt8 && !allow_bytes)
    throw UsageError("unsupported dtype uint8: hvd_compress reduces float16, bfloat16, float32 "
                     "and float64");
  if (a.device_type() != nb::device::cpu::value) {
    throw UsageError("tensor is on device type " + std::to_string(a.device_type()) +
                     "; this build of hvd_compress._core handles CPU tensors only (move the tensor "
                     "to the CPU, or rebuild with nvcc on PATH for CUDA)");
  }
  int64_t expect = 1;
  for (size_t d = a.ndim(); d-- > 0;) {
    if (a.shape(d) != 1 && a.stride(d) != expect)
      throw UsageError("tensor is not contiguous; call .contiguous() first");
    expect *= a.shape(d);
  }
  v.numel = static_cast<int64_t>(a.size());
  v.data = a.data();
  v.device = Device::kCPU;
  return v;
}

}  // namespace

NB_MODULE(_core, m) {
  m.doc() = "hvd_compress C++ core: collectives over MPI on DLPack tensors";

  nb::exception<UsageError>(m, "UsageError", PyExc_ValueError);
  nb::exception<MismatchError>(m, "MismatchError", PyExc_RuntimeError);
  nb::exception<CommTimeoutError>(m, "CommTimeoutError", PyExc_TimeoutError);
  nb::exception<CommError>(m, "CommError", PyExc_RuntimeError);

  m.def("mpi_initialized", &MpiCommunicator::mpi_initialized);
  m.def("build_info", []() {
    nb::dict d;
#ifdef HVDC_WITH_CUDA
    d["cuda"] = true;
#else
    d["cuda"] = false;
#endif
    return d;
  });

  nb::class_<Runtime>(m, "Runtime")
      .def(
          "__init__",
          [](Runtime* self, intptr_t comm_handle, double timeout_s) {
            new (self) Runtime(reinterpret_cast<MPI_Comm>(comm_handle), timeout_s);
          },
          nb::arg("comm_handle"), nb::arg("timeout_s"),
          "Runtime over the MPI communicator whose handle mpi4py gives as comm.handle.")
      .def_prop_ro("rank", &Runtime::rank)
      .def_prop_ro("size", &Runtime::size)
      .def_prop_rw("timeout", &Runtime::timeout, &Runtime::set_timeout)
      .def(
          "allreduce",
          [](Runtime& rt, nb::handle obj, int op, const std::string& name) {
            nb::ndarray<> a;
            try {
              a = nb::cast<nb::ndarray<>>(obj);
            } catch (const std::exception&) {
              nb::gil_scoped_release nogil;
              rt.reject(kAllreduce, "argument is not a tensor that supports DLPack", name);
            }
            TensorView v;
            try {
              v = view_of(a);
              if (op != static_cast<int>(ReduceOp::kSum) &&
                  op != static_cast<int>(ReduceOp::kAverage))
                throw UsageError("allreduce: unknown op " + std::to_string(op));
            } catch (const UsageError& e) {
              nb::gil_scoped_release nogil;
              rt.reject(kAllreduce, e.what(), name);
            }
            nb::gil_scoped_release nogil;
            rt.allreduce(v, static_cast<ReduceOp>(op), name);
          },
          nb::arg("tensor"), nb::arg("op"), nb::arg("name") = "",
          "In-place Sum/Average allreduce of a contiguous tensor.")
      .def(
          "broadcast",
          [](Runtime& rt, nb::ndarray<> a, int root, const std::string& name) {
            TensorView v;
            try {
              v = view_of(a, /*allow_bytes=*/true);
            } catch (const UsageError& e) {
              nb::gil_scoped_release nogil;
              rt.reject(kBroadcast, e.what(), name);
            }
            nb::gil_scoped_release nogil;
            rt.broadcast(v, root, name);
          },
          nb::arg("tensor"), nb::arg("root"), nb::arg("name") = "")
      .def(
          "adasum",
          [](Runtime& rt, nb::handle obj, std::vector<int64_t> sizes, bool hierarchical,
             const std::string& name) {
            nb::ndarray<> a;
            try {
              a = nb::cast<nb::ndarray<>>(obj);
            } catch (const std::exception&) {
              nb::gil_scoped_release nogil;
              rt.reject(kAdasum, "argument is not a tensor that supports DLPack", name);
            }
            TensorView v;
            try {
              v = view_of(a);
            } catch (const UsageError& e) {
              nb::gil_scoped_release nogil;
              rt.reject(kAdasum, e.what(), name);
            }
            if (sizes.empty()) sizes.push_back(v.numel);
            nb::gil_scoped_release nogil;
            rt.adasum(v, sizes, hierarchical, name);
          },
          nb::arg("tensor"), nb::arg("sizes"), nb::arg("hierarchical") = false,
          nb::arg("name") = "",
          "In-place Adasum of a contiguous fused buffer cut into tensors of `sizes` elements "
          "(empty: the whole buffer is one tensor); coefficients per tensor.")
      .def(
          "adasum_group",
          [](Runtime& rt, nb::list tensors, bool hierarchical, const std::string& name) {
            // Separate tensors are packed into one core-owned buffer (one exchange, one small
            // allreduce per level for all of them) and unpacked afterwards.
            std::vector<nb::ndarray<>> arrays;
            std::vector<TensorView> views;
            std::vector<int64_t> sizes;
            try {
              for (size_t i = 0; i < tensors.size(); ++i) {
                try {
                  arrays.push_back(nb::cast<nb::ndarray<>>(tensors[i]));
                } catch (const std::exception&) {
                  throw UsageError("grouped Adasum: item " + std::to_string(i) +
                                   " is not a tensor that supports DLPack");
                }
                views.push_back(view_of(arrays.back()));
                if (views.back().dtype != views.front().dtype)
                  throw UsageError(std::string("grouped Adasum: tensors must share one dtype; item ") +
                                   std::to_string(i) + " is " + dtype_name(views.back().dtype) +
                                   ", item 0 is " + dtype_name(views.front().dtype));
                sizes.push_back(views.back().numel);
              }
            } catch (const UsageError& e) {
              nb::gil_scoped_release nogil;
              rt.reject(kAdasum, e.what(), name);
            }
            nb::gil_scoped_release nogil;
            TensorView fused;
            std::vector<unsigned char> packed;
            if (views.size() == 1) {
              fused = views[0];
            } else if (!views.empty()) {
              fused.dtype = views[0].dtype;
              for (const TensorView& v : views) fused.numel += v.numel;
              packed.resize(fused.nbytes());
              fused.data = packed.data();
              size_t at = 0;
              for (const TensorView& v : views) {
                if (v.numel) std::memcpy(packed.data() + at, v.data, v.nbytes());
                at += v.nbytes();
              }
            }
            rt.adasum(fused, sizes, hierarchical, name);
            if (views.size() > 1) {
              size_t at = 0;
              for (const TensorView& v : views) {
                if (v.numel) std::memcpy(v.data, packed.data() + at, v.nbytes());
                at += v.nbytes();
              }
            }
          },
          nb::arg("tensors"), nb::arg("hierarchical") = false, nb::arg("name") = "",
          "In-place grouped Adasum of a list of contiguous same-dtype tensors (one fused "
          "exchange, coefficients per tensor).")
      .def("stats",
           [](const Runtime& rt) {
             const CommStats s = rt.stats();
             nb::dict d;
             d["bytes_sent"] = s.bytes_sent;
             d["bytes_received"] = s.bytes_received;
             d["calls"] = s.calls;
             return d;
           })
      .def("reset_stats", &Runtime::reset_stats);
  hvdc::register_onebit(m);
}
