// The CUDA device table (hvdc/cuda/device_table.h). The wire blocks keep each scale in front of
// its bits at any byte alignment; the kernels want aligned device floats, so scales move between
// the blocks and aligned stream-ordered scratch by cudaMemcpyAsync (4 bytes each).
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

#include "hvdc/cuda/device_table.h"
#include "hvdc/cuda/kernels.h"
#include "hvdc/elementwise/block_quant.h"
#include "hvdc/elementwise/half.h"
#include "hvdc/elementwise/mask.h"
#include "hvdc/elementwise/onebit.h"
#include "hvdc/elementwise/sparse.h"
#include "hvdc/sparse_allreduce.h"
#include "launch.cuh"

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

// ---- thin grid-stride kernels over the per-element functions the CPU kernels share ---------------

// SLAMB's masked allreduce: how many mask bytes are set; the first non-finite element.
__global__ void mask_count_kernel(const uint8_t* mask, int64_t n, unsigned long long* count) {
  unsigned long long c = 0;
  for (int64_t i = grid_first(); i < n; i += grid_step()) c += mask[i] != 0;
  if (c) atomicAdd(count, c);
}

__global__ void first_nonfinite_kernel(const void* x, DType dtype, const float* error, int64_t n,
                                       unsigned long long* first) {
  for (int64_t i = grid_first(); i < n; i += grid_step()) {
    bool bad;
    if (error != nullptr) {
      bad = !isfinite(static_cast<const float*>(x)[i] + error[i]);
    } else if (dtype == DType::kFloat32) {
      bad = !isfinite(static_cast<const float*>(x)[i]);
    } else if (dtype == DType::kFloat64) {
      bad = !isfinite(static_cast<const double*>(x)[i]);
    } else {  // float16 / bfloat16: all exponent bits set
      const uint16_t exp = dtype == DType::kFloat16 ? 0x7c00 : 0x7f80;
      bad = (static_cast<const uint16_t*>(x)[i] & exp) == exp;
    }
    if (bad) atomicMin(first, static_cast<unsigned long long>(i));
  }
}

// The block-quantized allreduce (hvdc/elementwise/block_quant.h): one thread per block of 64 for the
// quantizer (its scale is the block's max), one per element for the sum and the decode.
__global__ void block_quant_compress_kernel(const float* x, float* error, int64_t blocks, int64_t valid,
                                            int bits, uint8_t* out) {
  const int bytes = block_quant_block_bytes(bits);
  for (int64_t b = grid_first(); b < blocks; b += grid_step()) {
    const int64_t first = b * kBlockQuantBlock;
    int64_t in_block = valid - first;
    in_block = in_block < 0 ? 0 : in_block > kBlockQuantBlock ? kBlockQuantBlock : in_block;
    block_quant_compress_block(x + (in_block ? first : 0),
                               error != nullptr && in_block ? error + first : nullptr,
                               static_cast<int>(in_block), bits, out + b * bytes);
  }
}

__global__ void block_quant_reduce_kernel(const uint8_t* chunks, int64_t stride, int nranks, int64_t count,
                                          int bits, bool average, float* out) {
  for (int64_t i = grid_first(); i < count; i += grid_step())
    out[i] = block_quant_reduce_at(chunks, stride, nranks, i, bits, average);
}

__global__ void block_quant_decompress_kernel(const uint8_t* in, int64_t count, int bits, float* x) {
  for (int64_t i = grid_first(); i < count; i += grid_step()) x[i] = block_quant_decode(in, i, bits);
}

// Thin grid-stride kernels of the hierarchical 1-bit and the sparse allreduce over the per-element
// functions the CPU's table calls too (hvdc/elementwise/sparse.h); the sums in rank order per
// element, as the CPU's.

__global__ void chunk_mean_kernel(const float* chunks, int64_t stride, int nranks, int64_t n,
                                  float* out) {
  const float fm = static_cast<float>(nranks);
  for (int64_t i = grid_first(); i < n; i += grid_step()) {
    float acc = chunks[i];
    for (int r = 1; r < nranks; ++r) acc += chunks[r * stride + i];
    out[i] = acc / fm;
  }
}

// *first = the smallest i whose value is not finite (left at its initial all-ones where none is).
__global__ void first_nonfinite_kernel(const float* x, int64_t n, unsigned long long* first) {
  for (int64_t i = grid_first(); i < n; i += grid_step())
    if (!isfinite(x[i])) atomicMin(first, static_cast<unsigned long long>(i));
}

__global__ void sparse_compensate_kernel(const void* x, DType dtype, float* error, float* velocity,
                                         float mu, int64_t n) {
  for (int64_t i = grid_first(); i < n; i += grid_step())
    error[i] = sparse_compensated(sparse_load(x, dtype, i), error[i], mu,
                                  velocity ? velocity + i : nullptr);
}

__global__ void sparse_nonfinite_kernel(const void* x, DType dtype, const float* error,
                                        const float* velocity, float mu, int64_t n,
                                        unsigned long long* first) {
  for (int64_t i = grid_first(); i < n; i += grid_step()) {
    const float xi = sparse_load(x, dtype, i);
    float u = velocity ? velocity[i] : 0.0f;
    const float c = error ? sparse_compensated(xi, error[i], mu, velocity ? &u : nullptr) : xi;
    if (!isfinite(xi) || !isfinite(c)) atomicMin(first, static_cast<unsigned long long>(i));
  }
}

// A segment's selected indices (counted from the segment) made the buffer's, and their values.
__global__ void offset_gather_kernel(uint32_t* idx, int64_t k, uint32_t offset, const float* c,
                                     float* vals) {
  for (int64_t j = grid_first(); j < k; j += grid_step()) {
    idx[j] += offset;
    vals[j] = c[idx[j]];
  }
}

// One rank's k pairs added in: its indices are distinct, so no two threads meet. An index past
// the buffer (a corrupt payload) writes nothing.
__global__ void add_pairs_kernel(const uint32_t* pairs, int64_t k, float* out, int64_t numel) {
  for (int64_t j = grid_first(); j < k; j += grid_step())
    if (pairs[2 * j] < numel) out[pairs[2 * j]] += bits_float(pairs[2 * j + 1]);
}

__global__ void place_kernel(const uint32_t* idx, const float* vals, int64_t k, float* out) {
  for (int64_t j = grid_first(); j < k; j += grid_step()) out[idx[j]] = vals[j];
}

__global__ void store_kernel(const float* out, float divisor, void* buffer, DType dtype,
                             int64_t n) {
  for (int64_t i = grid_first(); i < n; i += grid_step())
    sparse_store(divisor != 1.0f ? out[i] / divisor : out[i], buffer, dtype, i);
}

__global__ void zero_at_kernel(float* a, const uint32_t* idx, int64_t k) {
  for (int64_t j = grid_first(); j < k; j += grid_step()) a[idx[j]] = 0.0f;
}

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

void CudaDevice::stochastic_quantize(const float* x, float* error, const BirderMoments* moments,
                                     int64_t n_real, int64_t n_padded, const UniformSource& u,
                                     uint8_t* bits) {
  cuda::stochastic_quantize(x, error, moments, n_real, n_padded, u, bits, stream_);
}

void CudaDevice::stochastic_server_quantize(const uint8_t* bits, size_t stride, int nranks,
                                            float* error, int64_t n_real, int64_t n_padded,
                                            const UniformSource& u, uint8_t* out_bits) {
  cuda::stochastic_server_quantize(bits, static_cast<int64_t>(stride), nranks, error, n_real,
                                   n_padded, u, out_bits, stream_);
}

void CudaDevice::sign_unpack(const uint8_t* bits, float* out, int64_t n) {
  cuda::sign_unpack(bits, out, n, stream_);
}

void CudaDevice::chunk_mean(const float* chunks, int64_t stride, int nranks, int64_t n,
                            float* out) {
  if (n <= 0) return;
  chunk_mean_kernel<<<grid_for(n), kThreads, 0, stream_>>>(chunks, stride, nranks, n, out);
  check_launch("chunk_mean");
}

namespace {

// The answer of a first-non-finite kernel `launch(first)` on the host (waits for the stream).
template <typename Launch>
int64_t first_on_host(cudaStream_t stream, Launch launch) {
  Scratch s(sizeof(unsigned long long), stream);
  auto* first = s.as<unsigned long long>();
  check(cudaMemsetAsync(first, 0xff, sizeof(unsigned long long), stream), "cudaMemsetAsync");
  launch(first);
  unsigned long long found = 0;
  check(cudaMemcpyAsync(&found, first, sizeof found, cudaMemcpyDeviceToHost, stream),
        "cudaMemcpyAsync");
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  return found == ~0ull ? -1 : static_cast<int64_t>(found);
}

}  // namespace

int64_t CudaDevice::first_nonfinite_f32(const float* x, int64_t n) {
  if (n <= 0) return -1;
  return first_on_host(stream_, [&](unsigned long long* first) {
    first_nonfinite_kernel<<<grid_for(n), kThreads, 0, stream_>>>(x, n, first);
    check_launch("first_nonfinite_f32");
  });
}

void CudaDevice::sparse_compensate(const void* x, DType dtype, float* error, float* velocity,
                                   float momentum, int64_t n) {
  if (n <= 0) return;
  sparse_compensate_kernel<<<grid_for(n), kThreads, 0, stream_>>>(x, dtype, error, velocity,
                                                                   momentum, n);
  check_launch("sparse_compensate");
}

int64_t CudaDevice::sparse_first_nonfinite(const void* x, DType dtype, const float* error,
                                           const float* velocity, float momentum, int64_t n) {
  if (n <= 0) return -1;
  return first_on_host(stream_, [&](unsigned long long* first) {
    sparse_nonfinite_kernel<<<grid_for(n), kThreads, 0, stream_>>>(x, dtype, error, velocity,
                                                                    momentum, n, first);
    check_launch("sparse_first_nonfinite");
  });
}

void CudaDevice::sparse_select(const float* c, int64_t numel, const SparseSpec& spec,
                               uint32_t* idx, float* vals) {
  const std::vector<int64_t> whole{numel};
  int64_t offset = 0, at = 0;
  for (int64_t m : spec.segments.empty() ? whole : spec.segments) {
    const int64_t k = sparse_k(m, spec.ratio);
    if (k > 0) {
      Scratch workspace(static_cast<size_t>(select_workspace_bytes(m)), stream_);
      if (spec.kind == SparseKind::kTopK)
        cuda::topk_select(c + offset, m, k, idx + at, workspace.as<uint8_t>(), stream_);
      else
        cuda::randomk_select(m, k, spec.seed, spec.step, idx + at, static_cast<uint64_t>(offset),
                             workspace.as<uint8_t>(), stream_);
      offset_gather_kernel<<<grid_for(k), kThreads, 0, stream_>>>(
          idx + at, k, static_cast<uint32_t>(offset), c, vals + at);
      check_launch("sparse_select");
    }
    at += k;
    offset += m;
  }
}

void CudaDevice::sparse_sum_pairs(const uint8_t* pairs, int nranks, int64_t k, float* out,
                                  int64_t numel) {
  check(cudaMemsetAsync(out, 0, sizeof(float) * static_cast<size_t>(numel), stream_),
        "cudaMemsetAsync");
  if (k <= 0) return;
  // Rank after rank, as the CPU adds them: one launch per rank, in stream order.
  for (int r = 0; r < nranks; ++r) {
    add_pairs_kernel<<<grid_for(k), kThreads, 0, stream_>>>(
        reinterpret_cast<const uint32_t*>(pairs) + 2 * k * r, k, out, numel);
    check_launch("sparse_sum_pairs");
  }
}

void CudaDevice::sparse_place(const uint32_t* idx, const float* vals, int64_t k, float* out,
                              int64_t numel) {
  check(cudaMemsetAsync(out, 0, sizeof(float) * static_cast<size_t>(numel), stream_),
        "cudaMemsetAsync");
  if (k <= 0) return;
  place_kernel<<<grid_for(k), kThreads, 0, stream_>>>(idx, vals, k, out);
  check_launch("sparse_place");
}

void CudaDevice::sparse_finish(const float* out, float divisor, void* buffer, DType dtype,
                               int64_t numel, const uint32_t* idx, int64_t k, float* error,
                               float* velocity) {
  if (numel > 0) {
    store_kernel<<<grid_for(numel), kThreads, 0, stream_>>>(out, divisor, buffer, dtype, numel);
    check_launch("sparse_finish");
  }
  if (k <= 0) return;
  for (float* a : {error, velocity}) {
    if (!a) continue;
    zero_at_kernel<<<grid_for(k), kThreads, 0, stream_>>>(a, idx, k);
    check_launch("sparse_finish");
  }
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

// ---- SLAMB's masked allreduce ------------------------------------------------------------------

const uint32_t* CudaDevice::device_ranks(int64_t numel, uint64_t seed, const uint32_t* host_ranks) {
  if (ranks_ && ranks_numel_ == numel && ranks_seed_ == seed) return ranks_;
  if (!host_ranks) throw CudaError("cyclic mask: no permutation ranks given");
  if (ranks_) check(cudaFree(ranks_), "cudaFree");
  ranks_ = nullptr;
  ranks_numel_ = -1;
  check(cudaMalloc(&ranks_, sizeof(uint32_t) * static_cast<size_t>(numel)), "cudaMalloc");
  // Counted with the host bytes: once per (numel, seed), not per call.
  to_device(ranks_, host_ranks, sizeof(uint32_t) * static_cast<size_t>(numel));
  ranks_numel_ = numel;
  ranks_seed_ = seed;
  return ranks_;
}

void CudaDevice::mask_draw(const MaskSpec& spec, const uint32_t* ranks, uint8_t* mask) {
  const int64_t n = spec.length >= 0 ? spec.length : spec.numel - spec.first;
  if (n <= 0) return;
  if (spec.kind == MaskKind::kBernoulli) {
    cuda::bernoulli_mask_draw(spec.seed, spec.step, spec.ratio, spec.first, n, mask, stream_);
  } else {
    const CyclicWindow w = cyclic_window(spec.numel, spec.ratio, spec.step);
    if (w.width == 0)
      check(cudaMemsetAsync(mask, 0, static_cast<size_t>(n), stream_), "cudaMemsetAsync");
    else
      cuda::cyclic_mask_compare(device_ranks(spec.numel, spec.seed, ranks) + spec.first, w.base,
                                w.width, n, mask, stream_);
  }
  const int64_t end = spec.first + n;
  for (size_t i = 0; i + 1 < spec.always.size(); i += 2) {  // clipped to the drawn range
    const int64_t lo = spec.always[i] > spec.first ? spec.always[i] : spec.first;
    const int64_t hi = spec.always[i] + spec.always[i + 1] < end ? spec.always[i] + spec.always[i + 1] : end;
    if (lo < hi)
      check(cudaMemsetAsync(mask + (lo - spec.first), 1, static_cast<size_t>(hi - lo), stream_),
            "cudaMemsetAsync");
  }
}

int64_t CudaDevice::mask_count(const uint8_t* mask, int64_t n) {
  if (n <= 0) return 0;
  Scratch s(sizeof(unsigned long long), stream_);
  check(cudaMemsetAsync(s.as<unsigned long long>(), 0, sizeof(unsigned long long), stream_),
        "cudaMemsetAsync");
  mask_count_kernel<<<grid_for(n), kThreads, 0, stream_>>>(mask, n, s.as<unsigned long long>());
  check_launch("mask count");
  unsigned long long count = 0;
  copy_to_host(&count, s.as<unsigned long long>(), sizeof count);  // the answer, not payload
  wait();
  return static_cast<int64_t>(count);
}

void CudaDevice::mask_gather(const void* src, const uint8_t* mask, int64_t n, int64_t count,
                             size_t elem, void* dst) {
  if (n <= 0) return;
  Scratch ws(sizeof(int64_t) * static_cast<size_t>(mask_workspace_int64(n)), stream_);
  cuda::mask_gather(src, mask, n, count, elem, dst, nullptr, ws.as<int64_t>(), stream_);
}

void CudaDevice::mask_scatter(const void* compact, const uint8_t* mask, int64_t n, int64_t count,
                              size_t elem, void* dst) {
  if (n <= 0) return;
  Scratch ws(sizeof(int64_t) * static_cast<size_t>(mask_workspace_int64(n)), stream_);
  cuda::mask_scatter(compact, mask, n, count, elem, dst, nullptr, ws.as<int64_t>(), stream_);
}

int64_t CudaDevice::first_nonfinite(const void* x, DType dtype, const float* error, int64_t n) {
  if (n <= 0) return -1;
  Scratch s(sizeof(unsigned long long), stream_);
  check(cudaMemsetAsync(s.as<unsigned long long>(), 0xff, sizeof(unsigned long long), stream_),
        "cudaMemsetAsync");
  first_nonfinite_kernel<<<grid_for(n), kThreads, 0, stream_>>>(x, dtype, error, n,
                                                                s.as<unsigned long long>());
  check_launch("first non-finite");
  unsigned long long first = 0;
  copy_to_host(&first, s.as<unsigned long long>(), sizeof first);  // the answer, not payload
  wait();
  return first == ~0ull ? -1 : static_cast<int64_t>(first);
}

// ---- the block-quantized allreduce ----------------------------------------------------------------

void CudaDevice::block_quant_compress(const float* x, float* error, int64_t count, int64_t valid,
                                      int bits, uint8_t* out) {
  const int64_t blocks = count / kBlockQuantBlock;
  if (blocks <= 0) return;
  block_quant_compress_kernel<<<grid_for(blocks), kThreads, 0, stream_>>>(x, error, blocks, valid, bits,
                                                                          out);
  check_launch("block-quantized compress");
}

void CudaDevice::block_quant_reduce(const uint8_t* chunks, size_t stride, int nranks, int64_t count,
                                    int bits, bool average, float* out) {
  if (count <= 0) return;
  block_quant_reduce_kernel<<<grid_for(count), kThreads, 0, stream_>>>(
      chunks, static_cast<int64_t>(stride), nranks, count, bits, average, out);
  check_launch("block-quantized reduce");
}

void CudaDevice::block_quant_decompress(const uint8_t* in, int64_t count, int bits, float* x) {
  if (count <= 0) return;
  block_quant_decompress_kernel<<<grid_for(count), kThreads, 0, stream_>>>(in, count, bits, x);
  check_launch("block-quantized decompress");
}

}  // namespace cuda
}  // namespace hvdc
