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
//   - the server accumulates +/-scale_r over ranks r = 0..n-1 in rank order in float32, then
//     divides by float(n) (one float32 division) before adding its error.
#pragma once
#include <cstdint>

#include "hvdc/dtype.h"

namespace hvdc {

// Index of the first real element whose compensated value float(x[i]) + error[i] is NaN or
// +/-Inf, or -1 if all are finite. Checked before any error buffer is touched, so that a bad
// input is rejected with the state unchanged instead of spreading NaN into the error feedback.
int64_t onebit_first_nonfinite(const void* x, DType dtype, const float* error, int64_t n);

// Worker step (003 Alg. 1 line 7) on one chunk: c = x + error; bits = sign(c); returns
// scale = ||c|| / sqrt(n_real); error = c - scale * sign(c). `x` has `n_real` elements of `dtype`
// (float32, float16 or bfloat16), `error` n_real float32s, `bits` n_padded / 8 bytes
// (n_padded >= n_real, a multiple of 8). n_real == 0 gives scale 0 and all-zero bits.
float onebit_compress(const void* x, DType dtype, float* error, int64_t n_real, int64_t n_padded,
                      uint8_t* bits);

// acc[i] += bit_i ? scale : -scale for i < n_real (one received chunk, float32 accumulation).
void onebit_accumulate(const uint8_t* bits, float scale, float* acc, int64_t n_real);

// Server step (003 Alg. 1 line 10) on the chunk this rank serves: c = acc / nranks + error;
// bits = sign(c); returns scale = ||c|| / sqrt(n_real); error = c - scale * sign(c).
// `acc` holds the float32 sum over ranks of the decompressed chunks (onebit_accumulate).
float onebit_server_compress(const float* acc, int nranks, float* error, int64_t n_real,
                             int64_t n_padded, uint8_t* bits);

// out[i] = round_to_dtype(bit_i ? scale : -scale) for i < n_real (the result, 003 Alg. 1 line 13).
void onebit_decompress(const uint8_t* bits, float scale, void* out, DType dtype, int64_t n_real);

}  // namespace hvdc
