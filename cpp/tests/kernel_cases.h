// The cases of the GPU kernel check (cpp/tests/test_cuda_kernels.cu): for every kernel of
// hvdc/cuda/kernels.h, inputs drawn from a fixed seed and the outputs that the CPU core's kernel
// of the same name gives them, as named byte buffers. The CUDA check computes the same outputs on
// the device and compares bytes; write_kernel_fixtures.cc stores their digests (golden fixtures of
// the CPU core, taken where no GPU is) for the check to compare against too.
//
// Where the CPU kernels add a value-deciding sum in another order than the device (1-bit sums of
// squares, Adasum's dots: hvdc/elementwise/block_sum.h), the expected value is the CPU's kernel
// pass fed the sum in the device's order (blocked_sum), and a separate note says whether the
// CPU kernel's own sum gives the same float32 scale.
#pragma once
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "hvdc/adasum_kernels.h"
#include "hvdc/cast.h"
#include "hvdc/elementwise/block_sum.h"
#include "hvdc/elementwise/half.h"
#include "hvdc/elementwise/onebit.h"
#include "hvdc/masks.h"
#include "hvdc/onebit_adam_kernels.h"
#include "hvdc/onebit_kernels.h"
#include "hvdc/onebit_lamb_kernels.h"
#include "hvdc/slamb_kernels.h"
#include "hvdc/sparse_allreduce.h"
#include "hvdc/stochastic_kernels.h"

namespace kcase {

using hvdc::DType;

// One named output of one case.
struct Output {
  std::string name;
  std::vector<uint8_t> bytes;
};
struct Result {
  std::vector<Output> outputs;
  std::vector<std::string> notes;  // facts worth a line in the table (sum-order differences)
};

template <typename T>
std::vector<uint8_t> bytes_of(const T* p, int64_t n) {
  std::vector<uint8_t> b(static_cast<size_t>(n) * sizeof(T));
  if (n > 0) std::memcpy(b.data(), p, b.size());
  return b;
}
template <typename T>
std::vector<uint8_t> bytes_of(const std::vector<T>& v) {
  return bytes_of(v.data(), static_cast<int64_t>(v.size()));
}

// The float32 outputs of the cases that divide (0 / 0 where the inputs hold zeros) with every NaN written
// as one pattern: which bits a NaN carries is the hardware's (x86 0xffc00000, CUDA 0x7fffffff), so both
// sides are checked for NaN at the same elements and byte equality everywhere else.
inline std::vector<uint8_t> nan_canonical_f32(std::vector<uint8_t> b) {
  for (size_t i = 0; i + 4 <= b.size(); i += 4) {
    uint32_t u;
    std::memcpy(&u, b.data() + i, 4);
    if ((u & 0x7f800000u) == 0x7f800000u && (u & 0x007fffffu) != 0) {
      u = 0x7fc00000u;
      std::memcpy(b.data() + i, &u, 4);
    }
  }
  return b;
}

// Deterministic inputs: splitmix64 streams, one per (case, buffer).
inline uint64_t splitmix(uint64_t& s) {
  uint64_t z = (s += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
// Floats in [lo, hi), with signed zeros at fixed places (the sign rule's edge) when n allows.
inline std::vector<float> floats(uint64_t seed, int64_t n, float lo, float hi) {
  std::vector<float> v(static_cast<size_t>(n));
  uint64_t s = seed;
  for (auto& x : v) x = lo + (hi - lo) * static_cast<float>(splitmix(s) >> 40) * 0x1p-24f;
  if (n > 5) v[3] = 0.0f, v[5] = -0.0f;
  return v;
}
inline std::vector<uint8_t> random_bytes(uint64_t seed, int64_t n) {
  std::vector<uint8_t> v(static_cast<size_t>(n));
  uint64_t s = seed;
  for (auto& x : v) x = static_cast<uint8_t>(splitmix(s) >> 56);
  return v;
}
// A buffer of `dtype` (float32, float16 or bfloat16) from floats, as raw bytes.
inline std::vector<uint8_t> typed(const std::vector<float>& f, DType dtype) {
  if (dtype == DType::kFloat32) return bytes_of(f);
  std::vector<uint16_t> h(f.size());
  hvdc::narrow_from_float(f.data(), 1.0f, h.data(), dtype, static_cast<int64_t>(f.size()));
  return bytes_of(h);
}
inline std::vector<uint8_t> typed_f64(const std::vector<float>& f, DType dtype) {
  if (dtype != DType::kFloat64) return typed(f, dtype);
  std::vector<double> d(f.begin(), f.end());
  return bytes_of(d);
}
inline int64_t padded(int64_t n) { return (n + 7) / 8 * 8; }
inline const char* dtype_tag(DType d) {
  switch (d) {
    case DType::kFloat16: return "f16";
    case DType::kBFloat16: return "bf16";
    case DType::kFloat64: return "f64";
    default: return "f32";
  }
}
// Float of a stored dtype element (for the sums in the device's order).
inline float load_float(const std::vector<uint8_t>& buf, DType dtype, int64_t i) {
  if (dtype == DType::kFloat32) {
    float f;
    std::memcpy(&f, buf.data() + 4 * i, 4);
    return f;
  }
  uint16_t h;
  std::memcpy(&h, buf.data() + 2 * i, 2);
  return dtype == DType::kFloat16 ? hvdc::half_to_float(h) : hvdc::bf16_to_float(h);
}
inline double load_double(const std::vector<uint8_t>& buf, DType dtype, int64_t i) {
  if (dtype == DType::kFloat64) {
    double d;
    std::memcpy(&d, buf.data() + 8 * i, 8);
    return d;
  }
  return load_float(buf, dtype, i);
}
inline size_t elem_size(DType d) {
  return d == DType::kFloat64 ? 8 : d == DType::kFloat32 ? 4 : 2;
}

// Parameters every side uses.
constexpr int kRanks = 3;  // the server cases: not a power of two (the division is rounded)
constexpr uint64_t kSeed = 20261127;
inline hvdc::PhiloxKey philox_key() {
  hvdc::PhiloxKey k;
  k.seed = 0xB1DDE5ull;
  k.step = 11;
  k.stream = 2;
  return k;
}
constexpr uint64_t kPhiloxOffset = 4096;  // the chunk's place in a larger buffer
constexpr float kAdamB1 = 0.9f, kAdamL2 = 0.001f, kAdamDecay = 0.9999f, kAdamValue = -0.0125f;
constexpr float kAdamCap = 10.0f, kAdamFloor = 0.05f;
constexpr float kLambB2 = 0.999f, kLambSqrtBc2 = 0.3f, kLambFloor = 0.01f, kLambEps = 1e-6f;
constexpr float kLambBc1 = 0.4f, kLambWd = 0.01f, kLambScale = -0.002f;
constexpr double kMaskRatio = 0.1;
constexpr uint64_t kMaskSeed = 77;
constexpr int64_t kMaskStep = 13;
constexpr float kSlambB1 = 0.9f, kSlambB2 = 0.999f;
constexpr float kSlambDphi = 0.8f, kSlambPhiMin = 0.1f, kSlambClipMin = 0.2f, kSlambClipMax = 0.7f;
constexpr float kSlambDeta = -0.01f, kSlambEtaMin = 0.001f;
constexpr float kNarrowScale = 2.0f;  // narrow_from_float: inputs up to 140000, past float16's 65504

// The inputs of the 1-bit worker cases.
struct OneBitInputs {
  std::vector<uint8_t> x;      // n elements of dtype
  std::vector<float> error;    // n
  std::vector<uint8_t> rbits;  // a result's bits (n_padded / 8)
  float rscale = 0.37f;
};
inline OneBitInputs onebit_inputs(int64_t n, DType dtype) {
  OneBitInputs in;
  in.x = typed(floats(kSeed + 1, n, -2.0f, 2.0f), dtype);
  in.error = floats(kSeed + 2, n, -0.25f, 0.25f);
  in.rbits = random_bytes(kSeed + 3, padded(n) / 8);
  return in;
}

// The server inputs: kRanks ranks' bits (stride n_padded / 8) and scales, the server error.
struct ServerInputs {
  std::vector<uint8_t> bits;
  std::vector<float> scales;
  std::vector<float> error;
};
inline ServerInputs server_inputs(int64_t n) {
  ServerInputs in;
  in.bits = random_bytes(kSeed + 4, kRanks * padded(n) / 8);
  in.scales = {0.5f, 1.25f, 0.0625f};
  in.error = floats(kSeed + 5, n, -0.5f, 0.5f);
  return in;
}

// The adasum case's two vectors.
struct AdasumInputs {
  std::vector<uint8_t> left, right;
};
inline AdasumInputs adasum_inputs(int64_t n, DType dtype) {
  return {typed_f64(floats(kSeed + 6, n, -1.0f, 1.0f), dtype),
          typed_f64(floats(kSeed + 7, n, -1.5f, 0.5f), dtype)};
}

// The Adam/LAMB buffers.
struct UpdateInputs {
  std::vector<float> g, m, x, work, denom, fresh;
};
inline UpdateInputs update_inputs(int64_t n) {
  UpdateInputs in;
  in.g = floats(kSeed + 8, n, -1.0f, 1.0f);
  in.m = floats(kSeed + 9, n, -0.1f, 0.1f);
  in.x = floats(kSeed + 10, n, -3.0f, 3.0f);
  in.work = floats(kSeed + 11, n, -0.2f, 0.2f);
  in.denom = floats(kSeed + 12, n, 0.01f, 0.2f);  // some at or below kAdamFloor
  in.fresh = floats(kSeed + 13, n, 0.0f, 0.01f);
  return in;
}

// The mask of the SLAMB and gather/scatter cases: the Bernoulli mask of kMaskRatio over [0, n), with
// a run of selected elements from n / 2 (whole tiles selected, and tiles with none, at the large n).
inline std::vector<uint8_t> case_mask(int64_t n) {
  hvdc::MaskSpec s;
  s.numel = n;
  s.ratio = kMaskRatio;
  s.seed = kMaskSeed + 1;
  s.step = kMaskStep;
  s.kind = hvdc::MaskKind::kBernoulli;
  std::vector<uint8_t> mask(static_cast<size_t>(n));
  hvdc::random_mask(s, mask.data());
  const int64_t run = n / 4 < 10000 ? n / 4 : 10000;
  for (int64_t i = n / 2; i < n / 2 + run; ++i) mask[static_cast<size_t>(i)] = 1;
  return mask;
}
inline int64_t count_of(const std::vector<uint8_t>& mask) {
  return hvdc::mask_count(mask.data(), static_cast<int64_t>(mask.size()));
}
// The SLAMB inputs: update_inputs' g, m and work, v >= 0, u and the freshness c in [0, 1].
struct SlambInputs {
  std::vector<float> g, m, work, v, u, c, x;
  std::vector<uint8_t> mask;
};
inline SlambInputs slamb_inputs(int64_t n) {
  const UpdateInputs up = update_inputs(n);
  SlambInputs in;
  in.g = up.g;
  in.m = up.m;
  in.work = up.work;
  in.v = up.fresh;
  in.x = up.x;
  in.u = floats(kSeed + 22, n, -1.0f, 1.0f);
  in.c = floats(kSeed + 23, n, 0.0f, 1.0f);
  in.mask = case_mask(n);
  return in;
}
// The sum of the new v in the device's order (block_sum.h), and a note on the CPU kernel's own sum.
inline double slamb_sum_v(const std::vector<float>& v, double kernel_sum, Result& r) {
  const double pinned =
      hvdc::blocked_sum(static_cast<int64_t>(v.size()), [&](int64_t i) { return static_cast<double>(v[i]); });
  if (std::memcmp(&pinned, &kernel_sum, 8) == 0) {
    r.notes.push_back("CPU kernel's sum of v equal");
  } else {
    char rel[32];
    std::snprintf(rel, sizeof rel, "%.2e", pinned != 0 ? std::fabs(kernel_sum - pinned) / std::fabs(pinned) : 0.0);
    r.notes.push_back(std::string("CPU kernel's sum of v (float lanes) differs, rel ") + rel);
  }
  return pinned;
}

// The top-k case's c: values on a grid of 1/16 (many equal magnitudes, +0 and -0: the tie rule) and
// k = ceil(n / 2); the random-k case's k = n / 10 + 1, at an offset in a larger buffer.
inline std::vector<float> topk_input(int64_t n) {
  std::vector<float> c = floats(kSeed + 27, n, -2.0f, 2.0f);
  for (auto& x : c) x = static_cast<float>(static_cast<int>(x * 16.0f)) / 16.0f;
  return c;
}
inline int64_t topk_k(int64_t n) { return (n + 1) / 2; }
inline int64_t randomk_k(int64_t n) { return n / 10 + 1 < n ? n / 10 + 1 : n; }

// The names of the cases, in the order the check runs them.
inline std::vector<std::string> case_names() {
  return {"onebit_compress/f32",  "onebit_compress/f16",  "onebit_compress/bf16",
          "onebit_decompress/f32", "onebit_decompress/bf16", "onebit_accumulate",
          "onebit_compress_error_decompress/f32", "onebit_compress_error_decompress/f16",
          "onebit_server_reduce_compress", "onebit_server_compress",
          "stochastic_quantize",  "stochastic_quantize/moments", "stochastic_server_quantize",
          "sign_unpack",          "widen_to_float/f16",   "widen_to_float/bf16",
          "narrow_from_float/f16", "narrow_from_float/bf16", "onebit_local_momentum",
          "onebit_adam_apply",    "onebit_lamb_moments",  "onebit_lamb_apply",
          "adasum_dot_norms/f32", "adasum_dot_norms/f16", "adasum_dot_norms/f64",
          "adasum_combine/f32",   "adasum_combine/bf16",  "adasum_combine/f64",
          "widen_to_double/f16",  "narrow_from_double/bf16", "bernoulli_mask",
          "cyclic_mask",          "mask_gather/f16",      "mask_gather/f32",
          "mask_gather/f64",      "mask_scatter/f16",     "mask_scatter/f32",
          "mask_scatter/f64",     "slamb_momentum",       "slamb_momentum_gather",
          "slamb_moments",        "slamb_local_moments",  "slamb_apply",
          "topk_select",          "randomk_select"};
}
inline DType dtype_of(const std::string& name) {
  const auto slash = name.find('/');
  const std::string t = slash == std::string::npos ? "f32" : name.substr(slash + 1);
  if (t == "f16") return DType::kFloat16;
  if (t == "bf16") return DType::kBFloat16;
  if (t == "f64") return DType::kFloat64;
  return DType::kFloat32;
}
inline std::string base_of(const std::string& name) { return name.substr(0, name.find('/')); }

// The 1-bit sum of squares of c = x + error in the device's order.
inline double onebit_sumsq_blocked(const OneBitInputs& in, DType dtype, int64_t n) {
  return hvdc::blocked_sum(n, [&](int64_t i) {
    return hvdc::onebit_square(hvdc::onebit_compensated(load_float(in.x, dtype, i), in.error[i]));
  });
}

inline std::string scale_note(const char* what, float kernel, float pinned) {
  if (std::memcmp(&kernel, &pinned, 4) == 0) return std::string(what) + ": CPU kernel's scale equal";
  uint32_t a, b;
  std::memcpy(&a, &kernel, 4);
  std::memcpy(&b, &pinned, 4);
  const long d = static_cast<long>(a) - static_cast<long>(b);
  return std::string(what) + ": CPU kernel's scale differs by " + std::to_string(d) + " ulp";
}

// The CPU server step from the ranks' bits with the scale of the device's order.
inline void cpu_server_pinned(const ServerInputs& in, int64_t n, std::vector<float>& error,
                              std::vector<uint8_t>& out_bits, float& scale, Result& r) {
  const int64_t np = padded(n);
  std::vector<const uint8_t*> ptrs;
  for (int k = 0; k < kRanks; ++k) ptrs.push_back(in.bits.data() + k * np / 8);
  error = in.error;
  out_bits.assign(static_cast<size_t>(np / 8), 0);
  std::vector<float> kernel_error = in.error;
  std::vector<uint8_t> kernel_bits(out_bits.size());
  const float kernel_scale = hvdc::onebit_server_reduce_compress(
      ptrs.data(), in.scales.data(), kRanks, kernel_error.data(), n, np, kernel_bits.data());
  hvdc::OneBitSumSq acc;
  hvdc::onebit_server_reduce_signs(ptrs.data(), in.scales.data(), kRanks, error.data(), n, np,
                                   out_bits.data(), acc);
  const double sumsq = hvdc::blocked_sum(
      n, [&](int64_t i) { return hvdc::onebit_square(error[static_cast<size_t>(i)]); });
  scale = hvdc::onebit_scale(sumsq, n);
  hvdc::onebit_server_error(error.data(), n, scale);
  r.notes.push_back(scale_note("server", kernel_scale, scale));
}

// The CPU core's outputs of case `name` at n elements.
inline Result cpu_case(const std::string& name, int64_t n) {
  Result r;
  const DType dt = dtype_of(name);
  const std::string base = base_of(name);
  const int64_t np = padded(n);
  auto out = [&](const char* what, std::vector<uint8_t> b) { r.outputs.push_back({what, std::move(b)}); };
  if (base == "onebit_compress") {
    OneBitInputs in = onebit_inputs(n, dt);
    std::vector<uint8_t> bits(static_cast<size_t>(np / 8));
    std::vector<float> kernel_error = in.error;
    const float kernel_scale = hvdc::onebit_compress(in.x.data(), dt, kernel_error.data(), n, np, bits.data());
    hvdc::onebit_compress_signs(in.x.data(), dt, in.error.data(), n, np, bits.data());
    const double sumsq = onebit_sumsq_blocked(in, dt, n);
    const float scale = hvdc::onebit_scale(sumsq, n);
    hvdc::onebit_compress_error(in.x.data(), dt, in.error.data(), n, scale);
    out("bits", bits);
    out("scale", bytes_of(&scale, 1));
    out("sumsq", bytes_of(&sumsq, 1));
    out("error", bytes_of(in.error));
    r.notes.push_back(scale_note("worker", kernel_scale, scale));
  } else if (base == "onebit_decompress") {
    OneBitInputs in = onebit_inputs(n, dt);
    std::vector<uint8_t> y(static_cast<size_t>(n) * elem_size(dt));
    hvdc::onebit_decompress(in.rbits.data(), in.rscale, y.data(), dt, n);
    out("out", y);
  } else if (base == "onebit_accumulate") {
    OneBitInputs in = onebit_inputs(n, DType::kFloat32);
    std::vector<float> acc = in.error;
    hvdc::onebit_accumulate(in.rbits.data(), in.rscale, acc.data(), n);
    out("acc", bytes_of(acc));
  } else if (base == "onebit_compress_error_decompress") {
    OneBitInputs in = onebit_inputs(n, dt);
    const float scale = 0.8125f;
    hvdc::onebit_compress_error_decompress(in.x.data(), dt, in.error.data(), n, scale,
                                           in.rbits.data(), in.rscale);
    out("x", in.x);
    out("error", bytes_of(in.error));
  } else if (base == "onebit_server_reduce_compress" || base == "onebit_server_compress") {
    // Both device paths (fused, and accumulate + compress) give the fused CPU step's results.
    const ServerInputs in = server_inputs(n);
    std::vector<float> error;
    std::vector<uint8_t> bits;
    float scale = 0;
    cpu_server_pinned(in, n, error, bits, scale, r);
    out("bits", bits);
    out("scale", bytes_of(&scale, 1));
    out("error", bytes_of(error));
  } else if (base == "stochastic_quantize") {
    const std::vector<float> x = floats(kSeed + 14, n, -1.5f, 1.5f);
    std::vector<float> error = floats(kSeed + 15, n, -0.5f, 0.5f);
    std::vector<float> m = floats(kSeed + 16, n, -0.2f, 0.2f), b = floats(kSeed + 17, n, 0.0f, 0.3f);
    hvdc::BirderMoments mom;
    mom.m = m.data();
    mom.b = b.data();
    hvdc::UniformSource u;
    u.key = philox_key();
    u.offset = kPhiloxOffset;
    std::vector<uint8_t> bits(static_cast<size_t>(np / 8));
    const bool with = name == "stochastic_quantize/moments";
    hvdc::stochastic_quantize(x.data(), error.data(), with ? &mom : nullptr, n, np, u, bits.data());
    out("bits", bits);
    out("error", bytes_of(error));
    if (with) out("m", bytes_of(m)), out("b", bytes_of(b));
  } else if (base == "stochastic_server_quantize") {
    const ServerInputs in = server_inputs(n);
    std::vector<const uint8_t*> ptrs;
    for (int k = 0; k < kRanks; ++k) ptrs.push_back(in.bits.data() + k * np / 8);
    std::vector<float> error = in.error;
    hvdc::UniformSource u;
    u.key = philox_key();
    u.offset = kPhiloxOffset;
    std::vector<uint8_t> bits(static_cast<size_t>(np / 8));
    hvdc::stochastic_server_quantize(ptrs.data(), kRanks, error.data(), n, np, u, bits.data());
    out("bits", bits);
    out("error", bytes_of(error));
  } else if (base == "sign_unpack") {
    const auto bits = random_bytes(kSeed + 18, np / 8);
    std::vector<float> y(static_cast<size_t>(n));
    hvdc::sign_unpack(bits.data(), y.data(), n);
    out("out", bytes_of(y));
  } else if (base == "widen_to_float") {
    const auto h = random_bytes(kSeed + 19, 2 * n);  // every bit pattern, NaNs included
    std::vector<float> y(static_cast<size_t>(n));
    hvdc::widen_to_float(h.data(), dt, y.data(), n);
    out("out", bytes_of(y));
  } else if (base == "narrow_from_float") {
    const auto f = floats(kSeed + 20, n, -70000.0f, 70000.0f);
    std::vector<uint16_t> y(static_cast<size_t>(n));
    hvdc::narrow_from_float(f.data(), kNarrowScale, y.data(), dt, n);
    out("out", bytes_of(y));
  } else if (base == "onebit_local_momentum") {
    const UpdateInputs in = update_inputs(n);
    std::vector<float> work(static_cast<size_t>(n));
    hvdc::onebit_local_momentum(in.g.data(), in.m.data(), in.x.data(), n, 1.0f - kAdamB1, kAdamL2,
                                kAdamB1, work.data());
    out("work", bytes_of(work));
  } else if (base == "onebit_adam_apply") {
    UpdateInputs in = update_inputs(n);
    hvdc::onebit_adam_apply(in.work.data(), in.denom.data(), n, kAdamDecay, kAdamValue, kAdamFloor,
                            kAdamCap, in.m.data(), in.x.data());
    out("m", bytes_of(in.m));
    out("x", nan_canonical_f32(bytes_of(in.x)));
  } else if (base == "onebit_lamb_moments") {
    UpdateInputs in = update_inputs(n);
    const float ratio_max = hvdc::onebit_lamb_moments(
        in.work.data(), in.denom.data(), n, -kAdamB1, 1.0f - kAdamB1, kLambB2, 1.0f - kLambB2,
        kLambSqrtBc2, kLambFloor, kLambEps, in.m.data(), in.fresh.data());
    out("m", bytes_of(in.m));
    out("fresh", bytes_of(in.fresh));
    out("ratio_max", bytes_of(&ratio_max, 1));
  } else if (base == "onebit_lamb_apply") {
    UpdateInputs in = update_inputs(n);
    hvdc::onebit_lamb_apply(in.m.data(), in.denom.data(), n, kLambBc1, kLambWd, kLambScale, in.x.data());
    out("x", nan_canonical_f32(bytes_of(in.x)));
  } else if (base == "adasum_dot_norms") {
    const AdasumInputs in = adasum_inputs(n, dt);
    double d[3] = {0, 0, 0};
    for (int k = 0; k < 3; ++k)
      d[k] = hvdc::blocked_sum(n, [&](int64_t i) {
        const double x = load_double(in.left, dt, i), y = load_double(in.right, dt, i);
        return k == 0 ? x * y : k == 1 ? x * x : y * y;
      });
    const hvdc::AdasumDots cpu = hvdc::adasum_dot_norms(in.left.data(), in.right.data(), dt, n);
    const double kernel[3] = {cpu.dot, cpu.left_sq, cpu.right_sq};
    int same = 0;
    double worst = 0;
    for (int k = 0; k < 3; ++k) {
      same += std::memcmp(&kernel[k], &d[k], 8) == 0;
      if (d[k] != 0) worst = std::fmax(worst, std::fabs(kernel[k] - d[k]) / std::fabs(d[k]));
    }
    char rel[32];
    std::snprintf(rel, sizeof rel, "%.2e", worst);
    r.notes.push_back("CPU kernel's dots: " + std::to_string(same) + " of 3 equal, max rel diff " + rel);
    out("dots", bytes_of(d, 3));
  } else if (base == "adasum_combine") {
    const AdasumInputs in = adasum_inputs(n, dt);
    std::vector<uint8_t> y(static_cast<size_t>(n) * elem_size(dt));
    hvdc::adasum_combine(in.left.data(), 0.75, in.right.data(), 1.0625, y.data(), dt, n);
    out("out", y);
  } else if (base == "widen_to_double") {
    const AdasumInputs in = adasum_inputs(n, dt);
    std::vector<double> y(static_cast<size_t>(n));
    hvdc::widen_to_double(in.left.data(), dt, y.data(), n);
    out("out", bytes_of(y));
  } else if (base == "narrow_from_double") {
    const std::vector<float> f = floats(kSeed + 21, n, -4.0f, 4.0f);
    const std::vector<double> src(f.begin(), f.end());
    std::vector<uint8_t> y(static_cast<size_t>(n) * elem_size(dt));
    hvdc::narrow_from_double(src.data(), 3.0, y.data(), dt, n);
    out("out", y);
  } else if (base == "bernoulli_mask" || base == "cyclic_mask") {
    hvdc::MaskSpec s;
    s.numel = n + 5;  // the case draws [5, numel): a range of a larger mask
    s.first = 5;
    s.length = n;
    s.ratio = kMaskRatio;
    s.seed = kMaskSeed;
    s.step = kMaskStep;
    s.kind = base == "bernoulli_mask" ? hvdc::MaskKind::kBernoulli : hvdc::MaskKind::kCyclic;
    std::vector<uint8_t> mask(static_cast<size_t>(n));
    hvdc::random_mask(s, mask.data());
    out("mask", mask);
  } else if (base == "mask_gather" || base == "mask_scatter") {
    const std::vector<uint8_t> mask = case_mask(n);
    const int64_t count = count_of(mask);
    const size_t es = elem_size(dt);
    if (base == "mask_gather") {
      const std::vector<uint8_t> src = random_bytes(kSeed + 24, n * static_cast<int64_t>(es));
      std::vector<uint8_t> dst(static_cast<size_t>(count) * es);
      const int64_t got = hvdc::mask_gather(src.data(), mask.data(), n, count, es, dst.data());
      out("dst", dst);
      out("count", bytes_of(&got, 1));
    } else {
      const std::vector<uint8_t> compact = random_bytes(kSeed + 25, count * static_cast<int64_t>(es));
      std::vector<uint8_t> dst = random_bytes(kSeed + 26, n * static_cast<int64_t>(es));
      const int64_t used = hvdc::mask_scatter(compact.data(), mask.data(), n, count, es, dst.data());
      out("dst", dst);
      out("used", bytes_of(&used, 1));
    }
  } else if (base == "slamb_momentum") {
    const SlambInputs in = slamb_inputs(n);
    std::vector<float> work(static_cast<size_t>(n));
    hvdc::slamb_momentum(in.m.data(), in.g.data(), n, kSlambB1, work.data());
    out("work", bytes_of(work));
  } else if (base == "slamb_momentum_gather") {
    const SlambInputs in = slamb_inputs(n);
    const int64_t count = count_of(in.mask);
    std::vector<float> o(static_cast<size_t>(count));
    const int64_t got =
        hvdc::slamb_momentum_gather(in.m.data(), in.g.data(), in.mask.data(), n, kSlambB1, o.data(), count);
    out("out", bytes_of(o));
    out("count", bytes_of(&got, 1));
  } else if (base == "slamb_moments" || base == "slamb_local_moments") {
    SlambInputs in = slamb_inputs(n);
    const double kernel_sum =
        base == "slamb_moments"
            ? hvdc::slamb_moments(in.work.data(), in.g.data(), n, kSlambB2, in.m.data(), in.v.data())
            : hvdc::slamb_local_moments(in.g.data(), in.mask.data(), n, kSlambB1, kSlambB2, in.m.data(),
                                        in.v.data());
    const double sum_v = slamb_sum_v(in.v, kernel_sum, r);
    out("m", bytes_of(in.m));
    out("v", bytes_of(in.v));
    out("sum_v", bytes_of(&sum_v, 1));
  } else if (base == "slamb_apply") {
    SlambInputs in = slamb_inputs(n);
    hvdc::slamb_apply(in.u.data(), in.c.data(), n, kSlambDphi, kSlambPhiMin, kSlambClipMin, kSlambClipMax,
                      kSlambDeta, kSlambEtaMin, in.x.data());
    out("x", bytes_of(in.x));
  } else if (base == "topk_select") {
    const std::vector<float> c = topk_input(n);
    std::vector<uint32_t> idx(static_cast<size_t>(topk_k(n)));
    hvdc::topk_select(c.data(), n, topk_k(n), idx.data());
    out("idx", bytes_of(idx));
  } else if (base == "randomk_select") {
    std::vector<uint32_t> idx(static_cast<size_t>(randomk_k(n)));
    hvdc::randomk_select(n, randomk_k(n), kMaskSeed, static_cast<uint32_t>(kMaskStep), idx.data(), kPhiloxOffset);
    out("idx", bytes_of(idx));
  } else {
    throw std::invalid_argument("unknown kernel case " + name);
  }
  return r;
}

// FNV-1a 64 of a byte buffer: the fixtures' digest.
inline uint64_t digest(const std::vector<uint8_t>& b) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (uint8_t c : b) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

}  // namespace kcase
