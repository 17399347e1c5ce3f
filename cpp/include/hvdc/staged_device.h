// The staged test device (specs/gpu.md, "How it plugs in"): a DeviceTable (hvdc/device.h) that
// runs the CPU kernels on a worker thread standing in for a stream, with copies that really copy,
// so that the orchestration of the GPU path (which copies, which waits, in what order) is tested
// on every CPU machine.
//
// What makes a mistake show as a wrong answer instead of a silent pass, whatever the timing:
//   - the "stream" runs its jobs only while the host waits (wait(), or the device's end): the
//     latest a real stream may run them. A host read of a copy's destination without wait()
//     therefore reads what was there before, and a host buffer rewritten before wait() gives its
//     new bytes to a pending copy;
//   - to_host poisons the host destination at once (0xA5 bytes): a read without wait() reads
//     poison;
//   - device scratch starts poisoned: a kernel reading scratch that no to_device filled reads
//     poison;
//   - a fault switch drops the k-th copy to the host, copy to the device or wait from now on, for
//     the tests that show that one missing copy or wait changes the answer.
// Its memory is host memory (the caller's tensors are CPU tensors standing for device memory), so
// it serves CPU tensors (device_type() kCPU); the collective still reaches it only through the
// table, because host_memory() is false.
//
// Selected in the extension by Runtime::set_test_device("staged") (hvd_compress.ops.runtime's private
// _set_test_device), in the C++ tests by making one.
#pragma once
#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

#include "hvdc/device.h"

namespace hvdc {

enum class StagedFault { kNone, kSkipToHost, kSkipToDevice, kSkipWait };

class StagedDevice final : public DeviceTable {
 public:
  explicit StagedDevice(KernelChoice kernels = KernelChoice::kAuto);
  ~StagedDevice() override;

  // From now on, the `index`-th (0-based) operation of `kind` is dropped (kNone: none is).
  void set_fault(StagedFault kind, int index = 0);
  // How many operations the fault has dropped (1 once it struck).
  int faults_struck() const;
  // Host staging buffers allocated so far (the rest were reused: HostBufferPool).
  uint64_t host_allocations() const { return host_pool_.allocations(); }

  const char* name() const override { return "staged"; }
  Device device_type() const override { return Device::kCPU; }
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

  static constexpr uint8_t kPoison = 0xA5;

 protected:
  void copy_to_host(void* host, const void* device, size_t bytes) override;
  void copy_to_device(void* device, const void* host, size_t bytes) override;

 private:
  void enqueue(std::function<void()> job);
  void when_idle(std::function<void()> job);  // now if nothing is queued, else in stream order
  bool strikes(StagedFault kind);  // whether this operation of `kind` is the one to drop
  void work();
  void drain();  // wait() that no fault drops

  DeviceTable& cpu_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  bool busy_ = false, stop_ = false;
  int draining_ = 0;  // hosts in wait(): the worker runs jobs only then
  std::exception_ptr failed_;  // the first job that threw, rethrown by wait()
  HostBufferPool host_pool_;
  StagedFault fault_ = StagedFault::kNone;
  int fault_index_ = 0, fault_seen_ = 0, struck_ = 0;
  std::thread worker_;  // last: started once everything above is built
};

}  // namespace hvdc
