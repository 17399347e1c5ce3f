// What the vectorized passes over a byte mask (0/1 per element) share: the 8 mask bytes of a group of 8 elements as
// bits, and the lane permutations of 8 x 32-bit lanes by those bits. The gather and scatter of masks.cc and SLAMB's
// masked direction (slamb_kernels.cc) move a group's selected lanes with them.
#pragma once
#include <cstdint>
#include <cstring>

namespace hvdc {

// `compress[bits]` moves the selected lanes to the front in order (gather); `expand[bits]` sends lane l to the
// l-th selected position (scatter).
struct MaskLaneTables {
  alignas(32) int32_t compress[256][8];
  alignas(32) int32_t expand[256][8];
  MaskLaneTables();
};

// The tables, built once per process.
const MaskLaneTables& mask_lane_tables();

// The 8 mask bytes at m (each 0 or 1) as bits 0..7.
inline uint32_t mask_bits8(const uint8_t* m) {
  uint64_t w;
  std::memcpy(&w, m, sizeof w);
  // Byte b's low bit lands in bit 56 + b of the product; no carries since every byte is 0 or 1.
  return static_cast<uint32_t>((w * 0x0102040810204080ull) >> 56);
}

}  // namespace hvdc
