// The CPU's device table (hvdc/device.h): the core's kernels, run at once on host memory.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "hvdc/adasum_kernels.h"
#include "hvdc/block_quant_allreduce.h"
#include "hvdc/device.h"
#include "hvdc/elementwise/sparse.h"
#include "hvdc/errors.h"
#include "hvdc/masks.h"
#include "hvdc/onebit_kernels.h"
#include "hvdc/sparse_allreduce.h"
#include "hvdc/stochastic_kernels.h"

namespace hvdc {
namespace {

float scale_at(const uint8_t* block) {
  float s;
  std::memcpy(&s, block, sizeof s);
  return s;
}

class CpuDevice final : public DeviceTable {
 public:
  explicit CpuDevice(KernelChoice kernels) : k_(kernels) {}
  const char* name() const override { return "cpu"; }
  Device device_type() const override { return Device::kCPU; }
  bool host_memory() const override { return true; }
  void* allocate(size_t bytes) override { return new uint8_t[bytes]; }
  void release(void* p) override { delete[] static_cast<uint8_t*>(p); }
  void* allocate_host(size_t bytes) override { return new uint8_t[bytes]; }
  void release_host(void* p) override { delete[] static_cast<uint8_t*>(p); }
  void wait() override {}

  void onebit_compress_signs(const void* x, DType dtype, const float* error, int64_t n_real,
                             int64_t n_padded, uint8_t* block) override {
    const double sumsq =
        hvdc::onebit_compress_signs(x, dtype, error, n_real, n_padded, block + sizeof(float), k_);
    const float s = onebit_scale(sumsq, n_real);
    std::memcpy(block, &s, sizeof s);
  }
  void onebit_server_reduce_compress(const uint8_t* blocks, size_t stride, int nranks, float* error,
                                     int64_t n_real, int64_t n_padded, uint8_t* out_block) override {
    std::vector<const uint8_t*> bits(static_cast<size_t>(nranks));
    std::vector<float> scales(static_cast<size_t>(nranks));
    for (int r = 0; r < nranks; ++r) {
      bits[r] = blocks + stride * r + sizeof(float);
      scales[r] = scale_at(blocks + stride * r);
    }
    const float out = hvdc::onebit_server_reduce_compress(bits.data(), scales.data(), nranks, error, n_real, n_padded,
                                                          out_block + sizeof(float), k_);
    std::memcpy(out_block, &out, sizeof out);
  }
  void onebit_compress_error_decompress(void* x, DType dtype, float* error, int64_t n_real,
                                        const uint8_t* worker_block,
                                        const uint8_t* result_block) override {
    hvdc::onebit_compress_error_decompress(x, dtype, error, n_real, scale_at(worker_block),
                                           result_block + sizeof(float), scale_at(result_block), k_);
  }
  int64_t onebit_first_nonfinite(const void* x, DType dtype, const float* error, int64_t n) override {
    return hvdc::onebit_first_nonfinite(x, dtype, error, n, k_);
  }
  void stochastic_quantize(const float* x, float* error, const BirderMoments* moments,
                           int64_t n_real, int64_t n_padded, const UniformSource& u,
                           uint8_t* bits) override {
    hvdc::stochastic_quantize(x, error, moments, n_real, n_padded, u, bits, k_);
  }
  void stochastic_server_quantize(const uint8_t* bits, size_t stride, int nranks, float* error,
                                  int64_t n_real, int64_t n_padded, const UniformSource& u,
                                  uint8_t* out_bits) override {
    std::vector<const uint8_t*> rows(static_cast<size_t>(nranks));
    for (int r = 0; r < nranks; ++r) rows[r] = bits + stride * r;
    hvdc::stochastic_server_quantize(rows.data(), nranks, error, n_real, n_padded, u, out_bits, k_);
  }
  void sign_unpack(const uint8_t* bits, float* out, int64_t n) override {
    hvdc::sign_unpack(bits, out, n, k_);
  }
  void chunk_mean(const float* chunks, int64_t stride, int nranks, int64_t n, float* out) override {
    const float fm = static_cast<float>(nranks);
    for (int64_t i = 0; i < n; ++i) {
      float acc = chunks[i];
      for (int r = 1; r < nranks; ++r) acc += chunks[r * stride + i];
      out[i] = acc / fm;
    }
  }
  int64_t first_nonfinite_f32(const float* x, int64_t n) override {
    return hvdc::first_nonfinite_f32(x, n);
  }

  void sparse_compensate(const void* x, DType dtype, float* error, float* velocity, float momentum,
                         int64_t n) override {
    for (int64_t i = 0; i < n; ++i)
      error[i] = sparse_compensated(sparse_load(x, dtype, i), error[i], momentum,
                                    velocity ? velocity + i : nullptr);
  }
  int64_t sparse_first_nonfinite(const void* x, DType dtype, const float* error,
                                 const float* velocity, float momentum, int64_t n) override {
    for (int64_t i = 0; i < n; ++i) {
      const float xi = sparse_load(x, dtype, i);
      float u = velocity ? velocity[i] : 0.0f;
      const float c = error ? sparse_compensated(xi, error[i], momentum, velocity ? &u : nullptr) : xi;
      if (!std::isfinite(xi) || !std::isfinite(c)) return i;
    }
    return -1;
  }
  void sparse_select(const float* c, int64_t numel, const SparseSpec& spec, uint32_t* idx,
                     float* vals) override {
    std::vector<uint32_t> picked;
    hvdc::sparse_select(c, numel, spec, picked);
    for (size_t j = 0; j < picked.size(); ++j) {
      idx[j] = picked[j];
      vals[j] = c[picked[j]];
    }
  }
  void sparse_sum_pairs(const uint8_t* pairs, int nranks, int64_t k, float* out,
                        int64_t numel) override {
    std::fill(out, out + numel, 0.0f);
    for (int64_t j = 0; j < nranks * k; ++j) {  // rank order, then index order
      uint32_t index;
      float value;
      std::memcpy(&index, pairs + 8 * j, 4);
      std::memcpy(&value, pairs + 8 * j + 4, 4);
      // The pairs come off the wire: an index past the buffer is a corrupt payload, not a write.
      if (index >= numel)
        throw CommError("sparse allreduce: a received top-k index " + std::to_string(index) +
                        " is past the buffer of " + std::to_string(numel) + " elements");
      out[index] += value;
    }
  }
  void sparse_place(const uint32_t* idx, const float* vals, int64_t k, float* out,
                    int64_t numel) override {
    std::fill(out, out + numel, 0.0f);
    for (int64_t j = 0; j < k; ++j) out[idx[j]] = vals[j];
  }
  void sparse_finish(const float* out, float divisor, void* buffer, DType dtype, int64_t numel,
                     const uint32_t* idx, int64_t k, float* error, float* velocity) override {
    for (int64_t i = 0; i < numel; ++i)
      sparse_store(divisor != 1.0f ? out[i] / divisor : out[i], buffer, dtype, i);
    for (int64_t j = 0; j < k; ++j) error[idx[j]] = 0.0f;
    if (velocity)
      for (int64_t j = 0; j < k; ++j) velocity[idx[j]] = 0.0f;
  }

  void adasum_dot_norms(const void* left, const void* right, DType dtype, int64_t n,
                        double* dots) override {
    const AdasumDots d = hvdc::adasum_dot_norms(left, right, dtype, n);
    dots[0] = d.dot;
    dots[1] = d.left_sq;
    dots[2] = d.right_sq;
  }
  void adasum_combine(const void* left, double left_coeff, const void* right, double right_coeff,
                      void* out, DType dtype, int64_t n) override {
    hvdc::adasum_combine(left, left_coeff, right, right_coeff, out, dtype, n);
  }

  void mask_draw(const MaskSpec& spec, const uint32_t*, uint8_t* mask) override {
    random_mask(spec, mask);
  }
  int64_t mask_count(const uint8_t* mask, int64_t n) override { return hvdc::mask_count(mask, n); }
  void mask_gather(const void* src, const uint8_t* mask, int64_t n, int64_t count, size_t elem,
                   void* dst) override {
    hvdc::mask_gather(src, mask, n, count, elem, dst);
  }
  void mask_scatter(const void* compact, const uint8_t* mask, int64_t n, int64_t count, size_t elem,
                    void* dst) override {
    hvdc::mask_scatter(compact, mask, n, count, elem, dst);
  }
  int64_t first_nonfinite(const void* x, DType dtype, const float* error, int64_t n) override {
    if (error != nullptr) {  // float32 plus the error, as the block-quantized allreduce compensates
      const auto* v = static_cast<const float*>(x);
      for (int64_t i = 0; i < n; ++i)
        if (!std::isfinite(v[i] + error[i])) return i;
      return -1;
    }
    switch (dtype) {
      case DType::kFloat32:
        return first_nonfinite_f32(static_cast<const float*>(x), n);
      case DType::kFloat64: {
        const auto* p = static_cast<const double*>(x);
        for (int64_t i = 0; i < n; ++i)
          if (!std::isfinite(p[i])) return i;
        return -1;
      }
      case DType::kFloat16:
      case DType::kBFloat16: {
        // All exponent bits set: Inf or NaN.
        const uint16_t exp = dtype == DType::kFloat16 ? 0x7c00 : 0x7f80;
        const auto* p = static_cast<const uint16_t*>(x);
        for (int64_t i = 0; i < n; ++i)
          if ((p[i] & exp) == exp) return i;
        return -1;
      }
      default:
        return -1;
    }
  }

  void block_quant_compress(const float* x, float* error, int64_t count, int64_t valid, int bits,
                            uint8_t* out) override {
    hvdc::block_quant_compress(x, error, count, valid, bits, out);
  }
  void block_quant_reduce(const uint8_t* chunks, size_t stride, int nranks, int64_t count, int bits,
                          bool average, float* out) override {
    hvdc::block_quant_reduce(chunks, stride, nranks, count, bits, average, out);
  }
  void block_quant_decompress(const uint8_t* in, int64_t count, int bits, float* x) override {
    hvdc::block_quant_decompress(in, count, bits, x);
  }

 protected:
  // Never called by the collectives (stage_out/stage_in skip them on host memory); plain copies.
  void copy_to_host(void* host, const void* device, size_t bytes) override {
    if (bytes) std::memcpy(host, device, bytes);
  }
  void copy_to_device(void* device, const void* host, size_t bytes) override {
    if (bytes) std::memcpy(device, host, bytes);
  }

 private:
  const KernelChoice k_;
};

}  // namespace

DeviceTable& cpu_device(KernelChoice kernels) {
  // Stateless apart from the (unused) copy counter: one per kernel choice for the process.
  static CpuDevice automatic(KernelChoice::kAuto), scalar(KernelChoice::kScalar);
  return kernels == KernelChoice::kScalar ? scalar : automatic;
}

}  // namespace hvdc
