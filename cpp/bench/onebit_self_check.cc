// onebit_kernels_self_check (hvdc/onebit_kernel_bench.h): every public 1-bit kernel run with
// KernelChoice::kScalar and with kAuto (AVX2 on a CPU that has it) on the same data, compared
// byte for byte. Written against the public API only, so the shipped kernels file carries no
// test code.
#include "hvdc/onebit_kernel_bench.h"

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "hvdc/errors.h"
#include "hvdc/kernel_isa.h"
#include "hvdc/onebit_kernels.h"

namespace hvdc {
namespace {

struct Lcg {  // small deterministic generator, enough for test data
  uint64_t s;
  uint32_t next() {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    return static_cast<uint32_t>(s >> 33);
  }
  float uniform() { return static_cast<float>(next() >> 8) * (1.0f / 16777216.0f); }  // [0, 1)
  // Mostly moderate values, with zeros of both signs, subnormal and huge ones (of float16 when
  // `f16`, so that the buffer stays finite).
  float value(bool f16) {
    const uint32_t kind = next() % 64;
    if (kind == 0) return 0.0f;
    if (kind == 1) return -0.0f;
    if (kind == 2) return (uniform() - 0.5f) * (f16 ? 1e-4f : 1e-40f);
    if (kind == 3) return (uniform() - 0.5f) * (f16 ? 1e5f : 1e30f);
    if (kind == 4) return (uniform() - 0.5f) * 1e-6f;
    return (uniform() - 0.5f) * 4.0f;
  }
};

template <typename T>
std::string first_difference(const char* what, const std::vector<T>& a, const std::vector<T>& b) {
  if (a.size() != b.size()) return std::string(what) + ": sizes differ";
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(T)) != 0)
      return std::string(what) + ": scalar and avx2 differ at index " + std::to_string(i);
  return "";
}

// The two implementations add the double squares in different orders (hvdc/onebit_kernels.h).
std::string close_sums(const char* what, double a, double b) {
  if (a == b || std::fabs(a - b) <= 1e-12 * std::fabs(a)) return "";
  return std::string(what) + ": sums of squares " + std::to_string(a) + " and " + std::to_string(b);
}

}  // namespace

std::string onebit_kernels_self_check(int64_t numel, DType dtype, uint64_t seed) {
  if (!cpu_has_avx2_kernels()) return "";  // one implementation only: nothing to compare
  const KernelChoice both[2] = {KernelChoice::kScalar, KernelChoice::kAuto};
  const size_t n = static_cast<size_t>(numel);
  const int64_t padded = (numel + 7) / 8 * 8;
  const size_t nbytes = static_cast<size_t>(padded / 8);
  Lcg rng{seed * 2654435761u + 1};
  // Buffer in its dtype; the float values are rounded to it.
  std::vector<uint8_t> x(n * dtype_size(dtype));
  for (size_t i = 0; i < n; ++i) {
    const float v = rng.value(dtype == DType::kFloat16);
    if (dtype == DType::kFloat32) std::memcpy(x.data() + 4 * i, &v, 4);
    else if (dtype == DType::kFloat16) {
      const uint16_t h = float_to_half(v);
      std::memcpy(x.data() + 2 * i, &h, 2);
    } else if (dtype == DType::kBFloat16) {
      const uint16_t h = float_to_bf16(v);
      std::memcpy(x.data() + 2 * i, &h, 2);
    } else {
      throw UsageError(std::string("onebit_kernels_self_check: dtype ") + dtype_name(dtype));
    }
  }
  std::vector<float> error0(n);
  for (float& e : error0) e = rng.value(false) * 0.25f;

  std::string why;
  // Worker step: both passes, with the same scale for pass 2 so that errors compare exactly.
  std::vector<uint8_t> bits[2];
  std::vector<float> err[2];
  double sums[2];
  for (int k = 0; k < 2; ++k) {
    bits[k].assign(nbytes, 0xAB);
    err[k] = error0;
    sums[k] = onebit_compress_signs(x.data(), dtype, err[k].data(), numel, padded, bits[k].data(),
                                    both[k]);
  }
  if (!(why = first_difference("compress bits", bits[0], bits[1])).empty()) return why;
  if (!(why = close_sums("compress", sums[0], sums[1])).empty()) return why;
  const float scale = onebit_scale(sums[0], numel);
  for (int k = 0; k < 2; ++k)
    onebit_compress_error(x.data(), dtype, err[k].data(), numel, scale, both[k]);
  if (!(why = first_difference("compress error", err[0], err[1])).empty()) return why;

  // Server side with 1 to 5 ranks (every specialization of the fused kernel): accumulate +
  // server_compress, and the fused step, all agreeing.
  constexpr int kMaxRanks = 5;
  std::vector<uint8_t> rbits[kMaxRanks];
  float rscales[kMaxRanks];
  const uint8_t* rptr[kMaxRanks];
  for (int r = 0; r < kMaxRanks; ++r) {
    rbits[r].resize(nbytes);
    for (auto& b : rbits[r]) b = static_cast<uint8_t>(rng.next());
    rptr[r] = rbits[r].data();
    rscales[r] = r == 0 ? scale : r == 3 ? 0.0f : 1e-3f * static_cast<float>(r) + rng.uniform();
  }
  for (int kRanks = 1; kRanks <= kMaxRanks; ++kRanks) {
    const std::string at = std::to_string(kRanks) + " ranks: ";
    std::vector<float> acc[2], serr[2], ferr[2];
    std::vector<uint8_t> sbits[2], fbits[2];
    float sscale[2], fscale[2];
    for (int k = 0; k < 2; ++k) {
      acc[k].assign(n, 0.0f);
      for (int r = 0; r < kRanks; ++r)
        onebit_accumulate(rptr[r], rscales[r], acc[k].data(), numel, both[k]);
      serr[k] = error0;
      ferr[k] = error0;
      sbits[k].assign(nbytes, 0xCD);
      fbits[k].assign(nbytes, 0xEF);
      sscale[k] = onebit_server_compress(acc[k].data(), kRanks, serr[k].data(), numel, padded,
                                         sbits[k].data(), both[k]);
      fscale[k] = onebit_server_reduce_compress(rptr, rscales, kRanks, ferr[k].data(), numel,
                                                padded, fbits[k].data(), both[k]);
    }
    for (const std::string& d :
         {first_difference("accumulate", acc[0], acc[1]),
          first_difference("server bits", sbits[0], sbits[1]),
          first_difference("fused server bits (scalar)", fbits[0], sbits[1]),
          first_difference("fused server bits (avx2)", fbits[1], sbits[1])})
      if (!d.empty()) return at + d;
    // Scales may differ by the order of the sum of squares; errors are compared when they agree.
    const float s0 = sscale[0];
    if (sscale[1] == s0 && fscale[0] == s0 && fscale[1] == s0) {
      for (const std::string& d :
           {first_difference("server error", serr[0], serr[1]),
            first_difference("fused server error (scalar)", ferr[0], serr[0]),
            first_difference("fused server error (avx2)", ferr[1], serr[0])})
        if (!d.empty()) return at + d;
    } else if (std::fabs(sscale[1] - s0) > 1e-6f * s0 || std::fabs(fscale[0] - s0) > 1e-6f * s0 ||
               std::fabs(fscale[1] - s0) > 1e-6f * s0) {
      return at + "server scales differ: " + std::to_string(s0) + ", " +
             std::to_string(sscale[1]) + ", fused " + std::to_string(fscale[0]) + ", " +
             std::to_string(fscale[1]);
    }
  }

  // Decompress into the dtype.
  std::vector<uint8_t> out[2];
  for (int k = 0; k < 2; ++k) {
    out[k].assign(n * dtype_size(dtype), 0x11);
    onebit_decompress(rptr[0], 0.3f, out[k].data(), dtype, numel, both[k]);
  }
  if (!(why = first_difference("decompress", out[0], out[1])).empty()) return why;

  // Worker pass 2 fused with the result: the same bytes as the two kernels one after the other.
  {
    std::vector<uint8_t> xr[3];
    std::vector<float> er[3];
    for (int k = 0; k < 3; ++k) {
      xr[k] = x;
      er[k] = error0;
    }
    onebit_compress_error(xr[0].data(), dtype, er[0].data(), numel, scale, both[0]);
    onebit_decompress(rptr[1], 0.7f, xr[0].data(), dtype, numel, both[0]);
    for (int k = 0; k < 2; ++k)
      onebit_compress_error_decompress(xr[k + 1].data(), dtype, er[k + 1].data(), numel, scale,
                                       rptr[1], 0.7f, both[k]);
    for (const std::string& d : {first_difference("error+result (scalar) x", xr[1], xr[0]),
                                 first_difference("error+result (avx2) x", xr[2], xr[0]),
                                 first_difference("error+result (scalar) e", er[1], er[0]),
                                 first_difference("error+result (avx2) e", er[2], er[0])})
      if (!d.empty()) return d;
  }

  // Non-finite scan, with an Inf planted (when there is room) in the error buffer.
  if (numel > 0) {
    std::vector<float> bad = error0;
    const size_t at = static_cast<size_t>(rng.next()) % n;
    bad[at] = INFINITY;
    const int64_t got0 = onebit_first_nonfinite(x.data(), dtype, bad.data(), numel, both[0]);
    const int64_t got1 = onebit_first_nonfinite(x.data(), dtype, bad.data(), numel, both[1]);
    if (got0 != got1 || got0 > static_cast<int64_t>(at) || got0 < 0)
      return "first_nonfinite: scalar " + std::to_string(got0) + ", avx2 " +
             std::to_string(got1) + ", planted at " + std::to_string(at);
    const double s0 = onebit_compress_signs(x.data(), dtype, bad.data(), numel, padded,
                                            bits[0].data(), both[0]);
    const double s1 = onebit_compress_signs(x.data(), dtype, bad.data(), numel, padded,
                                            bits[1].data(), both[1]);
    if (std::isfinite(s0) || std::isfinite(s1)) return "sum of squares finite with an Inf input";
  }
  return "";
}

}  // namespace hvdc
