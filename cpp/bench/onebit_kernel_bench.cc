#include "hvdc/onebit_kernel_bench.h"

#include <cmath>
#include <cstring>
#include <vector>

#include "hvdc/errors.h"
#include "hvdc/kernel_timing.h"
#include "hvdc/onebit_kernels.h"

namespace hvdc {

std::map<std::string, double> onebit_kernel_bench(int64_t numel, DType dtype, int reps) {
  if (numel < 8 || reps < 1)
    throw UsageError("onebit_kernel_bench: numel must be >= 8 and reps >= 1");
  if (dtype != DType::kFloat32 && !is_half(dtype))
    throw UsageError(std::string("onebit_kernel_bench: dtype ") + dtype_name(dtype) +
                     " is not supported; use float32, float16 or bfloat16");
  const int64_t n = numel / 8 * 8;
  const size_t esize = dtype_size(dtype);
  const size_t nb = static_cast<size_t>(n);
  // Gradient-like data: a smooth signal, in the buffer dtype.
  std::vector<uint8_t> x(nb * esize);
  for (size_t i = 0; i < nb; ++i) {
    const float v = std::sin(0.001f * static_cast<float>(i)) + 0.01f * static_cast<float>(i % 7);
    if (dtype == DType::kFloat32) std::memcpy(&x[4 * i], &v, 4);
    else {
      const uint16_t h = dtype == DType::kFloat16 ? float_to_half(v) : float_to_bf16(v);
      std::memcpy(&x[2 * i], &h, 2);
    }
  }
  std::vector<float> werr(nb, 0.0f), serr(nb, 0.0f), acc(nb, 0.0f);
  std::vector<uint8_t> bits(nb / 8), bits2(nb / 8), out_bits(nb / 8), out(nb * esize);
  const float scale = onebit_compress(x.data(), dtype, werr.data(), n, n, bits.data());
  onebit_compress(x.data(), dtype, werr.data(), n, n, bits2.data());
  const uint8_t* ranks[2] = {bits.data(), bits2.data()};
  const float scales[2] = {scale, 0.5f * scale};

  const size_t dense_x = nb * esize;
  const std::vector<KernelTiming> cases = {
      {"compress",
       [&] { onebit_compress(x.data(), dtype, werr.data(), n, n, bits.data()); },
       nb * (esize + 4)},
      {"compress_signs",
       [&] { onebit_compress_signs(x.data(), dtype, werr.data(), n, n, bits.data()); },
       nb * (esize + 4)},
      {"accumulate", [&] { onebit_accumulate(bits.data(), scale, acc.data(), n); }, nb * 4},
      // acc grows by one scale per run: still finite, and server_compress does not mind.
      {"server_compress",
       [&] { onebit_server_compress(acc.data(), 2, serr.data(), n, n, out_bits.data()); },
       nb * 8},
      {"server_fused",
       [&] { onebit_server_reduce_compress(ranks, scales, 2, serr.data(), n, n, out_bits.data()); },
       nb * 4},
      {"decompress", [&] { onebit_decompress(out_bits.data(), scale, out.data(), dtype, n); },
       dense_x},
      // Works on a copy of x (`out`), which it overwrites with the result.
      {"error_decompress",
       [&] {
         onebit_compress_error_decompress(out.data(), dtype, werr.data(), n, scale, bits.data(),
                                          scale);
       },
       nb * (esize + 4), [&] { std::memcpy(out.data(), x.data(), dense_x); }},
  };
  std::map<std::string, double> res = time_against_memcpy(cases, reps);
  res["numel"] = static_cast<double>(n);
  return res;
}

}  // namespace hvdc
