// Bulk fills of the Philox4x32-10 sequence (hvdc/philox.h). The block function is written over
// plain 32x32->64-bit products, which GCC vectorizes (vpmuludq) in the AVX2 clone below: eight
// blocks at a time instead of one. Both clones compute the same words; the choice is made once.
#include "hvdc/philox.h"

#include <cstring>

namespace hvdc {
namespace {

// Blocks [first, first + count) into out[4 * i + lane]; written as independent lanes so that the
// compiler can keep several blocks in vector registers at once.
template <int kLanes>
inline void fill_blocks(const PhiloxKey& key, uint64_t first, int64_t count, uint32_t* out) {
  int64_t b = 0;
  for (; b + kLanes <= count; b += kLanes) {
    PhiloxBlock blocks[kLanes];
    for (int l = 0; l < kLanes; ++l) blocks[l] = philox_block(key, first + b + l);
    for (int l = 0; l < kLanes; ++l)
      for (int w = 0; w < 4; ++w) out[4 * (b + l) + w] = blocks[l].v[w];
  }
  for (; b < count; ++b) {
    const PhiloxBlock blk = philox_block(key, first + b);
    for (int w = 0; w < 4; ++w) out[4 * b + w] = blk.v[w];
  }
}

__attribute__((target("avx2"))) void fill_blocks_avx2(const PhiloxKey& key, uint64_t first,
                                                      int64_t count, uint32_t* out) {
  fill_blocks<8>(key, first, count, out);
}

void fill_blocks_portable(const PhiloxKey& key, uint64_t first, int64_t count, uint32_t* out) {
  fill_blocks<4>(key, first, count, out);
}

using FillBlocks = void (*)(const PhiloxKey&, uint64_t, int64_t, uint32_t*);

FillBlocks pick_fill_blocks() {
#if defined(__x86_64__) || defined(__i386__)
  if (__builtin_cpu_supports("avx2")) return &fill_blocks_avx2;
#endif
  return &fill_blocks_portable;
}

const FillBlocks kFillBlocks = pick_fill_blocks();

}  // namespace

void philox_fill_u32(const PhiloxKey& key, uint64_t offset, int64_t n, uint32_t* out) {
  if (n <= 0) return;
  uint64_t index = offset;
  int64_t done = 0;
  // A head that is not block-aligned, then whole blocks straight into `out`, then a tail.
  while (done < n && (index & 3) != 0) {
    out[done++] = philox_block(key, index >> 2).v[index & 3];
    ++index;
  }
  const int64_t whole = (n - done) / 4;
  kFillBlocks(key, index >> 2, whole, out + done);
  done += 4 * whole;
  index += 4 * static_cast<uint64_t>(whole);
  while (done < n) {
    out[done++] = philox_block(key, index >> 2).v[index & 3];
    ++index;
  }
}

void philox_fill_uniform(const PhiloxKey& key, uint64_t offset, int64_t n, float* out) {
  // The words are written in place of the floats (same size), then converted.
  philox_fill_u32(key, offset, n, reinterpret_cast<uint32_t*>(out));
  for (int64_t i = 0; i < n; ++i) {
    uint32_t w;
    std::memcpy(&w, out + i, sizeof w);
    out[i] = philox_word_to_uniform(w);
  }
}

}  // namespace hvdc
