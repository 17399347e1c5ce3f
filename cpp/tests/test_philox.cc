// Philox4x32-10 (hvdc/philox.h): Random123's published known-answer vectors, and the bulk fills
// (vectorized) equal to the block function word for word at every head/tail alignment.
#include <cstdint>
#include <string>
#include <vector>

#include "check.h"
#include "hvdc/philox.h"

namespace hvdc {
namespace {

struct Kat {
  PhiloxBlock counter;
  uint32_t k0, k1;
  PhiloxBlock expected;
};

void known_answers(Failures& f) {
  const Kat kats[] = {
      {{{0, 0, 0, 0}}, 0, 0, {{0x6627e8d5u, 0xe169c58du, 0xbc57ac4cu, 0x9b00dbd8u}}},
      {{{0xffffffffu, 0xffffffffu, 0xffffffffu, 0xffffffffu}},
       0xffffffffu,
       0xffffffffu,
       {{0x408f276du, 0x41c83b0eu, 0xa20bc7c6u, 0x6d5451fdu}}},
      {{{0x243f6a88u, 0x85a308d3u, 0x13198a2eu, 0x03707344u}},
       0xa4093822u,
       0x299f31d0u,
       {{0xd16cfe09u, 0x94fdccebu, 0x5001e420u, 0x24126ea1u}}},
  };
  int i = 0;
  for (const Kat& k : kats) {
    f.ran();
    const PhiloxBlock got = philox4x32_10(k.counter, k.k0, k.k1);
    for (int w = 0; w < 4; ++w)
      f.check(got.v[w] == k.expected.v[w],
              "known answer " + std::to_string(i) + " word " + std::to_string(w));
    ++i;
  }
}

void fills_match_blocks(Failures& f) {
  PhiloxKey key;
  key.seed = 0x0123456789abcdefULL;
  key.step = 42;
  key.stream = 3;
  for (uint64_t offset : {0ull, 1ull, 2ull, 3ull, 5ull, (1ull << 32) * 4 - 2}) {
    for (int64_t n : {0, 1, 3, 4, 7, 31, 32, 33, 100, 1000}) {
      f.ran();
      std::vector<uint32_t> words(static_cast<size_t>(n));
      std::vector<float> uniforms(static_cast<size_t>(n));
      philox_fill_u32(key, offset, n, words.data());
      philox_fill_uniform(key, offset, n, uniforms.data());
      for (int64_t i = 0; i < n; ++i) {
        const uint64_t index = offset + static_cast<uint64_t>(i);
        const uint32_t expect = philox_block(key, index >> 2).v[index & 3];
        const std::string what =
            "offset " + std::to_string(offset) + " n " + std::to_string(n) + " i " + std::to_string(i);
        f.check(words[static_cast<size_t>(i)] == expect, "word " + what);
        const float u = uniforms[static_cast<size_t>(i)];
        f.check(u == philox_word_to_uniform(expect) && u >= 0.0f && u < 1.0f, "uniform " + what);
      }
    }
  }
}

}  // namespace
}  // namespace hvdc

int main() {
  hvdc::Failures f;
  hvdc::known_answers(f);
  hvdc::fills_match_blocks(f);
  return f.finish("test_philox");
}
