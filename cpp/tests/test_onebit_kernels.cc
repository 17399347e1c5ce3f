// The 1-bit kernels' self-check (onebit_kernels_self_check, hvdc/onebit_kernel_bench.h: AVX2
// against portable code, byte for byte) under AddressSanitizer/UndefinedBehaviorSanitizer, with
// the lengths and seeds of tests/test_compressed_allreduce.py::
// test_simd_and_portable_kernels_write_identical_bytes: around the 32-element blocks and their
// tails, where an out-of-bounds load or store would hide in an optimized build. On a CPU without
// AVX2 the self-check has nothing to compare and passes.
#include <cstdint>
#include <string>

#include "check.h"
#include "hvdc/onebit_kernel_bench.h"
#include "hvdc/onebit_kernels.h"

int main() {
  hvdc::Failures f;
  for (hvdc::DType dtype : {hvdc::DType::kFloat32, hvdc::DType::kFloat16, hvdc::DType::kBFloat16})
    for (int64_t numel : {0, 1, 7, 8, 31, 32, 33, 63, 64, 100, 1000, 4099, (1 << 16) + 5})
      for (uint64_t seed = 0; seed < 3; ++seed) {
        const std::string why = hvdc::onebit_kernels_self_check(numel, dtype, seed);
        f.ran();
        f.check(why.empty(), hvdc::str(hvdc::dtype_name(dtype), " numel=", numel, " seed=", seed,
                                       " (", hvdc::onebit_kernel_isa(), "): ", why));
      }
  return f.finish("test_onebit_kernels");
}
