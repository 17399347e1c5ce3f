// The CUDA device table (hvdc/device.h) of hvd_compress._cuda: the launchers of
// hvdc/cuda/kernels.h on one stream, copies by cudaMemcpyAsync into pinned host buffers, scratch
// from the stream-ordered allocator. Handed to the core's runtime as a capsule when the module is
// loaded (cpp/cuda/module.cc); _core reaches it only through the table's virtual functions.
#pragma once
#include <cuda_runtime_api.h>

#include "hvdc/device.h"

namespace hvdc {
namespace cuda {

class CudaDevice final : public DeviceTable {
 public:
  // Work goes to `stream` (0: the legacy default stream); the face sets the caller's current
  // stream before each call (set_stream).
  explicit CudaDevice(cudaStream_t stream = nullptr);
  void set_stream(cudaStream_t stream) { stream_ = stream; }

  const char* name() const override { return "cuda"; }
  Device device_type() const override { return Device::kCUDA; }
  bool host_memory() const override { return false; }
  void* allocate(size_t bytes) override;
  void release(void* p) override;
  void* allocate_host(size_t bytes) override;
  void release_host(void* p) override;
  void wait() override;

  void onebit_compress_signs(const void* x, DType dtype, const float* error, int64_t n_real,
                             int64_t n_padded, uint8_t* block) override;
  void onebit_server_reduce_compress(const uint8_t* blocks, size_t stride, int nranks, float* error,
                                     int64_t n_real, int64_t n_padded, uint8_t* out_block) override;
  void onebit_compress_error_decompress(void* x, DType dtype, float* error, int64_t n_real,
                                        const uint8_t* worker_block,
                                        const uint8_t* result_block) override;
  int64_t onebit_first_nonfinite(const void* x, DType dtype, const float* error, int64_t n) override;
  void stochastic_quantize(const float* x, float* error, const BirderMoments* moments,
                           int64_t n_real, int64_t n_padded, const UniformSource& u,
                           uint8_t* bits) override;
  void stochastic_server_quantize(const uint8_t* bits, size_t stride, int nranks, float* error,
                                  int64_t n_real, int64_t n_padded, const UniformSource& u,
                                  uint8_t* out_bits) override;
  void sign_unpack(const uint8_t* bits, float* out, int64_t n) override;
  void chunk_mean(const float* chunks, int64_t stride, int nranks, int64_t n, float* out) override;
  int64_t first_nonfinite_f32(const float* x, int64_t n) override;
  void sparse_compensate(const void* x, DType dtype, float* error, float* velocity, float momentum,
                         int64_t n) override;
  int64_t sparse_first_nonfinite(const void* x, DType dtype, const float* error,
                                 const float* velocity, float momentum, int64_t n) override;
  void sparse_select(const float* c, int64_t numel, const SparseSpec& spec, uint32_t* idx,
                     float* vals) override;
  void sparse_sum_pairs(const uint8_t* pairs, int nranks, int64_t k, float* out,
                        int64_t numel) override;
  void sparse_place(const uint32_t* idx, const float* vals, int64_t k, float* out,
                    int64_t numel) override;
  void sparse_finish(const float* out, float divisor, void* buffer, DType dtype, int64_t numel,
                     const uint32_t* idx, int64_t k, float* error, float* velocity) override;
  void adasum_dot_norms(const void* left, const void* right, DType dtype, int64_t n,
                        double* dots) override;
  void adasum_combine(const void* left, double left_coeff, const void* right, double right_coeff,
                      void* out, DType dtype, int64_t n) override;

  void mask_draw(const MaskSpec& spec, const uint32_t* ranks, uint8_t* mask) override;
  int64_t mask_count(const uint8_t* mask, int64_t n) override;
  void mask_gather(const void* src, const uint8_t* mask, int64_t n, int64_t count, size_t elem,
                   void* dst) override;
  void mask_scatter(const void* compact, const uint8_t* mask, int64_t n, int64_t count, size_t elem,
                    void* dst) override;
  int64_t first_nonfinite(const void* x, DType dtype, const float* error, int64_t n) override;

  void block_quant_compress(const float* x, float* error, int64_t count, int64_t valid, int bits,
                            uint8_t* out) override;
  void block_quant_reduce(const uint8_t* chunks, size_t stride, int nranks, int64_t count, int bits,
                          bool average, float* out) override;
  void block_quant_decompress(const uint8_t* in, int64_t count, int bits, float* x) override;

 protected:
  void copy_to_host(void* host, const void* device, size_t bytes) override;
  void copy_to_device(void* device, const void* host, size_t bytes) override;

 private:
  // The cyclic masks' permutation ranks of the last (numel, seed) on the device (cudaMalloc: any
  // stream may read them), copied from the host's once.
  const uint32_t* device_ranks(int64_t numel, uint64_t seed, const uint32_t* host_ranks);

  cudaStream_t stream_;
  HostBufferPool pinned_;  // pinned host staging, reused by size
  uint32_t* ranks_ = nullptr;
  int64_t ranks_numel_ = -1;
  uint64_t ranks_seed_ = 0;
};

}  // namespace cuda
}  // namespace hvdc
