#include "hvdc/stochastic_kernel_bench.h"

#include <cmath>
#include <vector>

#include "hvdc/errors.h"
#include "hvdc/kernel_timing.h"
#include "hvdc/philox.h"
#include "hvdc/stochastic_kernels.h"

namespace hvdc {

std::map<std::string, double> stochastic_kernel_bench(int64_t numel, int reps) {
  if (numel < 8 || reps < 1)
    throw UsageError("stochastic_kernel_bench: numel must be >= 8 and reps >= 1");
  const int64_t n = numel / 8 * 8;
  const size_t nb = static_cast<size_t>(n);
  // Gradient-like data in [-1, 1] (the ratio m / (b + eps) is there too).
  std::vector<float> x(nb), werr(nb, 0.0f), serr(nb, 0.0f), m(nb, 0.0f), b(nb, 0.0f), out(nb),
      uniforms(nb);
  for (size_t i = 0; i < nb; ++i)
    x[i] = std::sin(0.001f * static_cast<float>(i)) * 0.9f + 0.01f * static_cast<float>(i % 7);
  std::vector<uint8_t> bits(nb / 8), bits2(nb / 8), out_bits(nb / 8);
  UniformSource u;
  u.key.seed = 1234;
  u.key.step = 1;
  stochastic_quantize(x.data(), werr.data(), nullptr, n, n, u, bits.data());
  u.key.stream = 1;
  stochastic_quantize(x.data(), werr.data(), nullptr, n, n, u, bits2.data());
  const uint8_t* ranks[2] = {bits.data(), bits2.data()};
  BirderMoments mo;
  mo.m = m.data();
  mo.b = b.data();
  UniformSource server = u;
  server.key.stream = 0xFFFFFFFFu;

  const std::vector<KernelTiming> cases = {
      {"stochastic_quantize",
       [&] { stochastic_quantize(x.data(), werr.data(), nullptr, n, n, u, bits.data()); }, nb * 8},
      {"stochastic_quantize_moments",
       [&] { stochastic_quantize(x.data(), werr.data(), &mo, n, n, u, bits.data()); }, nb * 16},
      {"stochastic_server",
       [&] { stochastic_server_quantize(ranks, 2, serr.data(), n, n, server, out_bits.data()); },
       nb * 4},
      {"sign_unpack", [&] { sign_unpack(out_bits.data(), out.data(), n); }, nb * 4},
      {"philox_fill", [&] { philox_fill_uniform(u.key, 0, n, uniforms.data()); }, nb * 4},
  };
  std::map<std::string, double> res = time_against_memcpy(cases, reps);
  res["numel"] = static_cast<double>(n);
  return res;
}

}  // namespace hvdc
