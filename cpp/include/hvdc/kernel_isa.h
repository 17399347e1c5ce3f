// Which implementation the element-wise kernels (1-bit, stochastic) run. The choice is part of the
// runtime's configuration: Python reads HVDC_ONEBIT_KERNELS once, at init(), the Runtime keeps it
// and hands it to every call it runs (OneBitCall, HierarchicalCall); nothing reads the environment
// per call. Calls made outside a Runtime (C++ tests, the kernel benchmark) pass kAuto or choose.
#pragma once
#include <cstdint>

// HVDC_AVX2_FMA_KERNELS: whether this build has AVX2 + FMA versions of the float32 optimizer kernels
// (1-bit LAMB's and 1-bit Adam's fused passes); HVDC_AVX2_FMA marks their functions (target attribute), which
// run only where use_avx2_kernels() says so.
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
#define HVDC_AVX2_FMA_KERNELS 1
#define HVDC_AVX2_FMA __attribute__((target("avx2,fma")))
#else
#define HVDC_AVX2_FMA_KERNELS 0
#endif

namespace hvdc {

enum class KernelChoice : int32_t {
  kAuto = 0,    // AVX2 (+F16C, FMA) where the CPU has them, else the portable code
  kScalar = 1,  // the portable code (HVDC_ONEBIT_KERNELS=scalar: tests run whole collectives on it)
};

// Whether this CPU runs the AVX2 kernels (avx2, f16c and fma); detected once per process.
inline bool cpu_has_avx2_kernels() {
#if defined(__x86_64__) && (defined(__GNUC__) || defined(__clang__))
  static const bool has = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("f16c") &&
           __builtin_cpu_supports("fma");
  }();
  return has;
#else
  return false;
#endif
}

// The choice a binding's `scalar` flag asks for (Python passes the runtime's HVDC_ONEBIT_KERNELS down).
inline KernelChoice kernel_choice(bool scalar) { return scalar ? KernelChoice::kScalar : KernelChoice::kAuto; }

// Whether `choice` runs the AVX2 kernels on this CPU.
inline bool use_avx2_kernels(KernelChoice choice) {
  return choice == KernelChoice::kAuto && cpu_has_avx2_kernels();
}

}  // namespace hvdc
