// The per-element pieces of the compression= path's top-k and random-k selection
// (hvdc/sparse_allreduce.h), written once for the CPU (sparse_allreduce.cc) and the CUDA kernels
// (cpp/cuda/select.cu): each element's 32-bit key, and the one rule that picks the k smallest keys
// with ties to the lower index. Both sides select the same indices because they compare the same
// integers: no float compare, no order that depends on threads.
#pragma once
#include <cstdint>

#include "hvdc/host_device.h"
#include "hvdc/philox.h"

namespace hvdc {

// The Philox stream of random-k's index draws (hvdc/philox.h), apart from every other use.
constexpr uint32_t kRandomKStream = 0x524b5031u;  // "RKP1"

// Top-k's key of a finite c: smaller for larger |c|, equal for equal |c| (+0 and -0 alike), so the
// k smallest keys are the k largest magnitudes. The bits of a non-negative finite float order as
// its value does.
HVDC_HOST_DEVICE inline uint32_t topk_key(float c) { return 0x7fffffffu - (float_bits(c) & 0x7fffffffu); }

// Random-k's Philox key of one call; element i's key is philox_word(randomk_philox_key(..), offset + i).
HVDC_HOST_DEVICE inline PhiloxKey randomk_philox_key(uint64_t seed, uint32_t step) {
  PhiloxKey key;
  key.seed = seed;
  key.step = step;
  key.stream = kRandomKStream;
  return key;
}

// The selection rule, given the k-th smallest key `threshold` and `equal_left` = k minus the number of
// keys below it: an element is selected iff its key is below the threshold, or equals it and fewer
// than equal_left equal keys come before it in index order (`equal_before`).
HVDC_HOST_DEVICE inline bool select_keeps(uint32_t key, uint32_t threshold, int64_t equal_before,
                                          int64_t equal_left) {
  return key < threshold || (key == threshold && equal_before < equal_left);
}

}  // namespace hvdc
