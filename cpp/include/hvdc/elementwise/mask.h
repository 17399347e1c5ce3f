// The per-element decisions of SLAMB's random-k masks (hvdc/masks.h describes both kinds; spec
// shared/specs/slamb.md section 3), written once for the CPU mask code (masks.cc, its portable
// compares) and the CUDA kernels (cpp/cuda/mask.cu): every device and every rank selects the same
// elements for the same (seed, step).
#pragma once
#include <cmath>
#include <cstdint>

#include "hvdc/host_device.h"
#include "hvdc/philox.h"

namespace hvdc {

// Philox streams of the masks (hvdc/philox.h: `stream` separates uses that share a seed).
constexpr uint32_t kMaskPermutationStream = 0x4d41534bu;  // "MASK"
constexpr uint32_t kMaskBernoulliStream = 0x4d41534cu;     // "MASL": hi_i (masks.h)
constexpr uint32_t kMaskBernoulliTieStream = 0x4d41534du;  // "MASM": lo_i, read on ties only

// Cyclic: the element whose place in the permutation is `rank` is selected at a step whose chunk
// of the permutation is [base, base + width): one unsigned compare (wrap-around makes the range
// test one comparison).
HVDC_HOST_DEVICE inline bool cyclic_selected(uint32_t rank, uint32_t base, uint32_t width) {
  return rank - base < width;
}

// The chunk of the permutation that a cyclic mask of (numel, ratio) selects at `step`: places
// [base, base + width) (width 0: none, where torch.chunk gives fewer chunks). nc = int(1 / ratio)
// (Python's double division and truncation, at least 1), cs = ceil(numel / nc), c = step mod nc.
struct CyclicWindow {
  uint32_t base = 0, width = 0;
};
HVDC_HOST_DEVICE inline CyclicWindow cyclic_window(int64_t numel, double ratio, int64_t step) {
  int64_t nc = static_cast<int64_t>(1.0 / ratio);
  nc = nc < 1 ? 1 : nc;
  const int64_t cs = (numel + nc - 1) / nc;
  const int64_t lo = (step % nc) * cs;
  int64_t len = numel - lo < cs ? numel - lo : cs;
  len = len < 0 ? 0 : len;
  CyclicWindow w;
  w.base = static_cast<uint32_t>(lo);
  w.width = static_cast<uint32_t>(len);
  return w;
}

// T of a Bernoulli mask of `ratio`: ceil(float32(ratio) * 2^32), in [0, 2^32]. float32 has 24
// significant bits, so the product is exact in double and only the ceil rounds.
HVDC_HOST_DEVICE inline uint64_t bernoulli_threshold(double ratio) {
  return static_cast<uint64_t>(ceil(static_cast<double>(static_cast<float>(ratio)) * 4294967296.0));
}

// What a Bernoulli draw of one step needs: its two keys and T split into halves (T < 2^32).
struct BernoulliDraw {
  PhiloxKey key, tie_key;
  uint32_t th = 0, tl = 0;  // T >> 16 and T & 0xFFFF
};

HVDC_HOST_DEVICE inline BernoulliDraw bernoulli_draw_of(uint64_t seed, int64_t step, uint64_t t) {
  BernoulliDraw d;
  d.key.seed = d.tie_key.seed = seed;
  d.key.step = d.tie_key.step = static_cast<uint32_t>(step);
  d.key.stream = kMaskBernoulliStream;
  d.tie_key.stream = kMaskBernoulliTieStream;
  d.th = static_cast<uint32_t>(t >> 16);
  d.tl = static_cast<uint32_t>(t & 0xFFFFu);
  return d;
}

// The 16-bit half of element i in `key`'s sequence (half i & 1 of word i >> 1).
HVDC_HOST_DEVICE inline uint32_t bernoulli_half(const PhiloxKey& key, uint64_t i) {
  return (philox_word(key, i >> 1) >> (16 * (i & 1))) & 0xFFFFu;
}

// Element i, whose high half is hi: selected iff (hi << 16 | lo) < T; the tie stream's lo is drawn
// only when hi == T >> 16 (probability 2^-16).
HVDC_HOST_DEVICE inline uint8_t bernoulli_selected(const BernoulliDraw& d, uint32_t hi, uint64_t i) {
  if (hi == d.th && d.tl != 0) return static_cast<uint8_t>(bernoulli_half(d.tie_key, i) < d.tl);
  return static_cast<uint8_t>(hi < d.th);
}

}  // namespace hvdc
