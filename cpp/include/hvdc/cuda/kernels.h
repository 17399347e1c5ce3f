// The CUDA kernels' host API (hvd_compress._cuda, built from cpp/cuda when nvcc is present):
// plain device pointers and the caller's stream, no framework types. Each launcher only enqueues
// work on `stream` and returns; results that decide later steps (a 1-bit scale, a sum of squares)
// stay on the device, so no launcher waits for the stream.
//
// Every kernel is a loop over the per-element functions in hvdc/elementwise/ that the CPU kernels
// call too, built with -fmad=false, so each element gets the bits the CPU's portable code gives.
// Sums that decide a value run in the fixed order of hvdc/elementwise/block_sum.h. Formats,
// rounding points and argument meanings are those of the CPU functions of the same name
// (hvdc/onebit_kernels.h, stochastic_kernels.h, cast.h, onebit_adam_kernels.h); the differences
// are named at each declaration.
//
// Bad arguments throw hvdc::UsageError before anything is enqueued; a failed launch throws
// hvdc::cuda::CudaError.
#pragma once
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>
#include <stdexcept>

#include "hvdc/dtype.h"
#include "hvdc/stochastic_kernels.h"

namespace hvdc {
namespace cuda {

struct CudaError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// ---- 1-bit compression (hvdc/onebit_kernels.h) ----------------------------------------------
// `workspace` holds onebit_workspace_doubles(n_padded) doubles of device memory (the block
// partial sums), owned by the caller and reusable once the stream has passed the call. `scale`,
// `sumsq` and `scales` are device pointers (4- and 8-byte aligned).

int64_t onebit_workspace_doubles(int64_t n_padded);

// Pass 1 of the worker step: bits of c = x + error and *sumsq, the double sum of squares of c in
// the block order of block_sum.h (the CPU sums in another order: see there).
void onebit_compress_signs(const void* x, DType dtype, const float* error, int64_t n_real,
                           int64_t n_padded, uint8_t* bits, double* sumsq, double* workspace,
                           cudaStream_t stream);

// *scale = onebit_scale(*sumsq, n_real) on the stream.
void onebit_scale(const double* sumsq, int64_t n_real, float* scale, cudaStream_t stream);

// Pass 2 of the worker step with the scale on the device.
void onebit_compress_error(const void* x, DType dtype, float* error, int64_t n_real,
                           const float* scale, cudaStream_t stream);

// The whole worker step: signs, *scale, error (passes 1 and 2; `sumsq` may be null).
void onebit_compress(const void* x, DType dtype, float* error, int64_t n_real, int64_t n_padded,
                     uint8_t* bits, float* scale, double* sumsq, double* workspace,
                     cudaStream_t stream);

// acc[i] += bit_i ? *scale : -*scale.
void onebit_accumulate(const uint8_t* bits, const float* scale, float* acc, int64_t n_real,
                       cudaStream_t stream);

// out[i] = bit_i ? *scale : -*scale in `dtype` (the two values rounded once).
void onebit_decompress(const uint8_t* bits, const float* scale, void* out, DType dtype,
                       int64_t n_real, cudaStream_t stream);

// The worker error with *scale fused with the decompression of (result_bits, *result_scale)
// into x, one pass over x.
void onebit_compress_error_decompress(void* x, DType dtype, float* error, int64_t n_real,
                                      const float* scale, const uint8_t* result_bits,
                                      const float* result_scale, cudaStream_t stream);

// The server step from the ranks' bits: rank r's n_padded / 8 bytes start at
// bits + r * bits_stride, its scale at scales[r]. c = (sum over ranks in rank order of
// +/-scale_r) / nranks + error; out_bits, *out_scale, error = c - (+/-scale).
void onebit_server_reduce_compress(const uint8_t* bits, int64_t bits_stride, const float* scales,
                                   int nranks, float* error, int64_t n_real, int64_t n_padded,
                                   uint8_t* out_bits, float* out_scale, double* workspace,
                                   cudaStream_t stream);

// The server step from an accumulated float32 sum (onebit_accumulate over the ranks).
void onebit_server_compress(const float* acc, int nranks, float* error, int64_t n_real,
                            int64_t n_padded, uint8_t* bits, float* out_scale, double* workspace,
                            cudaStream_t stream);

// ---- Birder's stochastic quantizer (hvdc/stochastic_kernels.h) -------------------------------
// Uniforms from Philox on the device (u.key, u.offset + i), or u.injected (a device pointer).
// `moments`, if not null, is read on the host; its m and b are device pointers.

void stochastic_quantize(const float* x, float* error, const BirderMoments* moments,
                         int64_t n_real, int64_t n_padded, const UniformSource& u, uint8_t* bits,
                         cudaStream_t stream);

// The server pass; rank r's bits start at bits + r * bits_stride.
void stochastic_server_quantize(const uint8_t* bits, int64_t bits_stride, int nranks,
                                float* error, int64_t n_real, int64_t n_padded,
                                const UniformSource& u, uint8_t* out_bits, cudaStream_t stream);

// out[i] = bit_i ? +1.0f : -1.0f.
void sign_unpack(const uint8_t* bits, float* out, int64_t n, cudaStream_t stream);

// ---- Casts (hvdc/cast.h) ---------------------------------------------------------------------

void widen_to_float(const void* src, DType dtype, float* dst, int64_t n, cudaStream_t stream);
void narrow_from_float(const float* src, float scale, void* dst, DType dtype, int64_t n,
                       cudaStream_t stream);

// ---- 1-bit Adam's fused passes (hvdc/onebit_adam_kernels.h) ----------------------------------

void onebit_local_momentum(const float* g, const float* m, const float* x, int64_t n,
                           float one_minus_b1, float l2, float b1, float* work,
                           cudaStream_t stream);
void onebit_adam_apply(const float* work, const float* denom, int64_t n, float decay, float value,
                       float floor_denom, float cap, float* m, float* x, cudaStream_t stream);

// ---- 1-bit LAMB's fused passes (hvdc/onebit_lamb_kernels.h) ---------------------------------
// Pass A writes the layer's max ratio to *ratio_max (device; -inf for n = 0, NaN if any ratio is);
// `workspace` holds onebit_lamb_workspace_floats(n) floats of device memory.

int64_t onebit_lamb_workspace_floats(int64_t n);
void onebit_lamb_moments(const float* work, const float* denom, int64_t n, float neg_b1,
                         float one_minus_b1, float b2, float one_minus_b2, float sqrt_bc2,
                         float floor, float eps, float* m, float* fresh, float* ratio_max,
                         float* workspace, cudaStream_t stream);
void onebit_lamb_apply(const float* m, const float* denom, int64_t n, float bc1, float wd,
                       float scale, float* x, cudaStream_t stream);

// ---- Adasum (hvdc/adasum_kernels.h) ---------------------------------------------------------
// dots[0..2] = (<left, right>, |left|^2, |right|^2) on the device, each a double sum in the block
// order of block_sum.h (the CPU sums with eight interleaved lanes instead: the last double bits
// may differ); `workspace` holds adasum_workspace_doubles(n) doubles of device memory. The
// coefficients (adasum_coefficient, on the host, after the ranks' sums) come back as host values.

int64_t adasum_workspace_doubles(int64_t n);
void adasum_dot_norms(const void* left, const void* right, DType dtype, int64_t n, double* dots,
                      double* workspace, cudaStream_t stream);
void adasum_combine(const void* left, double left_coeff, const void* right, double right_coeff,
                    void* out, DType dtype, int64_t n, cudaStream_t stream);
void widen_to_double(const void* src, DType dtype, double* dst, int64_t n, cudaStream_t stream);
void narrow_from_double(const double* src, double divisor, void* dst, DType dtype, int64_t n,
                        cudaStream_t stream);

// ---- SLAMB's masks (hvdc/masks.h) -----------------------------------------------------------
// The draws only: the caller selects the `always` ranges afterwards (a memset on the stream), as
// random_mask does on the CPU.

// Elements [first, first + n) of the Bernoulli mask of (seed, step, ratio) into out[0, n) (bytes,
// 1 selected); every element for ratio >= 1.
void bernoulli_mask_draw(uint64_t seed, int64_t step, double ratio, int64_t first, int64_t n,
                         uint8_t* out, cudaStream_t stream);

// The cyclic mask of one step over a range: out[x] = ranks[x] - base < width (unsigned), with
// ranks[x] the place of element first + x in the permutation of (numel, seed) (a device copy of
// what masks.cc draws and caches on the host), base = c * cs and width the chunk's length.
void cyclic_mask_compare(const uint32_t* ranks, uint32_t base, uint32_t width, int64_t n,
                         uint8_t* out, cudaStream_t stream);

// ---- SLAMB's masked gather and scatter (hvdc/masks.h) ---------------------------------------
// The j-th selected element (mask byte != 0, index order) pairs with compact element j, as on the
// CPU. The count is not known on the host: `count` / `used` (device int64, may be null) get the
// number selected, or -1 when it exceeds `capacity` / `count` (then only that many are moved).
// `workspace` holds mask_workspace_int64(n) int64 of device memory. `elem`: 2, 4 or 8 bytes.

int64_t mask_workspace_int64(int64_t n);
void mask_gather(const void* src, const uint8_t* mask, int64_t n, int64_t capacity, size_t elem,
                 void* dst, int64_t* count, int64_t* workspace, cudaStream_t stream);
void mask_scatter(const void* compact, const uint8_t* mask, int64_t n, int64_t count, size_t elem,
                  void* dst, int64_t* used, int64_t* workspace, cudaStream_t stream);

// ---- SLAMB's fused passes (hvdc/slamb_kernels.h) ---------------------------------------------
// The moments passes write the sum of the new v to *sum_v (device double) in the block order of
// block_sum.h (the CPU sums in float lanes per block of 1024, then in double: see the kernel
// check's note); `workspace` holds slamb_workspace_doubles(n) doubles. slamb_momentum_gather's
// *count and workspace are those of mask_gather (mask_workspace_int64(n) int64).

int64_t slamb_workspace_doubles(int64_t n);
void slamb_momentum(const float* m, const float* g, int64_t n, float b1, float* work,
                    cudaStream_t stream);
void slamb_momentum_gather(const float* m, const float* g, const uint8_t* mask, int64_t n,
                           float b1, float* out, int64_t capacity, int64_t* count,
                           int64_t* workspace, cudaStream_t stream);
void slamb_moments(const float* work, const float* g, int64_t n, float b2, float* m, float* v,
                   double* sum_v, double* workspace, cudaStream_t stream);
void slamb_local_moments(const float* g, const uint8_t* mask, int64_t n, float b1, float b2,
                         float* m, float* v, double* sum_v, double* workspace,
                         cudaStream_t stream);
void slamb_apply(const float* u, const float* c, int64_t n, float dphi, float phi_min,
                 float clip_min, float clip_max, float deta, float eta_min, float* x,
                 cudaStream_t stream);

// ---- Top-k / random-k selection (hvdc/sparse_allreduce.h) ------------------------------------
// idx[0, k) = the ascending indices the CPU's topk_select / randomk_select give (keys and tie rule
// of hvdc/elementwise/select.h; c finite). `workspace` holds select_workspace_bytes(numel) bytes of
// device memory (256-byte aligned).

int64_t select_workspace_bytes(int64_t numel);
void topk_select(const float* c, int64_t numel, int64_t k, uint32_t* idx, void* workspace,
                 cudaStream_t stream);
void randomk_select(int64_t numel, int64_t k, uint64_t seed, uint32_t step, uint32_t* idx,
                    uint64_t offset, void* workspace, cudaStream_t stream);

}  // namespace cuda
}  // namespace hvdc
