#include "hvdc/staged_device.h"

#include <cstring>
#include <memory>

#include "hvdc/sparse_allreduce.h"
#include "hvdc/stochastic_kernels.h"

namespace hvdc {

StagedDevice::StagedDevice(KernelChoice kernels)
    : cpu_(cpu_device(kernels)),
      host_pool_([](size_t bytes) { return static_cast<void*>(new uint8_t[bytes]); },
                 [](void* p) { delete[] static_cast<uint8_t*>(p); }),
      worker_([this] { work(); }) {}

StagedDevice::~StagedDevice() {
  {
    const std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  worker_.join();
}

void StagedDevice::set_fault(StagedFault kind, int index) {
  const std::lock_guard<std::mutex> lock(mu_);
  fault_ = kind;
  fault_index_ = index;
  fault_seen_ = 0;
  struck_ = 0;
}

int StagedDevice::faults_struck() const {
  const std::lock_guard<std::mutex> lock(mu_);
  return struck_;
}

bool StagedDevice::strikes(StagedFault kind) {
  const std::lock_guard<std::mutex> lock(mu_);
  if (fault_ != kind || fault_seen_++ != fault_index_) return false;
  ++struck_;
  return true;
}

void StagedDevice::enqueue(std::function<void()> job) {
  {
    const std::lock_guard<std::mutex> lock(mu_);
    queue_.push_back(std::move(job));
  }
  cv_.notify_all();
}

void StagedDevice::work() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [&] { return stop_ || (draining_ > 0 && !queue_.empty()); });
    if (queue_.empty()) return;  // stop_ with nothing left
    std::function<void()> job = std::move(queue_.front());
    queue_.pop_front();
    busy_ = true;
    lock.unlock();
    try {
      job();
    } catch (...) {
      lock.lock();
      if (!failed_) failed_ = std::current_exception();
      lock.unlock();
    }
    lock.lock();
    busy_ = false;
    cv_.notify_all();
  }
}

void StagedDevice::wait() {
  if (strikes(StagedFault::kSkipWait)) return;
  drain();
}

void StagedDevice::drain() {
  std::unique_lock<std::mutex> lock(mu_);
  ++draining_;
  cv_.notify_all();
  cv_.wait(lock, [&] { return queue_.empty() && !busy_; });
  --draining_;
  if (failed_) {
    std::exception_ptr e = failed_;
    failed_ = nullptr;
    std::rethrow_exception(e);
  }
}

void* StagedDevice::allocate(size_t bytes) {
  auto* p = new uint8_t[bytes];
  std::memset(p, kPoison, bytes);
  return p;
}

void StagedDevice::release(void* p) {
  // In stream order, like cudaFreeAsync: at once where nothing is queued.
  when_idle([p] { delete[] static_cast<uint8_t*>(p); });
}

void StagedDevice::when_idle(std::function<void()> job) {
  {
    const std::lock_guard<std::mutex> lock(mu_);
    if (!queue_.empty() || busy_) {
      queue_.push_back(std::move(job));
      return;
    }
  }
  job();
}

void* StagedDevice::allocate_host(size_t bytes) {
  void* p = host_pool_.take(bytes);
  std::memset(p, kPoison, bytes);  // a reused buffer starts poisoned too
  return p;
}

void StagedDevice::release_host(void* p) {
  // Back to the pool once the copies queued on it have run (at once where nothing is queued), as
  // the CUDA table waits for its stream before reusing a pinned buffer.
  when_idle([this, p] { host_pool_.give(p); });
}

void StagedDevice::copy_to_host(void* host, const void* device, size_t bytes) {
  std::memset(host, kPoison, bytes);  // what a read before the copy has run sees
  if (strikes(StagedFault::kSkipToHost)) return;
  enqueue([=] { std::memcpy(host, device, bytes); });
}

void StagedDevice::copy_to_device(void* device, const void* host, size_t bytes) {
  if (strikes(StagedFault::kSkipToDevice)) return;
  enqueue([=] { std::memcpy(device, host, bytes); });
}

void StagedDevice::onebit_compress_signs(const void* x, DType dtype, const float* error,
                                         int64_t n_real, int64_t n_padded, uint8_t* block) {
  enqueue([=] { cpu_.onebit_compress_signs(x, dtype, error, n_real, n_padded, block); });
}

void StagedDevice::onebit_server_reduce_compress(const uint8_t* blocks, size_t stride, int nranks,
                                                 float* error, int64_t n_real, int64_t n_padded,
                                                 uint8_t* out_block) {
  enqueue([=] {
    cpu_.onebit_server_reduce_compress(blocks, stride, nranks, error, n_real, n_padded, out_block);
  });
}

void StagedDevice::onebit_compress_error_decompress(void* x, DType dtype, float* error,
                                                    int64_t n_real, const uint8_t* worker_block,
                                                    const uint8_t* result_block) {
  enqueue([=] {
    cpu_.onebit_compress_error_decompress(x, dtype, error, n_real, worker_block, result_block);
  });
}

int64_t StagedDevice::onebit_first_nonfinite(const void* x, DType dtype, const float* error,
                                             int64_t n) {
  // The answer comes back through a copy of its own, as a device's would.
  auto found = std::make_shared<int64_t>(-1);
  enqueue([=] { *found = cpu_.onebit_first_nonfinite(x, dtype, error, n); });
  drain();
  return *found;
}

void StagedDevice::stochastic_quantize(const float* x, float* error, const BirderMoments* moments,
                                       int64_t n_real, int64_t n_padded, const UniformSource& u,
                                       uint8_t* bits) {
  // The moments' constants and pointers as they are at the call, as a launch takes its arguments.
  const bool has_moments = moments != nullptr;
  const BirderMoments mo = has_moments ? *moments : BirderMoments{};
  enqueue([=] {
    cpu_.stochastic_quantize(x, error, has_moments ? &mo : nullptr, n_real, n_padded, u, bits);
  });
}

void StagedDevice::stochastic_server_quantize(const uint8_t* bits, size_t stride, int nranks,
                                              float* error, int64_t n_real, int64_t n_padded,
                                              const UniformSource& u, uint8_t* out_bits) {
  enqueue([=] {
    cpu_.stochastic_server_quantize(bits, stride, nranks, error, n_real, n_padded, u, out_bits);
  });
}

void StagedDevice::sign_unpack(const uint8_t* bits, float* out, int64_t n) {
  enqueue([=] { cpu_.sign_unpack(bits, out, n); });
}

void StagedDevice::chunk_mean(const float* chunks, int64_t stride, int nranks, int64_t n,
                              float* out) {
  enqueue([=] { cpu_.chunk_mean(chunks, stride, nranks, n, out); });
}

int64_t StagedDevice::first_nonfinite_f32(const float* x, int64_t n) {
  auto found = std::make_shared<int64_t>(-1);
  enqueue([=] { *found = cpu_.first_nonfinite_f32(x, n); });
  drain();
  return *found;
}

void StagedDevice::sparse_compensate(const void* x, DType dtype, float* error, float* velocity,
                                     float momentum, int64_t n) {
  enqueue([=] { cpu_.sparse_compensate(x, dtype, error, velocity, momentum, n); });
}

int64_t StagedDevice::sparse_first_nonfinite(const void* x, DType dtype, const float* error,
                                             const float* velocity, float momentum, int64_t n) {
  auto found = std::make_shared<int64_t>(-1);
  enqueue([=] { *found = cpu_.sparse_first_nonfinite(x, dtype, error, velocity, momentum, n); });
  drain();
  return *found;
}

void StagedDevice::sparse_select(const float* c, int64_t numel, const SparseSpec& spec,
                                 uint32_t* idx, float* vals) {
  const SparseSpec copy = spec;
  enqueue([=] { cpu_.sparse_select(c, numel, copy, idx, vals); });
}

void StagedDevice::sparse_sum_pairs(const uint8_t* pairs, int nranks, int64_t k, float* out,
                                    int64_t numel) {
  enqueue([=] { cpu_.sparse_sum_pairs(pairs, nranks, k, out, numel); });
}

void StagedDevice::sparse_place(const uint32_t* idx, const float* vals, int64_t k, float* out,
                                int64_t numel) {
  enqueue([=] { cpu_.sparse_place(idx, vals, k, out, numel); });
}

void StagedDevice::sparse_finish(const float* out, float divisor, void* buffer, DType dtype,
                                 int64_t numel, const uint32_t* idx, int64_t k, float* error,
                                 float* velocity) {
  enqueue([=] {
    cpu_.sparse_finish(out, divisor, buffer, dtype, numel, idx, k, error, velocity);
  });
}

void StagedDevice::adasum_dot_norms(const void* left, const void* right, DType dtype, int64_t n,
                                    double* dots) {
  enqueue([=] { cpu_.adasum_dot_norms(left, right, dtype, n, dots); });
}

void StagedDevice::adasum_combine(const void* left, double left_coeff, const void* right,
                                  double right_coeff, void* out, DType dtype, int64_t n) {
  enqueue([=] { cpu_.adasum_combine(left, left_coeff, right, right_coeff, out, dtype, n); });
}

void StagedDevice::mask_draw(const MaskSpec& spec, const uint32_t* ranks, uint8_t* mask) {
  enqueue([=] { cpu_.mask_draw(spec, ranks, mask); });  // the spec copied: the caller's may go
}

int64_t StagedDevice::mask_count(const uint8_t* mask, int64_t n) {
  // The answer comes back through a copy of its own, as a device's would.
  auto count = std::make_shared<int64_t>(-1);
  enqueue([=] { *count = cpu_.mask_count(mask, n); });
  drain();
  return *count;
}

void StagedDevice::mask_gather(const void* src, const uint8_t* mask, int64_t n, int64_t count,
                               size_t elem, void* dst) {
  enqueue([=] { cpu_.mask_gather(src, mask, n, count, elem, dst); });
}

void StagedDevice::mask_scatter(const void* compact, const uint8_t* mask, int64_t n, int64_t count,
                                size_t elem, void* dst) {
  enqueue([=] { cpu_.mask_scatter(compact, mask, n, count, elem, dst); });
}

int64_t StagedDevice::first_nonfinite(const void* x, DType dtype, const float* error, int64_t n) {
  auto found = std::make_shared<int64_t>(-1);
  enqueue([=] { *found = cpu_.first_nonfinite(x, dtype, error, n); });
  drain();
  return *found;
}

void StagedDevice::block_quant_compress(const float* x, float* error, int64_t count, int64_t valid,
                                        int bits, uint8_t* out) {
  enqueue([=] { cpu_.block_quant_compress(x, error, count, valid, bits, out); });
}

void StagedDevice::block_quant_reduce(const uint8_t* chunks, size_t stride, int nranks,
                                      int64_t count, int bits, bool average, float* out) {
  enqueue([=] { cpu_.block_quant_reduce(chunks, stride, nranks, count, bits, average, out); });
}

void StagedDevice::block_quant_decompress(const uint8_t* in, int64_t count, int bits, float* x) {
  enqueue([=] { cpu_.block_quant_decompress(in, count, bits, x); });
}

}  // namespace hvdc
