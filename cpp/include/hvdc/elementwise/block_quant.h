// Per-block scaled integer quantization of float32 values (int8 and int4), one element at a time, for the
// CPU kernels of hvdc/block_quant_allreduce.h and a CUDA kernel alike (HVDC_HOST_DEVICE). The format, with
// its rounding (docs/algorithms/diloco.md states it too):
//   - values travel in blocks of kBlockQuantBlock = 64 elements; each block carries one float32 scale
//     s = max |x| / Q over the block (Q = 127 for int8, 7 for int4; max |x| = 0 gives s = 0), computed as
//     one float32 division;
//   - element x becomes q = rint(x / s) (one float32 division, then round half to even), clamped to
//     [-Q, Q]; s = 0 gives q = 0. It stands for q * s (one float32 product);
//   - int8: q as a signed byte. int4: q + 8 in a nibble (1 .. 15; 0 is never sent), element 2i in the low
//     nibble and element 2i + 1 in the high nibble of byte i of the block;
//   - a block on the wire: [float32 scale][64 bytes (int8) or 32 bytes (int4)], little-endian.
// All float32 arithmetic, no contraction (host_device.h): a CPU and a GPU give the same bits.
#pragma once
#include <cstdint>

#include "hvdc/host_device.h"

namespace hvdc {

constexpr int kBlockQuantBlock = 64;

// Largest level of a `bits`-bit code (8 -> 127, 4 -> 7).
HVDC_HOST_DEVICE inline int block_quant_levels(int bits) { return bits == 8 ? 127 : 7; }

// Bytes of one block on the wire: its scale and its codes.
HVDC_HOST_DEVICE inline int block_quant_block_bytes(int bits) {
  return 4 + kBlockQuantBlock * bits / 8;
}

// Round half to even (the current rounding mode, which is to-nearest-even in every kernel of the core).
HVDC_HOST_DEVICE inline float block_quant_rint(float v) {
#if defined(__CUDA_ARCH__)
  return rintf(v);
#else
  return std::nearbyint(v);
#endif
}

// The scale of a block whose largest magnitude is `amax`.
HVDC_HOST_DEVICE inline float block_quant_scale(float amax, int bits) {
  return amax / static_cast<float>(block_quant_levels(bits));
}

// The code of x under scale s: rint(x / s) clamped to [-Q, Q]; 0 when s is 0.
HVDC_HOST_DEVICE inline int block_quant_code(float x, float s, int bits) {
  if (s == 0.0f) return 0;
  const int levels = block_quant_levels(bits);
  float q = block_quant_rint(x / s);
  q = q > static_cast<float>(levels) ? static_cast<float>(levels) : q;
  q = q < -static_cast<float>(levels) ? -static_cast<float>(levels) : q;
  return static_cast<int>(q);
}

// The value a code stands for.
HVDC_HOST_DEVICE inline float block_quant_value(int code, float s) { return static_cast<float>(code) * s; }

// Store code `q` of element i (0 <= i < kBlockQuantBlock) into the block's code bytes.
HVDC_HOST_DEVICE inline void block_quant_put(uint8_t* codes, int i, int q, int bits) {
  if (bits == 8) {
    codes[i] = static_cast<uint8_t>(static_cast<int8_t>(q));
    return;
  }
  const uint8_t nibble = static_cast<uint8_t>(q + 8);
  uint8_t& byte = codes[i >> 1];
  byte = (i & 1) ? static_cast<uint8_t>((byte & 0x0f) | (nibble << 4)) : static_cast<uint8_t>((byte & 0xf0) | nibble);
}

// Read code of element i back.
HVDC_HOST_DEVICE inline int block_quant_get(const uint8_t* codes, int i, int bits) {
  if (bits == 8) return static_cast<int>(static_cast<int8_t>(codes[i]));
  const uint8_t byte = codes[i >> 1];
  return static_cast<int>((i & 1) ? (byte >> 4) : (byte & 0x0f)) - 8;
}

// A block's float32 scale, little-endian at any byte alignment (blocks follow each other unaligned).
HVDC_HOST_DEVICE inline float block_quant_load_scale(const uint8_t* block) {
  return bits_float(static_cast<uint32_t>(block[0]) | static_cast<uint32_t>(block[1]) << 8 |
                    static_cast<uint32_t>(block[2]) << 16 | static_cast<uint32_t>(block[3]) << 24);
}
HVDC_HOST_DEVICE inline void block_quant_store_scale(uint8_t* block, float s) {
  const uint32_t u = float_bits(s);
  for (int b = 0; b < 4; ++b) block[b] = static_cast<uint8_t>(u >> (8 * b));
}

// One block of the compress kernel: c = x + error (error may be null) over the block's first `valid`
// elements (0 <= valid <= 64; the rest are padding, 0, never read), its scale and codes into every byte of
// `block`, and error = c - value(code) where error is given.
HVDC_HOST_DEVICE inline void block_quant_compress_block(const float* x, float* error, int valid, int bits,
                                                        uint8_t* block) {
  float c[kBlockQuantBlock];
  float amax = 0.0f;
  for (int i = 0; i < kBlockQuantBlock; ++i) {
    c[i] = i < valid ? (error != nullptr ? x[i] + error[i] : x[i]) : 0.0f;
    const float a = abs32(c[i]);
    amax = a > amax ? a : amax;
  }
  const float s = block_quant_scale(amax, bits);
  block_quant_store_scale(block, s);
  uint8_t* codes = block + 4;
  for (int b = 0; b < kBlockQuantBlock * bits / 8; ++b) codes[b] = 0;
  for (int i = 0; i < kBlockQuantBlock; ++i) {
    const int q = block_quant_code(c[i], s, bits);
    block_quant_put(codes, i, q, bits);
    if (error != nullptr && i < valid) error[i] = c[i] - block_quant_value(q, s);
  }
}

// Element i of the blocks that start at `blocks`, decoded.
HVDC_HOST_DEVICE inline float block_quant_decode(const uint8_t* blocks, int64_t i, int bits) {
  const uint8_t* block = blocks + (i / kBlockQuantBlock) * block_quant_block_bytes(bits);
  return block_quant_value(block_quant_get(block + 4, static_cast<int>(i % kBlockQuantBlock), bits),
                           block_quant_load_scale(block));
}

// The server's element i: the decoded values of `nranks` chunks `stride` bytes apart summed in float32 in
// rank order (from 0.0f), divided by nranks (one float32 division) for `average` with more than one rank.
HVDC_HOST_DEVICE inline float block_quant_reduce_at(const uint8_t* chunks, int64_t stride, int nranks, int64_t i,
                                                    int bits, bool average) {
  float sum = 0.0f;
  for (int r = 0; r < nranks; ++r) sum += block_quant_decode(chunks + r * stride, i, bits);
  return average && nranks > 1 ? sum / static_cast<float>(nranks) : sum;
}

}  // namespace hvdc
