// The element-wise work of Birder's unbiased stochastic binary quantization (paper 004, Algorithm 1,
// the quantizer Q of its Section 3 and lines 8-9 (worker) and 11-12 (server) of the algorithm box;
// specs/birder.md sections 2, 3.5 and 3.6). The collective that moves the bits is in
// hierarchical_allreduce.h; the NumPy mirror is hvd_compress/reference/birder.py.
//
// Q(y) = +1 with probability p = clip((y + 1) / 2, 0, 1), else -1, computed as `u < p` with u a
// uniform in [0, 1) (spec 2; B1: the clip makes Q(y) = sign(y) for |y| >= 1). No clip is needed in
// the code: u in [0, 1) makes `u < p` always true for p >= 1 and always false for p <= 0. The
// output is exactly +/-1, sent as one bit and nothing else (no scale).
//
// Wire format: as the 1-bit kernels (hvdc/onebit_kernels.h): element 8*i + j is bit j (1 << j) of
// byte i; a set bit is +1, a clear bit -1. Positions >= n_real are padding: their bits are written
// as 0, their error entries are never read or written.
//
// Precision (hvd_compress/reference/birder.py rounds at exactly these points, all float32, no FMA):
//   worker: y = x + e; p = (y + 1) * 0.5; q = u < p ? +1 : -1; e = y - q.
//   worker with Birder's moments (spec 3.2-3.5, fused so that m, b and the ratio are streamed once):
//     m = beta * m + omb * a;  b = beta * b + omb * |a|;  y = m / (b + eps) + e;  then as above,
//     with omb = float32(1 - beta) given by the caller (one rounding of the double 1 - beta).
//   server: s = float(2 * ones - n) / float(n) + e, with `ones` the number of set bits among the n
//     received pieces (exact integer count); then as the worker.
// Uniforms: either injected (`uniforms`, one per element, for tests) or drawn from the core's
// Philox generator (hvdc/philox.h) as uniform (key, offset + i) for element i: `offset` is the
// element's index in the whole (padded) buffer, so the draws do not depend on how it is sharded.
//
// Implementation: a portable scalar version and an AVX2 version chosen at run time (the caller's
// KernelChoice, hvdc/kernel_isa.h, can force the portable one, as for the 1-bit kernels); both give the same
// bits and errors. The uniforms are generated a tile at a time into a stack buffer (Philox's AVX2
// fill) and consumed at once, so they never travel through memory.
#pragma once
#include <cstdint>

#include "hvdc/kernel_isa.h"
#include "hvdc/philox.h"

namespace hvdc {

// Where the uniforms of a quantization come from: `injected` (if not null, one float per element,
// element i reads injected[i]) or Philox uniform (key, offset + i).
struct UniformSource {
  PhiloxKey key;
  uint64_t offset = 0;
  const float* injected = nullptr;
};

// Birder's moments of the quantized chunk (spec 3.2-3.4): updated in place by the worker pass.
struct BirderMoments {
  float* m = nullptr;
  float* b = nullptr;
  float beta = 0.95f;
  float one_minus_beta = 0.05f;
  float eps = 1e-8f;
};

// Worker pass on one chunk: y = x + error (or, with `moments`, the updated ratio m / (b + eps) +
// error, with x the gradient a); bits = Q(y); error = y - Q(y). `x` and `error` have n_real
// float32s, `bits` n_padded / 8 bytes (n_padded >= n_real, a multiple of 8).
void stochastic_quantize(const float* x, float* error, const BirderMoments* moments,
                         int64_t n_real, int64_t n_padded, const UniformSource& u, uint8_t* bits,
                         KernelChoice choice = KernelChoice::kAuto);

// Server pass on the piece this rank serves: s = (sum over r < nranks of +/-1 from bits[r]) /
// nranks + error; out_bits = Q(s); error = s - Q(s). n_real real elements, n_padded / 8 bytes out.
void stochastic_server_quantize(const uint8_t* const* bits, int nranks, float* error,
                                int64_t n_real, int64_t n_padded, const UniformSource& u,
                                uint8_t* out_bits, KernelChoice choice = KernelChoice::kAuto);

// out[i] = bit_i ? +1.0f : -1.0f for i < n.
void sign_unpack(const uint8_t* bits, float* out, int64_t n,
                 KernelChoice choice = KernelChoice::kAuto);

// Index of the first NaN/Inf among x[0..n), or -1.
int64_t first_nonfinite_f32(const float* x, int64_t n);

// "avx2" or "scalar": what the kernels above run in this process.
const char* stochastic_kernel_isa();

}  // namespace hvdc
