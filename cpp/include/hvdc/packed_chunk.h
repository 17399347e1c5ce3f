// The shape of a chunk of packed signs (the wire format of hvdc/onebit_kernels.h, which Birder's
// quantizer shares): n_real real elements in n_padded positions, n_padded a whole number of bytes.
// Every kernel that packs checks it once per call, on the CPU and before a device launch.
#pragma once
#include <cstdint>
#include <string>

#include "hvdc/errors.h"

namespace hvdc {

// Throws UsageError naming `what` ("1-bit", ...) unless 0 <= n_real <= n_padded and n_padded % 8 == 0.
inline void check_packed_chunk(const char* what, int64_t n_real, int64_t n_padded) {
  if (n_real < 0 || n_padded % 8 != 0 || n_padded < n_real)
    throw UsageError(std::string(what) + " chunk of " + std::to_string(n_real) + " elements in " +
                     std::to_string(n_padded) + " padded: padded size must be a multiple of 8 "
                     "and at least the real size");
}

}  // namespace hvdc
