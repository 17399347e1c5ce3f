// Python bindings of the core (module hvd_compress._core). Tensors arrive through DLPack as
// nanobind ndarrays: the core reads and writes the framework's own memory, no copy.
//
// Every collective method returns the bytes this rank sent and received for that call, as a dict
// {"bytes_sent", "bytes_received", "calls"} (the same keys as Runtime.stats()).
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <string>
#include <vector>

#include "hvdc/binding_views.h"
#include "hvdc/birder_bindings.h"
#include "hvdc/dlpack_view.h"
#include "hvdc/errors.h"
#include "hvdc/masked_bindings.h"
#include "hvdc/onebit_adam_bindings.h"
#include "hvdc/scaled_add_bindings.h"
#include "hvdc/onebit_lamb_bindings.h"
#include "hvdc/onebit_bindings.h"
#include "hvdc/random_bindings.h"
#include "hvdc/mpi_communicator.h"
#include "hvdc/runtime.h"
#include "hvdc/sparse_bindings.h"
#include "hvdc/block_quant_bindings.h"

namespace nb = nanobind;
using namespace hvdc;

namespace {

// The one translation from a DLPack object to a core view (hvdc/dlpack_view.h reads the fields,
// decides the device and refuses what the core cannot address); UsageError, prefixed with `what`
// when given. `allow_bytes`: uint8 too (the broadcast of pickled objects); `allow_ints`: every
// integer type.
TensorView view_of(nb::handle obj, const std::string& what = "", bool allow_bytes = false,
                   bool allow_ints = false) {
  nb::ndarray<> a;
  try {
    a = nb::cast<nb::ndarray<>>(obj);
  } catch (const std::exception&) {
    throw UsageError((what.empty() ? "" : what + ": ") + "argument is not a tensor that supports DLPack");
  }
  std::vector<int64_t> shape(a.ndim()), strides(a.ndim());
  for (size_t d = 0; d < a.ndim(); ++d) {
    shape[d] = static_cast<int64_t>(a.shape(d));
    strides[d] = a.stride(d);
  }
  DLPackFields t;
  t.data = a.data();
  t.device_type = a.device_type();
  t.device_id = a.device_id();
  t.code = a.dtype().code;
  t.bits = a.dtype().bits;
  t.lanes = a.dtype().lanes;
  t.ndim = static_cast<int32_t>(a.ndim());
  t.shape = shape.data();
  t.strides = strides.data();
  return dlpack_view(t, what, allow_bytes, allow_ints);
}

// `make()` (the call's views), or, if this rank cannot read its input, the call rejected on every
// rank: this rank still joins the signature exchange, so no peer waits for it.
template <typename Make>
auto views_or_reject(Runtime& rt, Collective collective, const std::string& name, Make make)
    -> decltype(make()) {
  try {
    return make();
  } catch (const UsageError& e) {
    nb::gil_scoped_release nogil;
    rt.reject(collective, e.what(), name);
  }
}

nb::dict as_dict(const CommStats& s) {
  nb::dict d;
  d["bytes_sent"] = s.bytes_sent;
  d["bytes_received"] = s.bytes_received;
  d["calls"] = s.calls;
  d["host_bytes"] = s.host_bytes;
  return d;
}

// Runs a collective with the GIL released (the views point into tensors the caller keeps alive
// for the call) and returns its byte counts.
template <typename Call>
nb::dict released(Call call) {
  CommStats moved;
  {
    nb::gil_scoped_release nogil;
    moved = call();
  }
  return as_dict(moved);
}

}  // namespace

namespace hvdc {
TensorView binding_view_of(nb::handle obj, const std::string& what) { return view_of(obj, what); }
nb::dict binding_stats(const CommStats& s) { return as_dict(s); }

float* binding_float32(nb::handle obj, const std::string& what, int64_t* numel) {
  const TensorView v = view_of(obj, what);
  if (v.dtype != DType::kFloat32) throw UsageError(what + " must be float32");
  if (*numel < 0) *numel = v.numel;
  if (v.numel != *numel)
    throw UsageError(what + " has " + std::to_string(v.numel) + " elements, expected " + std::to_string(*numel));
  return static_cast<float*>(v.data);
}

void binding_check_layers(const std::vector<int64_t>& sizes, int64_t n, size_t per_layer, const char* fn) {
  int64_t total = 0;
  for (int64_t s : sizes) {
    if (s < 0) throw UsageError(std::string(fn) + ": negative layer size");
    total += s;
  }
  if (total != n || per_layer != sizes.size())
    throw UsageError(std::string(fn) + ": layer sizes sum to " + std::to_string(total) + " for " + std::to_string(n) +
                     " elements, or per-layer lists of another length");
}

std::vector<float*> binding_float32_layers(const std::vector<nb::handle>& params, int64_t n, size_t per_layer,
                                           const char* fn, std::vector<int64_t>* sizes) {
  sizes->assign(params.size(), 0);
  std::vector<float*> xs(params.size(), nullptr);
  for (size_t i = 0; i < params.size(); ++i) {
    if (params[i].is_none()) continue;
    int64_t k = -1;
    xs[i] = binding_float32(params[i], std::string(fn) + ": param " + std::to_string(i), &k);
    (*sizes)[i] = k;
  }
  binding_check_layers(*sizes, n, per_layer, fn);
  return xs;
}
}  // namespace hvdc

NB_MODULE(_core, m) {
  m.doc() = "hvd_compress C++ core: collectives over MPI on DLPack tensors";

  nb::exception<UsageError> usage_error(m, "UsageError", PyExc_ValueError);
  // Both a UsageError and a RuntimeError: what Horovod's users catch for a failed collective.
  nb::exception<RejectedInputError>(m, "RejectedInputError",
                                    nb::make_tuple(usage_error, nb::handle(PyExc_RuntimeError)));
  nb::exception<MismatchError>(m, "MismatchError", PyExc_RuntimeError);
  nb::exception<CommTimeoutError> timeout_error(m, "CommTimeoutError", PyExc_TimeoutError);
  nb::exception<PeerExitedError>(m, "PeerExitedError", timeout_error);
  nb::exception<CommError>(m, "CommError", PyExc_RuntimeError);

  m.def("mpi_initialized", &MpiCommunicator::mpi_initialized);
  m.def("mpi_cuda_support", &MpiCommunicator::cuda_support,
        "MPIX_Query_cuda_support(): 1 (device pointers accepted), 0 (not), -1 (this MPI cannot say).");
  m.def("build_info", []() {
    nb::dict d;
#ifdef HVDC_WITH_CUDA
    d["cuda"] = true;
#else
    d["cuda"] = false;
#endif
    return d;
  });

  nb::class_<Runtime> runtime(m, "Runtime");
  runtime
      .def(
          "__init__",
          [](Runtime* self, intptr_t comm_handle, double timeout_s, int local_size,
             const std::string& invalid, bool scalar_kernels, int64_t onebit_piece,
             double stall_warning_s) {
            RuntimeConfig config;
            if (onebit_piece >= 0) config.onebit_pipeline.piece = onebit_piece;
            config.timeout_s = timeout_s;
            config.stall_warning_s = stall_warning_s;
            config.local_size = local_size;
            config.invalid = invalid;
            config.kernels = scalar_kernels ? KernelChoice::kScalar : KernelChoice::kAuto;
            nb::gil_scoped_release nogil;  // collective: waits for every rank
            std::unique_ptr<MpiCommunicator> world = watched_world(reinterpret_cast<MPI_Comm>(comm_handle));
            const MpiCommunicator* shared = world.get();
            new (self) Runtime(std::move(world), config, [shared] { return shared->split_shared(); });
          },
          nb::arg("comm_handle"), nb::arg("timeout_s"), nb::arg("local_size") = 0,
          nb::arg("invalid") = "", nb::arg("scalar_kernels") = false,
          nb::arg("onebit_piece") = -1, nb::arg("stall_warning_s") = 60.0,
          "Runtime over the MPI communicator whose handle mpi4py gives as comm.handle; collective. "
          "local_size: HVDC_LOCAL_SIZE (0: the shared-memory node). invalid: why this rank's "
          "settings are invalid (raises UsageError on every rank), else empty. scalar_kernels: "
          "HVDC_ONEBIT_KERNELS=scalar (the element-wise kernels run the portable code). "
          "onebit_piece: HVDC_ONEBIT_PIPELINE, elements per piece of the pipelined 1-bit "
          "collective (0: never pipeline; -1: the default). stall_warning_s: HVDC_STALL_WARNING, "
          "seconds between the warnings of a collective waiting for ranks that have not joined "
          "(0: none).")
      .def_prop_ro("rank", &Runtime::rank)
      .def_prop_ro("size", &Runtime::size)
      .def_prop_rw("timeout", &Runtime::timeout, &Runtime::set_timeout)
      .def_prop_ro("stall_warning", &Runtime::stall_warning)
      .def_prop_ro("scalar_kernels",
                   [](const Runtime& rt) { return rt.kernels() == KernelChoice::kScalar; })
      .def(
          "allreduce",
          [](Runtime& rt, nb::handle tensor, int op, const std::string& name) {
            const TensorView v = views_or_reject(rt, kAllreduce, name, [&] {
              return view_of(tensor, "", /*allow_bytes=*/false, /*allow_ints=*/true);
            });
            return released([&] { return rt.allreduce(v, static_cast<ReduceOp>(op), name); });
          },
          nb::arg("tensor"), nb::arg("op"), nb::arg("name") = "",
          "In-place Average/Sum/Min/Max/Product allreduce of a contiguous float or integer tensor; "
          "returns this call's bytes.")
      .def(
          "allgather",
          [](Runtime& rt, nb::handle tensor, const std::string& name) {
            const TensorView v = views_or_reject(rt, kAllgather, name, [&] {
              TensorView t = view_of(tensor, "allgather", /*allow_bytes=*/false, /*allow_ints=*/true);
              if (t.shape.empty())
                throw UsageError("allgather: a tensor with no dimensions; give it one (reshape(1))");
              return t;
            });
            auto* out = new std::vector<unsigned char>();
            nb::capsule owner(out, [](void* p) noexcept { delete static_cast<std::vector<unsigned char>*>(p); });
            std::vector<int64_t> rows;
            const nb::dict moved = released([&] { return rt.allgather(v, name, *out, rows); });
            nb::ndarray<nb::numpy, uint8_t, nb::ndim<1>> bytes(out->data(), {out->size()}, owner);
            return nb::make_tuple(bytes, rows, moved);
          },
          nb::arg("tensor"), nb::arg("name") = "",
          "Horovod's allgather of a contiguous tensor whose first dim may differ per rank: returns "
          "(uint8 NumPy array of every rank's rows in rank order, each rank's first dim, this "
          "call's bytes).")
      .def(
          "broadcast",
          [](Runtime& rt, nb::handle tensor, int root, const std::string& name) {
            const TensorView v = views_or_reject(rt, kBroadcast, name, [&] {
              return view_of(tensor, "", /*allow_bytes=*/true);
            });
            return released([&] { return rt.broadcast(v, root, name); });
          },
          nb::arg("tensor"), nb::arg("root"), nb::arg("name") = "",
          "In-place broadcast from `root` (uint8 allowed); returns this call's bytes.")
      .def(
          "adasum",
          [](Runtime& rt, nb::handle tensor, std::vector<int64_t> sizes, bool hierarchical,
             const std::string& name) {
            const TensorView v = views_or_reject(rt, kAdasum, name, [&] { return view_of(tensor); });
            if (sizes.empty()) sizes.push_back(v.numel);
            return released([&] { return rt.adasum(v, sizes, hierarchical, name); });
          },
          nb::arg("tensor"), nb::arg("sizes"), nb::arg("hierarchical") = false,
          nb::arg("name") = "",
          "In-place Adasum of a contiguous fused buffer cut into tensors of `sizes` elements "
          "(empty: the whole buffer is one tensor); coefficients per tensor. Returns this call's "
          "bytes.")
      .def(
          "adasum_group",
          [](Runtime& rt, nb::list tensors, bool hierarchical, const std::string& name) {
            const std::vector<TensorView> views = views_or_reject(rt, kAdasum, name, [&] {
              std::vector<TensorView> out;
              for (size_t i = 0; i < tensors.size(); ++i)
                out.push_back(view_of(tensors[i], "grouped Adasum: item " + std::to_string(i)));
              return out;
            });
            return released([&] { return rt.adasum_group(views, hierarchical, name); });
          },
          nb::arg("tensors"), nb::arg("hierarchical") = false, nb::arg("name") = "",
          "In-place grouped Adasum of a list of contiguous same-dtype tensors (one fused "
          "exchange, coefficients per tensor). Returns this call's bytes.")
      .def(
          "compressed_allreduce",
          [](Runtime& rt, nb::handle tensor, nb::handle worker_error, nb::handle server_error,
             const std::string& name) {
            const char* what = "compressed_allreduce";
            struct Views {
              TensorView buffer, worker_error, server_error;
            };
            const Views v = views_or_reject(rt, kCompressedAllreduce, name, [&] {
              return Views{view_of(tensor, std::string(what) + ": tensor"),
                           view_of(worker_error, std::string(what) + ": worker error"),
                           view_of(server_error, std::string(what) + ": server error")};
            });
            return released([&] {
              return rt.compressed_allreduce(v.buffer, v.worker_error, v.server_error, name);
            });
          },
          nb::arg("tensor"), nb::arg("worker_error"), nb::arg("server_error"),
          nb::arg("name") = "",
          "In place: `tensor` (contiguous CPU float32/float16/bfloat16) becomes the "
          "error-compensated 1-bit average over all ranks (1-bit Adam, paper 003 Alg. 1 lines "
          "7-13); `worker_error` (numel float32) and `server_error` (onebit_padded_numel(numel, "
          "size) / size float32) are updated. Returns this call's bytes.")
      .def(
          "reject_allreduce",
          [](Runtime& rt, const std::string& why, const std::string& name) {
            nb::gil_scoped_release nogil;
            rt.reject(kAllreduce, why, name);
          },
          nb::arg("why"), nb::arg("name") = "",
          "Joins an allreduce that this rank could not even start (`why`, e.g. a Python error while "
          "preparing a background reduction), so that every rank raises RejectedInputError instead "
          "of the others waiting for it. Always raises.")
      .def(
          "_set_test_device",
          [](Runtime& rt, const std::string& which, const std::string& fault, int index) {
            nb::gil_scoped_release nogil;  // waits for a collective in flight
            rt.set_test_device(which, fault, index);
          },
          nb::arg("which"), nb::arg("fault") = "", nb::arg("index") = 0,
          "Tests only, the same on every rank: \"staged\" runs the collectives that go through "
          "the device table on the staged test device (hvdc/staged_device.h), \"\" on the CPU's; "
          "`fault` (\"to_host\", \"to_device\", \"wait\") drops that operation's `index`-th "
          "occurrence from now on.")
      .def_prop_ro("_test_device", &Runtime::test_device)
      .def(
          "_register_device",
          [](Runtime& rt, nb::capsule table) {
            if (std::string(table.name() ? table.name() : "") != "hvdc.DeviceTable")
              throw UsageError("_register_device: not a device table capsule");
            rt.register_device(static_cast<DeviceTable*>(table.data()));
          },
          nb::arg("table"),
          "Registers the CUDA device table of hvd_compress._cuda (its device_table() capsule, "
          "which the caller keeps alive as long as this runtime).")
      .def("stats", [](const Runtime& rt) { return as_dict(rt.stats()); })
      .def("reset_stats", &Runtime::reset_stats)
      .def("join", &Runtime::join, nb::call_guard<nb::gil_scoped_release>(),
           "Horovod's join(): returns once every rank called it; MismatchError on every rank where "
           "another rank is in some other collective (uneven data).")
      .def("leave", &Runtime::leave, nb::arg("timeout_s"), nb::call_guard<nb::gil_scoped_release>(),
           "Tell every peer that this process is exiting (before MPI is finalized).");
  hvdc::register_onebit(m);
  hvdc::register_random(m);
  hvdc::register_masked(m, runtime);
  hvdc::register_slamb(m);
  hvdc::register_onebit_lamb(m);
  hvdc::register_onebit_adam(m);
  hvdc::register_scaled_add(m);
  hvdc::register_birder(m, runtime);
  hvdc::register_sparse(m);
  hvdc::register_block_quant(m);
}
