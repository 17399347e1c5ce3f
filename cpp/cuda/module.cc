// hvd_compress._cuda: the CUDA kernels (cpp/cuda/*.cu, host API hvdc/cuda/kernels.h) in an
// extension of their own, built only where nvcc is, and imported only when a CUDA tensor
// arrives, so that the CPU build and a machine without the CUDA runtime keep working. Here only
// what the build is: the architectures it carries and the devices the runtime sees.
#include <cuda_runtime_api.h>
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

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
}
