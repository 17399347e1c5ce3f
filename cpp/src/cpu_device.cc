// The CPU's device table (hvdc/device.h): the core's kernels, run at once on host memory.
#include <cmath>
#include <cstring>
#include <vector>

#include "hvdc/adasum_kernels.h"
#include "hvdc/block_quant_allreduce.h"
#include "hvdc/device.h"
#include "hvdc/masks.h"
#include "hvdc/onebit_kernels.h"
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
