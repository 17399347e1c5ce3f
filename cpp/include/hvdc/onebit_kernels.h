// The element-wise work of error-compensated 1-bit compression (paper 003, 1-bit Adam,
// Algorithm 1, line 7: worker compress + worker error; line 10: server average + server error +
// re-compress; paper 001, 1-bit LAMB, Algorithm 1, lines 7-10, and its compressor
// C[x] = ||x||_2 / sqrt(numel) * Sign(x)). The collective that moves the bits is in
// compressed_allreduce.h; the reference mirror is hvd_compress/reference/onebit.py.
//
// Wire format of one compressed chunk of `n` elements (n a multiple of 8):
//   - n / 8 bytes of sign bits: element 8*i + j is bit j (value 1 << j) of byte i; a set bit means
//     "non-negative" (+scale), a clear bit "negative" (-scale). A value of +0 or -0 is sent as +1
//     (DESIGN.md; as DeepSpeed's sign().add_(1).bool()).
//   - one float32 scale = ||c||_2 / sqrt(n_real), over the chunk's `n_real` real elements only.
// Elements at positions >= n_real are padding: their bits are written as 0, they never count in
// a scale, never decompress to anything, and their error entries are never read or written.
//
// Precision (the reference rounds at exactly these points):
//   - error buffers are float32 whatever the buffer dtype: the residual of a float16/bfloat16
//     buffer would lose most of its bits if stored in the buffer's dtype;
//   - the compensated value c = float(x) + e is one float32 addition;
//   - the sum of squares is accumulated in double; scale = float(sqrt(sum / n_real));
//   - the new error e = c - (+/-scale) is one float32 subtraction;
//   - the server accumulates +/-scale_r over ranks r = 0..n-1 in rank order in float32 (starting
//     from 0.0f), then divides by float(n) (one float32 division) before adding its error.
// Every other step is exact, so every implementation below produces the same bits, scales and
// errors, except for the order of the double sum of squares: each square of a float32 is exact
// in double, and the sums differ only in their last double bits, which moves the float32 scale
// only in a tie 29 bits below its last place (the tests allow one float32 ulp there).
//
// Implementation: every kernel has a portable scalar version and an AVX2 (+F16C, FMA) version
// chosen at run time (__builtin_cpu_supports; the caller's KernelChoice, the runtime's
// HVDC_ONEBIT_KERNELS read at init, can force the portable one); both produce identical bytes
// (checked through this API by onebit_kernels_self_check, hvdc/onebit_kernel_bench.h).
// The worker and server steps are two passes over a chunk, because the scale needs the whole sum
// of squares before any error can be written: pass 1 (`*_signs`) reads only and writes the bits,
// pass 2 (`*_error`) recomputes c (the same float32 operations, so the same value) and writes the
// error. Recomputing c costs fewer memory bytes than storing it, and pass 1 leaving the state
// untouched lets the collective fuse the NaN/Inf check into it (a non-finite c makes the sum of
// squares non-finite, and a finite c cannot: c^2 <= 1.2e77 for float32).
#pragma once
#include <cstdint>

#include "hvdc/dtype.h"
#include "hvdc/kernel_isa.h"

namespace hvdc {

// Index of the first real element whose compensated value float(x[i]) + error[i] is NaN or
// +/-Inf, or -1 if all are finite. Checked before any error buffer is touched, so that a bad
// input is rejected with the state unchanged instead of spreading NaN into the error feedback.
int64_t onebit_first_nonfinite(const void* x, DType dtype, const float* error, int64_t n,
    KernelChoice choice = KernelChoice::kAuto);

// Worker step (003 Alg. 1 line 7) on one chunk: c = x + error; bits = sign(c); returns
// scale = ||c|| / sqrt(n_real); error = c - scale * sign(c). `x` has `n_real` elements of `dtype`
// (float32, float16 or bfloat16), `error` n_real float32s, `bits` n_padded / 8 bytes
// (n_padded >= n_real, a multiple of 8). n_real == 0 gives scale 0 and all-zero bits.
// Equals onebit_compress_signs, onebit_scale, onebit_compress_error in sequence.
float onebit_compress(const void* x, DType dtype, float* error, int64_t n_real, int64_t n_padded,
                      uint8_t* bits,
    KernelChoice choice = KernelChoice::kAuto);

// Pass 1 of onebit_compress, reading only: writes the n_padded / 8 bytes of bits and returns the
// double sum of squares of c = x + error over the n_real real elements. The sum is +inf or NaN if
// and only if some c is (then nothing else should be done with this chunk).
double onebit_compress_signs(const void* x, DType dtype, const float* error, int64_t n_real,
                             int64_t n_padded, uint8_t* bits,
    KernelChoice choice = KernelChoice::kAuto);

// float(sqrt(sumsq / n_real)), and 0 for n_real == 0.
float onebit_scale(double sumsq, int64_t n_real);

// Pass 2 of onebit_compress: error = c - (c >= 0 ? scale : -scale), c = float(x) + error.
void onebit_compress_error(const void* x, DType dtype, float* error, int64_t n_real, float scale,
    KernelChoice choice = KernelChoice::kAuto);

// onebit_compress_error(x, dtype, error, n_real, scale) followed by
// onebit_decompress(result_bits, result_scale, x, dtype, n_real), in one pass over x: each x[i]
// is read (for the worker error) before the result overwrites it. What the collective runs after
// the allgather, on each chunk of its buffer.
void onebit_compress_error_decompress(void* x, DType dtype, float* error, int64_t n_real,
                                      float scale, const uint8_t* result_bits,
                                      float result_scale,
    KernelChoice choice = KernelChoice::kAuto);

// acc[i] += bit_i ? scale : -scale for i < n_real (one received chunk, float32 accumulation).
void onebit_accumulate(const uint8_t* bits, float scale, float* acc, int64_t n_real,
    KernelChoice choice = KernelChoice::kAuto);

// Server step (003 Alg. 1 line 10) on the chunk this rank serves: c = acc / nranks + error;
// bits = sign(c); returns scale = ||c|| / sqrt(n_real); error = c - scale * sign(c).
// `acc` holds the float32 sum over ranks of the decompressed chunks (onebit_accumulate).
float onebit_server_compress(const float* acc, int nranks, float* error, int64_t n_real,
                             int64_t n_padded, uint8_t* bits,
    KernelChoice choice = KernelChoice::kAuto);

// The server step fused with the accumulation, as the collective runs it (no float32 sum buffer):
// c = (0.0f + (+/-scales[0]) + ... + (+/-scales[nranks-1])) / nranks + error, the signs of rank r
// taken from bits[r] (n_real elements each); then as onebit_server_compress. Same results as
// onebit_accumulate over r = 0..nranks-1 into a zeroed buffer followed by onebit_server_compress.
float onebit_server_reduce_compress(const uint8_t* const* bits, const float* scales, int nranks,
                                    float* error, int64_t n_real, int64_t n_padded,
                                    uint8_t* out_bits,
    KernelChoice choice = KernelChoice::kAuto);

// onebit_server_reduce_compress in pieces, for the pipelined collective (compressed_allreduce.h),
// which runs pass 1 on each piece of its chunk as the ranks' bits of that piece arrive. The double
// sum of squares is carried across pieces in OneBitSumSq (the AVX2 kernel's four vector
// accumulators and the scalar tail's four), so that the pieces run the very same operations in the
// same order as one call over the whole chunk: the same bits, scale and error, bit for bit.
// Every piece but the last one holding real elements must be whole (n_real == n_padded) and a
// multiple of 32 elements (the AVX2 loop's block), or the next piece's call throws UsageError.
struct OneBitSumSq {
  double lanes[16] = {};  // AVX2: accumulators s0..s3, four lanes each
  double tail[4] = {};    // the scalar loop's accumulators (all of the scalar kernel's sum)
  bool ended = false;     // a partial piece was seen: no more real elements may follow
};

// Pass 1 of onebit_server_reduce_compress on one piece: `bits` (nranks pointers) and `error`,
// `out_bits` point at the piece; writes the piece's bits, stores c in `error` and adds the
// squares to `acc`.
void onebit_server_reduce_signs(const uint8_t* const* bits, const float* scales, int nranks,
                                float* error, int64_t n_real, int64_t n_padded,
                                uint8_t* out_bits, OneBitSumSq& acc,
    KernelChoice choice = KernelChoice::kAuto);

// The sum of squares of the pieces added so far (for onebit_scale with the chunk's n_real).
double onebit_sumsq(const OneBitSumSq& acc, KernelChoice choice = KernelChoice::kAuto);

// Pass 2 of onebit_server_reduce_compress on any range of the chunk: error = c - (+/-scale),
// c as stored by onebit_server_reduce_signs.
void onebit_server_error(float* error, int64_t n_real, float scale,
    KernelChoice choice = KernelChoice::kAuto);

// out[i] = round_to_dtype(bit_i ? scale : -scale) for i < n_real (the result, 003 Alg. 1 line 13).
void onebit_decompress(const uint8_t* bits, float scale, void* out, DType dtype, int64_t n_real,
    KernelChoice choice = KernelChoice::kAuto);

// Which implementation the kernels above run in this process: "avx2" or "scalar".
const char* onebit_kernel_isa();

}  // namespace hvdc
