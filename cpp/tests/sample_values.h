// The inputs of the element-wise kernel tests (SLAMB's, 1-bit LAMB's and 1-bit Adam's fused passes): a
// deterministic spread of positive and negative float32 values, so that no RNG is needed for those checks.
#pragma once
#include <cmath>
#include <cstdint>
#include <vector>

namespace hvdc {

// n values scale * sin(0.37 i + salt) + 0.01 salt: another salt, another sequence.
inline std::vector<float> sample_values(int64_t n, float scale, int salt) {
  std::vector<float> out(n);
  for (int64_t i = 0; i < n; ++i) out[i] = scale * std::sin(0.37f * static_cast<float>(i) + salt) + 0.01f * salt;
  return out;
}

}  // namespace hvdc
