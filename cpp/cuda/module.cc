// hvd_compress._cuda: the CUDA kernels (cpp/cuda/*.cu, host API hvdc/cuda/kernels.h) in an
// extension of their own, built only where nvcc is, and imported only when a CUDA tensor
// arrives, so that the CPU build and a machine without the CUDA runtime keep working. Here: what
// the build is (the architectures it carries, the devices the runtime sees) and the CUDA device
// table (hvdc/cuda/device_table.h) that the core's runtime runs CUDA tensors' collectives through.
#include <cuda_runtime_api.h>
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include "hvdc/cuda/device_table.h"

#include <sstream>
#include <string>
#include <vector>

namespace nb = nanobind;

namespace {

// HVDC_CUDA_ARCHS (set by setup.py from cpp/cuda/nvcc_flags): "sm_80 sm_90 compute_90".
std::vector<std::string> architectures() {
  std::istringstream in(HVDC_CUDA_ARCHS);
  std::vector<std::string> out;
  for (std::string a; in >> a;) out.push_back(a);
  return out;
}

// Devices the CUDA runtime sees; 0 where there is no driver or no device (not an error: the
// caller decides what a CPU-only machine means).
int device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky error of a failed query
    return 0;
  }
  return n;
}

}  // namespace

NB_MODULE(_cuda, m) {
  m.doc() = "hvd_compress's CUDA kernels (built from cpp/cuda where nvcc was present).";
  m.def("architectures", &architectures,
        "The GPU architectures this build carries (sm_XX: machine code, compute_XX: PTX).");
  m.def("device_count", &device_count, "CUDA devices the runtime sees (0 without a driver).");
  m.def(
      "device_table",
      [] {
        // The capsule owns the table; it holds a DeviceTable* (the base), which is what the
        // core's Runtime._register_device reads back.
        hvdc::DeviceTable* table = new hvdc::cuda::CudaDevice();
        return nb::capsule(table, "hvdc.DeviceTable", [](void* p) noexcept {
          delete static_cast<hvdc::DeviceTable*>(p);
        });
      },
      "A new CUDA device table (on the legacy default stream), as a capsule for "
      "hvd_compress._core.Runtime._register_device; touches no device until a collective runs.");
  m.def(
      "set_stream",
      [](nb::capsule table, uintptr_t stream) {
        static_cast<hvdc::cuda::CudaDevice*>(static_cast<hvdc::DeviceTable*>(table.data()))
            ->set_stream(reinterpret_cast<cudaStream_t>(stream));
      },
      nb::arg("table"), nb::arg("stream"),
      "The stream the table's work goes to from now on (torch.cuda.current_stream().cuda_stream).");
}
