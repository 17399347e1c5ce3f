// Philox4x32-10 (hvdc/philox.h): Random123's published known-answer vectors, and the bulk fills
// equal to the block function word for word at every head/tail alignment, on every implementation
// this CPU runs (portable, AVX2, AVX-512) as well as the auto-chosen one.
#include <cstdint>
#include <cstdio>
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
  for (PhiloxIsa isa : {PhiloxIsa::kAuto, PhiloxIsa::kPortable, PhiloxIsa::kAvx2, PhiloxIsa::kAvx512}) {
    if (!philox_isa_supported(isa)) {
      std::printf("test_philox: this CPU has no %s fill, not checked\n", philox_isa_name(isa));
      continue;
    }
    // Lengths that end inside the 4-chain (32 blocks), 1-chain (8 blocks) and scalar (1 block)
    // loops of the vector fills, from every head alignment and across the counter's 2^32 carry.
    for (uint64_t offset : {0ull, 1ull, 2ull, 3ull, 5ull, (1ull << 32) * 4 - 2, (1ull << 32) * 4 - 130}) {
      for (int64_t n : {0, 1, 3, 4, 7, 31, 32, 33, 100, 127, 128, 129, 131, 160, 163, 255, 1000, 4099}) {
        f.ran();
        std::vector<uint32_t> words(static_cast<size_t>(n));
        std::vector<float> uniforms(static_cast<size_t>(n));
        if (isa == PhiloxIsa::kAuto) {
          philox_fill_u32(key, offset, n, words.data());
          philox_fill_uniform(key, offset, n, uniforms.data());
        } else {
          philox_fill_u32_with(isa, key, offset, n, words.data());
          philox_fill_uniform_with(isa, key, offset, n, uniforms.data());
        }
        int bad_words = 0, bad_uniforms = 0;
        int64_t first_bad = -1;
        for (int64_t i = 0; i < n; ++i) {
          const uint64_t index = offset + static_cast<uint64_t>(i);
          const uint32_t expect = philox_block(key, index >> 2).v[index & 3];
          const float u = uniforms[static_cast<size_t>(i)];
          const bool word_ok = words[static_cast<size_t>(i)] == expect;
          const bool uniform_ok = u == philox_word_to_uniform(expect) && u >= 0.0f && u < 1.0f;
          bad_words += !word_ok;
          bad_uniforms += !uniform_ok;
          if ((!word_ok || !uniform_ok) && first_bad < 0) first_bad = i;
        }
        f.check(bad_words == 0 && bad_uniforms == 0,
                std::string(philox_isa_name(isa)) + " offset " + std::to_string(offset) + " n " +
                    std::to_string(n) + ": " + std::to_string(bad_words) + " words and " +
                    std::to_string(bad_uniforms) + " uniforms differ from the block function, first at i " +
                    std::to_string(first_bad));
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
