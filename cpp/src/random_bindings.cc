// _core.philox4x32_10 (one raw block, for known-answer tests) and the bulk fills of
// hvdc/philox.h into caller-owned arrays.
#include "hvdc/random_bindings.h"

#include <nanobind/ndarray.h>
#include <nanobind/stl/array.h>

#include <array>
#include <cstdint>

#include "hvdc/philox.h"

namespace nb = nanobind;

namespace hvdc {

namespace {

template <typename T>
using Flat = nb::ndarray<T, nb::ndim<1>, nb::c_contig, nb::device::cpu>;

PhiloxKey key_of(uint64_t seed, uint32_t step, uint32_t stream) {
  PhiloxKey key;
  key.seed = seed;
  key.step = step;
  key.stream = stream;
  return key;
}

}  // namespace

void register_random(nb::module_& m) {
  m.def(
      "philox4x32_10",
      [](std::array<uint32_t, 4> counter, std::array<uint32_t, 2> key) {
        const PhiloxBlock out = philox4x32_10(
            PhiloxBlock{{counter[0], counter[1], counter[2], counter[3]}}, key[0], key[1]);
        return std::array<uint32_t, 4>{out.v[0], out.v[1], out.v[2], out.v[3]};
      },
      nb::arg("counter"), nb::arg("key"),
      "One Philox4x32-10 block of a 4-word counter and a 2-word key (Random123's convention).");
  m.def(
      "philox_fill_u32",
      [](Flat<uint32_t> out, uint64_t seed, uint32_t step, uint32_t stream, uint64_t offset) {
        nb::gil_scoped_release nogil;
        philox_fill_u32(key_of(seed, step, stream), offset, static_cast<int64_t>(out.shape(0)),
                        out.data());
      },
      nb::arg("out"), nb::arg("seed"), nb::arg("step"), nb::arg("stream"), nb::arg("offset") = 0,
      "Fills a contiguous uint32 array with words [offset, offset + len) of the sequence of "
      "(seed, step, stream) (layout in hvdc/philox.h).");
  m.def(
      "philox_fill_uniform",
      [](Flat<float> out, uint64_t seed, uint32_t step, uint32_t stream, uint64_t offset) {
        nb::gil_scoped_release nogil;
        philox_fill_uniform(key_of(seed, step, stream), offset,
                            static_cast<int64_t>(out.shape(0)), out.data());
      },
      nb::arg("out"), nb::arg("seed"), nb::arg("step"), nb::arg("stream"), nb::arg("offset") = 0,
      "Fills a contiguous float32 array with the uniforms in [0, 1) of words [offset, offset + "
      "len) of the sequence of (seed, step, stream): (word >> 8) * 2**-24.");
}

}  // namespace hvdc
