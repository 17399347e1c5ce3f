// The core's one random number generator: Philox4x32-10 (Salmon, Moraes, Dror and Shaw,
// "Parallel random numbers: as easy as 1, 2, 3", SC 2011), a counter-based generator. Its output
// is a pure function of (counter, key), so every rank, thread and device that asks for the same
// (seed, step, stream, index) gets the same bits, in any order, with no state to carry or to
// checkpoint beyond the step, and without touching PyTorch's or TensorFlow's global generators.
// Checked against Random123's published known-answer vectors (cpp/tests/test_philox.cc,
// tests/test_philox.py); the NumPy mirror is hvd_compress/reference/philox.py.
//
// How hvd_compress keys it (the layout every user of the generator shares):
//   key     = (seed & 0xffffffff, seed >> 32)              the 64-bit seed
//   counter = (block & 0xffffffff, block >> 32, step, stream)
// where element `index` of a stream uses 32-bit word (index & 3) of block index >> 2. `step` is
// the optimizer step (mod 2^32), and `stream` separates independent uses at the same step (a
// rank's worker draws, a server's draws, a mask), so that they never share bits.
//
// Uniform floats: u = (word >> 8) * 2^-24, so u is in [0, 1) with 24 random bits, exactly
// representable in float32 (so that u < p compares the same everywhere).
#pragma once
#include <cstdint>

#include "hvdc/host_device.h"

namespace hvdc {

struct PhiloxBlock {
  uint32_t v[4];
};

// One Philox4x32-10 block: 10 rounds of the S-box with the Weyl key schedule.
HVDC_HOST_DEVICE inline PhiloxBlock philox4x32_10(PhiloxBlock ctr, uint32_t k0, uint32_t k1) {
  constexpr uint32_t kM0 = 0xD2511F53u, kM1 = 0xCD9E8D57u;
  constexpr uint32_t kW0 = 0x9E3779B9u, kW1 = 0xBB67AE85u;
  for (int round = 0; round < 10; ++round) {
    const uint64_t p0 = static_cast<uint64_t>(kM0) * ctr.v[0];
    const uint64_t p1 = static_cast<uint64_t>(kM1) * ctr.v[2];
    const uint32_t hi0 = static_cast<uint32_t>(p0 >> 32), lo0 = static_cast<uint32_t>(p0);
    const uint32_t hi1 = static_cast<uint32_t>(p1 >> 32), lo1 = static_cast<uint32_t>(p1);
    ctr = PhiloxBlock{{hi1 ^ ctr.v[1] ^ k0, lo1, hi0 ^ ctr.v[3] ^ k1, lo0}};
    k0 += kW0;
    k1 += kW1;
  }
  return ctr;
}

// The 24-bit uniform in [0, 1) of one 32-bit word (see the header comment).
HVDC_HOST_DEVICE inline float philox_word_to_uniform(uint32_t word) {
  return static_cast<float>(word >> 8) * (1.0f / 16777216.0f);
}

// Where a run of random numbers comes from: the 64-bit seed, the step and the stream.
struct PhiloxKey {
  uint64_t seed = 0;
  uint32_t step = 0;
  uint32_t stream = 0;
};

// The block that holds element `index` of `key`'s sequence.
HVDC_HOST_DEVICE inline PhiloxBlock philox_block(const PhiloxKey& key, uint64_t block) {
  const PhiloxBlock ctr{{static_cast<uint32_t>(block), static_cast<uint32_t>(block >> 32),
                         key.step, key.stream}};
  return philox4x32_10(ctr, static_cast<uint32_t>(key.seed), static_cast<uint32_t>(key.seed >> 32));
}

// Word `index` of `key`'s sequence, and its uniform: what the bulk fills below give at `index`, one
// element at a time (the CUDA kernels draw this way, each thread its own elements).
HVDC_HOST_DEVICE inline uint32_t philox_word(const PhiloxKey& key, uint64_t index) {
  return philox_block(key, index >> 2).v[index & 3];
}
HVDC_HOST_DEVICE inline float philox_uniform(const PhiloxKey& key, uint64_t index) {
  return philox_word_to_uniform(philox_word(key, index));
}

// Words [offset, offset + n) of `key`'s sequence into `out`. Vectorized on CPUs with AVX2 or
// AVX-512 (F, BW, VL, DQ), the best one chosen once per process.
void philox_fill_u32(const PhiloxKey& key, uint64_t offset, int64_t n, uint32_t* out);
// Uniforms in [0, 1) of words [offset, offset + n) into `out`.
void philox_fill_uniform(const PhiloxKey& key, uint64_t offset, int64_t n, float* out);

// The bulk fills' implementations. They all give the same words; the explicit choice is there so
// that tests can run every one this CPU has, not only the one kAuto picks.
enum class PhiloxIsa : int32_t { kAuto = 0, kPortable = 1, kAvx2 = 2, kAvx512 = 3 };

// The choice's name, for messages.
inline const char* philox_isa_name(PhiloxIsa isa) {
  switch (isa) {
    case PhiloxIsa::kAuto: return "auto";
    case PhiloxIsa::kPortable: return "portable";
    case PhiloxIsa::kAvx2: return "avx2";
    case PhiloxIsa::kAvx512: return "avx512";
  }
  return "?";
}

// Whether this CPU (and build) runs `isa`; kAuto and kPortable always.
bool philox_isa_supported(PhiloxIsa isa);
// The one kAuto runs: AVX-512, else AVX2, else portable.
PhiloxIsa philox_best_isa();
// philox_fill_u32 / philox_fill_uniform on `isa`'s code (one this CPU lacks runs kAuto's).
void philox_fill_u32_with(PhiloxIsa isa, const PhiloxKey& key, uint64_t offset, int64_t n,
                          uint32_t* out);
void philox_fill_uniform_with(PhiloxIsa isa, const PhiloxKey& key, uint64_t offset, int64_t n,
                              float* out);

}  // namespace hvdc
