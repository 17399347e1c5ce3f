// Birder's stochastic binary quantizer on the device (see hvdc/cuda/kernels.h and
// hvdc/stochastic_kernels.h): the per-element math of hvdc/elementwise/stochastic.h with the
// uniforms drawn from Philox in the kernel (hvdc/philox.h, the same words as the CPU's bulk fill).
// One thread makes one byte of bits (eight elements), so bytes need no atomics; the eight
// elements span two or three Philox blocks, each computed once.
#include <string>

#include "hvdc/cuda/kernels.h"
#include "hvdc/elementwise/onebit.h"
#include "hvdc/elementwise/stochastic.h"
#include "hvdc/errors.h"
#include "hvdc/packed_chunk.h"
#include "hvdc/philox.h"
#include "launch.cuh"

namespace hvdc {
namespace cuda {
namespace {

// The uniforms of a call, element by element in index order (the cached Philox block serves the
// next elements of the same block).
struct Uniforms {
  PhiloxKey key;
  uint64_t offset;
  const float* injected;
  uint64_t cached = ~uint64_t{0};
  PhiloxBlock block{};

  __device__ float at(int64_t i) {
    if (injected != nullptr) return injected[i];
    const uint64_t index = offset + static_cast<uint64_t>(i);
    if ((index >> 2) != cached) {
      cached = index >> 2;
      block = philox_block(key, cached);
    }
    return philox_word_to_uniform(block.v[index & 3]);
  }
};

struct WorkerPlain {  // y = x + e
  const float* x;
  __device__ float y(int64_t i, const float* error) const { return x[i] + error[i]; }
};
struct WorkerMoments {  // y = m / (b + eps) + e, the moments updated from the gradient x
  const float* x;
  float* m;
  float* b;
  float beta, omb, eps;
  __device__ float y(int64_t i, const float* error) const {
    return birder_moments(x[i], beta, omb, eps, m[i], b[i]) + error[i];
  }
};
struct Server {  // s = (2 ones - n) / n + e over the ranks' bits
  const uint8_t* bits;
  int64_t stride;
  int nranks;
  __device__ float y(int64_t i, const float* error) const {
    int ones = 0;
    for (int r = 0; r < nranks; ++r) ones += bit_of(bits + r * stride, i);
    return birder_server_value(ones, nranks, error[i]);
  }
};

template <typename Value>
__global__ void quantize_kernel(Value value, float* error, int64_t n_real, int64_t n_padded,
                                PhiloxKey key, uint64_t offset, const float* injected,
                                uint8_t* bits) {
  const int64_t nbytes = n_padded / 8;
  for (int64_t byte = grid_first(); byte < nbytes; byte += grid_step()) {
    Uniforms u{key, offset, injected};
    unsigned out = 0;
    for (int j = 0; j < 8; ++j) {
      const int64_t i = 8 * byte + j;
      if (i >= n_real) break;
      if (birder_quantize(value.y(i, error), u.at(i), error[i])) out |= 1u << j;
    }
    bits[byte] = static_cast<uint8_t>(out);
  }
}

__global__ void unpack_kernel(const uint8_t* bits, float* out, int64_t n) {
  for (int64_t i = grid_first(); i < n; i += grid_step())
    out[i] = onebit_pick(bit_of(bits, i), 1.0f, -1.0f);
}

template <typename Value>
void launch(const Value& value, float* error, int64_t n_real, int64_t n_padded,
            const UniformSource& u, uint8_t* bits, cudaStream_t stream) {
  const int64_t nbytes = n_padded / 8;
  if (nbytes == 0) return;
  quantize_kernel<<<grid_for(nbytes), kThreads, 0, stream>>>(value, error, n_real, n_padded, u.key,
                                                             u.offset, u.injected, bits);
  check_launch("stochastic quantize");
}

}  // namespace

void stochastic_quantize(const float* x, float* error, const BirderMoments* moments,
                         int64_t n_real, int64_t n_padded, const UniformSource& u, uint8_t* bits,
                         cudaStream_t stream) {
  check_packed_chunk("stochastic quantization", n_real, n_padded);
  if (moments == nullptr) return launch(WorkerPlain{x}, error, n_real, n_padded, u, bits, stream);
  const WorkerMoments value{x, moments->m, moments->b, moments->beta, moments->one_minus_beta,
                            moments->eps};
  launch(value, error, n_real, n_padded, u, bits, stream);
}

void stochastic_server_quantize(const uint8_t* bits, int64_t bits_stride, int nranks,
                                float* error, int64_t n_real, int64_t n_padded,
                                const UniformSource& u, uint8_t* out_bits, cudaStream_t stream) {
  check_packed_chunk("stochastic quantization", n_real, n_padded);
  if (nranks < 1) throw UsageError("stochastic server step with " + std::to_string(nranks) + " ranks");
  launch(Server{bits, bits_stride, nranks}, error, n_real, n_padded, u, out_bits, stream);
}

void sign_unpack(const uint8_t* bits, float* out, int64_t n, cudaStream_t stream) {
  if (n <= 0) return;
  unpack_kernel<<<grid_for(n), kThreads, 0, stream>>>(bits, out, n);
  check_launch("sign unpack");
}

}  // namespace cuda
}  // namespace hvdc
