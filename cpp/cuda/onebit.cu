// 1-bit compression on the device (see hvdc/cuda/kernels.h, hvdc/onebit_kernels.h for the wire
// format): the per-element math of hvdc/elementwise/onebit.h in grid-stride loops. The signs pass
// also writes the block partial sums of block_sum.h: each CUDA block takes whole blocks of
// kSumBlock elements, and a warp's 32 consecutive elements give one 32-bit ballot, i.e. four bytes
// of bits, so no two threads write the same byte.
#include <string>

#include "block_sum.cuh"
#include "hvdc/cuda/kernels.h"
#include "hvdc/elementwise/half.h"
#include "hvdc/elementwise/onebit.h"
#include "hvdc/errors.h"
#include "hvdc/packed_chunk.h"
#include "launch.cuh"

namespace hvdc {
namespace cuda {
namespace {

// Sources of the value v that c = v + e is built from (as in onebit_kernels.cc).
struct SrcF32 {
  const float* p;
  __device__ float value(int64_t i) const { return p[i]; }
};
template <HalfKind K>
struct SrcHalf {
  const uint16_t* p;
  __device__ float value(int64_t i) const { return widen<K>(p[i]); }
};
struct SrcAccDiv {  // the server's accumulated sum over ranks, divided by the rank count
  const float* acc;
  OneBitDivide div;
  __device__ float value(int64_t i) const { return div(acc[i]); }
};
struct SrcRankSum {  // the server's sum over ranks of +/-scale_r, in rank order from 0.0f, divided
  const uint8_t* bits;
  int64_t stride;
  const float* scales;
  int nranks;
  OneBitDivide div;
  __device__ float value(int64_t i) const {
    float acc = 0.0f;
    for (int r = 0; r < nranks; ++r) acc = onebit_add_rank(acc, bit_of(bits + r * stride, i), scales[r]);
    return div(acc);
  }
};

// Pass 1: bits of every position < n_padded (0 past n_real) and one partial sum of squares per
// block of kSumBlock elements. With kStoreC, c is written to c_out (the server stores it in its
// error buffer, as the CPU does, so pass 2 need not redo the sum over ranks).
template <bool kStoreC, typename Src>
__global__ void __launch_bounds__(kSumLanes)
signs_kernel(Src src, const float* error, float* c_out, int64_t n_real, int64_t n_padded,
             uint8_t* bits, double* partials) {
  __shared__ double shared[kSumLanes];
  const int l = threadIdx.x;
  const int64_t nbytes = n_padded / 8;
  const int64_t nblocks = sum_blocks(n_padded);
  for (int64_t b = blockIdx.x; b < nblocks; b += gridDim.x) {
    const int64_t b0 = b * kSumBlock;
    double lane = 0.0;
    for (int64_t row = b0; row < b0 + kSumBlock; row += kSumLanes) {
      const int64_t i = row + l;
      bool sign = false;
      if (i < n_real) {
        const float c = onebit_compensated(src.value(i), error[i]);
        if (kStoreC) c_out[i] = c;
        sign = onebit_sign(c);
        lane += onebit_square(c);
      }
      const unsigned word = __ballot_sync(0xffffffffu, sign);
      const int j = l & 31;
      const int64_t byte = ((row + (l & ~31)) >> 3) + j;
      if (j < 4 && byte < nbytes) bits[byte] = static_cast<uint8_t>(word >> (8 * j));
    }
    const double partial = block_tree_sum(lane, shared);
    if (l == 0) partials[b] = partial;
  }
}

// Step 4 of the order and the scale, one thread.
__global__ void scale_kernel(const double* partials, int64_t nblocks, int64_t n_real,
                             double* sumsq, float* scale) {
  const double total = sum_in_block_order(partials, nblocks);
  if (sumsq != nullptr) *sumsq = total;
  if (scale != nullptr) *scale = onebit_scale_of(total, n_real);
}

__global__ void scale_of_sumsq_kernel(const double* sumsq, int64_t n_real, float* scale) {
  *scale = onebit_scale_of(*sumsq, n_real);
}

// Pass 2: error = c - (+/-scale); c = error[i] if pass 1 stored it.
template <bool kStoredC, typename Src>
__global__ void error_kernel(Src src, float* error, int64_t n_real, const float* scale) {
  const float s = *scale;
  for (int64_t i = grid_first(); i < n_real; i += grid_step()) {
    const float c = kStoredC ? error[i] : onebit_compensated(src.value(i), error[i]);
    error[i] = onebit_error(c, s);
  }
}

__global__ void accumulate_kernel(const uint8_t* bits, const float* scale, float* acc,
                                  int64_t n_real) {
  const float s = *scale;
  for (int64_t i = grid_first(); i < n_real; i += grid_step())
    acc[i] = onebit_add_rank(acc[i], bit_of(bits, i), s);
}

// The result's two values in the buffer's type: float32, or the bit patterns of a half type.
struct OutF32 {
  using T = float;
  __device__ static float pos(float s) { return s; }
  __device__ static float neg(float s) { return -s; }
};
template <HalfKind K>
struct OutHalf {
  using T = uint16_t;
  __device__ static uint16_t pos(float s) { return narrow_scaled<K>(s, 1.0f); }
  __device__ static uint16_t neg(float s) { return narrow_scaled<K>(-s, 1.0f); }
};

template <typename Out>
__global__ void decompress_kernel(const uint8_t* bits, const float* scale, typename Out::T* out,
                                  int64_t n_real) {
  const typename Out::T pos = Out::pos(*scale), neg = Out::neg(*scale);
  for (int64_t i = grid_first(); i < n_real; i += grid_step())
    out[i] = onebit_pick(bit_of(bits, i), pos, neg);
}

template <typename Out, typename Src>
__global__ void error_decompress_kernel(Src src, float* error, int64_t n_real, const float* scale,
                                        const uint8_t* bits, const float* result_scale,
                                        typename Out::T* out) {
  const float ws = *scale;
  const typename Out::T pos = Out::pos(*result_scale), neg = Out::neg(*result_scale);
  for (int64_t i = grid_first(); i < n_real; i += grid_step()) {
    error[i] = onebit_error(onebit_compensated(src.value(i), error[i]), ws);
    out[i] = onebit_pick(bit_of(bits, i), pos, neg);
  }
}

[[noreturn]] void unsupported(DType dtype) {
  throw UsageError(std::string("1-bit compression is not defined for ") + dtype_name(dtype) +
                   "; use float32, float16 or bfloat16");
}

// f(source, output policy) for the buffer's dtype.
template <typename F>
void dispatch(DType dtype, const void* x, F&& f) {
  switch (dtype) {
    case DType::kFloat32: return f(SrcF32{static_cast<const float*>(x)}, OutF32{});
    case DType::kFloat16:
      return f(SrcHalf<HalfKind::kFloat16>{static_cast<const uint16_t*>(x)},
               OutHalf<HalfKind::kFloat16>{});
    case DType::kBFloat16:
      return f(SrcHalf<HalfKind::kBFloat16>{static_cast<const uint16_t*>(x)},
               OutHalf<HalfKind::kBFloat16>{});
    default: break;
  }
  unsupported(dtype);
}

template <bool kStoreC, typename Src>
void launch_signs(const Src& src, const float* error, float* c_out, int64_t n_real,
                  int64_t n_padded, uint8_t* bits, double* partials, cudaStream_t stream) {
  const int64_t nblocks = sum_blocks(n_padded);
  if (nblocks == 0) return;
  const unsigned grid = static_cast<unsigned>(nblocks < kMaxBlocks ? nblocks : kMaxBlocks);
  signs_kernel<kStoreC><<<grid, kSumLanes, 0, stream>>>(src, error, c_out, n_real, n_padded, bits,
                                                        partials);
  check_launch("1-bit signs");
}

void launch_scale(const double* partials, int64_t n_real, double* sumsq, float* scale,
                  cudaStream_t stream) {
  scale_kernel<<<1, 1, 0, stream>>>(partials, sum_blocks(n_real), n_real, sumsq, scale);
  check_launch("1-bit scale");
}

template <bool kStoredC, typename Src>
void launch_error(const Src& src, float* error, int64_t n_real, const float* scale,
                  cudaStream_t stream) {
  if (n_real == 0) return;
  error_kernel<kStoredC><<<grid_for(n_real), kThreads, 0, stream>>>(src, error, n_real, scale);
  check_launch("1-bit error");
}

}  // namespace

int64_t onebit_workspace_doubles(int64_t n_padded) { return sum_blocks(n_padded); }

void onebit_compress_signs(const void* x, DType dtype, const float* error, int64_t n_real,
                           int64_t n_padded, uint8_t* bits, double* sumsq, double* workspace,
                           cudaStream_t stream) {
  check_packed_chunk("1-bit", n_real, n_padded);
  dispatch(dtype, x, [&](const auto& src, auto) {
    launch_signs<false>(src, error, nullptr, n_real, n_padded, bits, workspace, stream);
  });
  launch_scale(workspace, n_real, sumsq, nullptr, stream);
}

void onebit_scale(const double* sumsq, int64_t n_real, float* scale, cudaStream_t stream) {
  scale_of_sumsq_kernel<<<1, 1, 0, stream>>>(sumsq, n_real, scale);
  check_launch("1-bit scale");
}

void onebit_compress_error(const void* x, DType dtype, float* error, int64_t n_real,
                           const float* scale, cudaStream_t stream) {
  dispatch(dtype, x, [&](const auto& src, auto) {
    launch_error<false>(src, error, n_real, scale, stream);
  });
}

void onebit_compress(const void* x, DType dtype, float* error, int64_t n_real, int64_t n_padded,
                     uint8_t* bits, float* scale, double* sumsq, double* workspace,
                     cudaStream_t stream) {
  check_packed_chunk("1-bit", n_real, n_padded);
  dispatch(dtype, x, [&](const auto& src, auto) {
    launch_signs<false>(src, error, nullptr, n_real, n_padded, bits, workspace, stream);
    launch_scale(workspace, n_real, sumsq, scale, stream);
    launch_error<false>(src, error, n_real, scale, stream);
  });
}

void onebit_accumulate(const uint8_t* bits, const float* scale, float* acc, int64_t n_real,
                       cudaStream_t stream) {
  if (n_real == 0) return;
  accumulate_kernel<<<grid_for(n_real), kThreads, 0, stream>>>(bits, scale, acc, n_real);
  check_launch("1-bit accumulate");
}

void onebit_decompress(const uint8_t* bits, const float* scale, void* out, DType dtype,
                       int64_t n_real, cudaStream_t stream) {
  if (n_real == 0) return;
  dispatch(dtype, out, [&](const auto&, auto policy) {
    using Out = decltype(policy);
    decompress_kernel<Out><<<grid_for(n_real), kThreads, 0, stream>>>(
        bits, scale, static_cast<typename Out::T*>(out), n_real);
    check_launch("1-bit decompress");
  });
}

void onebit_compress_error_decompress(void* x, DType dtype, float* error, int64_t n_real,
                                      const float* scale, const uint8_t* result_bits,
                                      const float* result_scale, cudaStream_t stream) {
  if (n_real == 0) return;
  dispatch(dtype, x, [&](const auto& src, auto policy) {
    using Out = decltype(policy);
    error_decompress_kernel<Out><<<grid_for(n_real), kThreads, 0, stream>>>(
        src, error, n_real, scale, result_bits, result_scale, static_cast<typename Out::T*>(x));
    check_launch("1-bit error and decompress");
  });
}

void onebit_server_reduce_compress(const uint8_t* bits, int64_t bits_stride, const float* scales,
                                   int nranks, float* error, int64_t n_real, int64_t n_padded,
                                   uint8_t* out_bits, float* out_scale, double* workspace,
                                   cudaStream_t stream) {
  check_packed_chunk("1-bit", n_real, n_padded);
  if (nranks < 1) throw UsageError("1-bit server step with " + std::to_string(nranks) + " ranks");
  const SrcRankSum src{bits, bits_stride, scales, nranks, OneBitDivide(nranks)};
  launch_signs<true>(src, error, error, n_real, n_padded, out_bits, workspace, stream);
  launch_scale(workspace, n_real, nullptr, out_scale, stream);
  launch_error<true>(SrcF32{error}, error, n_real, out_scale, stream);
}

void onebit_server_compress(const float* acc, int nranks, float* error, int64_t n_real,
                            int64_t n_padded, uint8_t* bits, float* out_scale, double* workspace,
                            cudaStream_t stream) {
  check_packed_chunk("1-bit", n_real, n_padded);
  if (nranks < 1) throw UsageError("1-bit server step with " + std::to_string(nranks) + " ranks");
  const SrcAccDiv src{acc, OneBitDivide(nranks)};
  launch_signs<false>(src, error, nullptr, n_real, n_padded, bits, workspace, stream);
  launch_scale(workspace, n_real, nullptr, out_scale, stream);
  launch_error<false>(src, error, n_real, out_scale, stream);
}

}  // namespace cuda
}  // namespace hvdc
