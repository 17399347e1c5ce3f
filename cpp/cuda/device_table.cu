// The CUDA device table (hvdc/cuda/device_table.h). The wire blocks keep each scale in front of
// its bits at any byte alignment; the kernels want aligned device floats, so scales move between
// the blocks and aligned stream-ordered scratch by cudaMemcpyAsync (4 bytes each).
#include <memory>
#include <string>
#include <vector>

#include "hvdc/cuda/device_table.h"
#include "hvdc/cuda/kernels.h"
#include "hvdc/elementwise/half.h"
#include "hvdc/elementwise/onebit.h"

namespace hvdc {
namespace cuda {
namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw CudaError(std::string(what) + ": " + cudaGetErrorString(e));
}

// Stream-ordered device scratch for one launch sequence.
class Scratch {
 public:
  Scratch(size_t bytes, cudaStream_t stream) : stream_(stream) {
    if (bytes) check(cudaMallocAsync(&p_, bytes, stream), "cudaMallocAsync");
  }
  ~Scratch() {
    if (p_) cudaFreeAsync(p_, stream_);
  }
  Scratch(const Scratch&) = delete;
  Scratch& operator=(const Scratch&) = delete;
  template <typename T>
  T* as(size_t byte_offset = 0) const {
    return reinterpret_cast<T*>(static_cast<char*>(p_) + byte_offset);
  }

 private:
  void* p_ = nullptr;
  cudaStream_t stream_;
};

// Bytes for `doubles` doubles after a leading 16-byte slot (a float scale or a double sum).
size_t with_slot(int64_t doubles) { return 16 + sizeof(double) * static_cast<size_t>(doubles); }

}  // namespace

void* CudaDevice::allocate(size_t bytes) {
  void* p = nullptr;
  check(cudaMallocAsync(&p, bytes, stream_), "cudaMallocAsync");
  return p;
}

void CudaDevice::release(void* p) { check(cudaFreeAsync(p, stream_), "cudaFreeAsync"); }

CudaDevice::CudaDevice(cudaStream_t stream)
    : stream_(stream),
      pinned_(
          [](size_t bytes) {
            void* p = nullptr;
            check(cudaMallocHost(&p, bytes), "cudaMallocHost");
            return p;
          },
          [](void* p) { cudaFreeHost(p); }) {}

void* CudaDevice::allocate_host(size_t bytes) { return pinned_.take(bytes); }

// Reused only once the stream has passed every copy queued on it. The collectives wait before
// they release, so this wait finds the stream idle; a failed one keeps the buffer out of reuse.
void CudaDevice::release_host(void* p) {
  if (cudaStreamSynchronize(stream_) == cudaSuccess) pinned_.give(p);
}

void CudaDevice::wait() { check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize"); }

void CudaDevice::copy_to_host(void* host, const void* device, size_t bytes) {
  check(cudaMemcpyAsync(host, device, bytes, cudaMemcpyDeviceToHost, stream_), "cudaMemcpyAsync");
}

void CudaDevice::copy_to_device(void* device, const void* host, size_t bytes) {
  check(cudaMemcpyAsync(device, host, bytes, cudaMemcpyHostToDevice, stream_), "cudaMemcpyAsync");
}

void CudaDevice::onebit_compress_signs(const void* x, DType dtype, const float* error,
                                       int64_t n_real, int64_t n_padded, uint8_t* block) {
  // [0, 8): the sum of squares; [8, 12): the scale; then the block partial sums.
  Scratch s(with_slot(onebit_workspace_doubles(n_padded)), stream_);
  cuda::onebit_compress_signs(x, dtype, error, n_real, n_padded, block + sizeof(float),
                              s.as<double>(), s.as<double>(16), stream_);
  cuda::onebit_scale(s.as<double>(), n_real, s.as<float>(8), stream_);
  check(cudaMemcpyAsync(block, s.as<float>(8), sizeof(float), cudaMemcpyDeviceToDevice, stream_),
        "cudaMemcpyAsync");
}

void CudaDevice::onebit_server_reduce_compress(const uint8_t* blocks, size_t stride, int nranks,
                                               float* error, int64_t n_real, int64_t n_padded,
                                               uint8_t* out_block) {
  // [0, 4 * nranks) rounded up to 16: the ranks' scales; then the out scale; then the sums.
  const size_t scales_bytes = (sizeof(float) * static_cast<size_t>(nranks) + 15) / 16 * 16;
  Scratch s(scales_bytes + with_slot(onebit_workspace_doubles(n_padded)), stream_);
  check(cudaMemcpy2DAsync(s.as<float>(), sizeof(float), blocks, stride, sizeof(float),
                          static_cast<size_t>(nranks), cudaMemcpyDeviceToDevice, stream_),
        "cudaMemcpy2DAsync");
  float* out_scale = s.as<float>(scales_bytes);
  cuda::onebit_server_reduce_compress(blocks + sizeof(float), static_cast<int64_t>(stride),
                                      s.as<float>(), nranks, error, n_real, n_padded,
                                      out_block + sizeof(float), out_scale,
                                      s.as<double>(scales_bytes + 16), stream_);
  check(cudaMemcpyAsync(out_block, out_scale, sizeof(float), cudaMemcpyDeviceToDevice, stream_),
        "cudaMemcpyAsync");
}

void CudaDevice::onebit_compress_error_decompress(void* x, DType dtype, float* error,
                                                  int64_t n_real, const uint8_t* worker_block,
                                                  const uint8_t* result_block) {
  Scratch s(2 * sizeof(float), stream_);
  check(cudaMemcpyAsync(s.as<float>(), worker_block, sizeof(float), cudaMemcpyDeviceToDevice,
                        stream_),
        "cudaMemcpyAsync");
  check(cudaMemcpyAsync(s.as<float>(4), result_block, sizeof(float), cudaMemcpyDeviceToDevice,
                        stream_),
        "cudaMemcpyAsync");
  cuda::onebit_compress_error_decompress(x, dtype, error, n_real, s.as<float>(),
                                         result_block + sizeof(float), s.as<float>(4), stream_);
}

// Only after a non-finite scale (a rejected call): the values come to the host and the
// per-element functions of the CPU kernels find the first bad one.
int64_t CudaDevice::onebit_first_nonfinite(const void* x, DType dtype, const float* error,
                                           int64_t n) {
  const size_t esize = dtype_size(dtype);
  std::vector<uint8_t> xs(static_cast<size_t>(n) * esize);
  std::vector<float> es(static_cast<size_t>(n));
  if (n > 0) {
    copy_to_host(xs.data(), x, xs.size());
    copy_to_host(es.data(), error, es.size() * sizeof(float));
  }
  wait();
  for (int64_t i = 0; i < n; ++i) {
    uint16_t h = 0;
    float v = 0.0f;
    if (dtype == DType::kFloat32) {
      std::memcpy(&v, xs.data() + 4 * i, 4);
    } else {
      std::memcpy(&h, xs.data() + 2 * i, 2);
      v = dtype == DType::kFloat16 ? half_to_float(h) : bf16_to_float(h);
    }
    if (!std::isfinite(onebit_compensated(v, es[i]))) return i;
  }
  return -1;
}

void CudaDevice::adasum_dot_norms(const void* left, const void* right, DType dtype, int64_t n,
                                  double* dots) {
  Scratch s(sizeof(double) * static_cast<size_t>(adasum_workspace_doubles(n)), stream_);
  cuda::adasum_dot_norms(left, right, dtype, n, dots, s.as<double>(), stream_);
}

void CudaDevice::adasum_combine(const void* left, double left_coeff, const void* right,
                                double right_coeff, void* out, DType dtype, int64_t n) {
  cuda::adasum_combine(left, left_coeff, right, right_coeff, out, dtype, n, stream_);
}

}  // namespace cuda
}  // namespace hvdc
