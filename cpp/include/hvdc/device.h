// What a device does for the collectives: the one table they call their kernels, their copies to
// and from host memory and their waits through, so that each collective is written once for every
// device (specs/gpu.md, "How it plugs in").
//
// A collective sees two kinds of memory: device memory (the caller's tensors and the table's
// scratch), which it touches only through the table's kernels and copies, and host memory (the
// wire buffers that the communicator reads and writes). Everything the table enqueues runs in
// order on one stream; a host buffer written by to_host may be read only after wait(), and a host
// buffer handed to to_device may be reused only after wait().
//
// Tables:
//   - the CPU's (cpu_device()): the CPU kernels of the core, run at once; its memory is the host's
//     (host_memory()), so the collectives skip every copy and wait (stage_out/stage_in below);
//   - the staged test device (hvdc/staged_device.h): the CPU kernels on a worker thread standing in
//     for a stream, with copies that really copy, so that a missing copy or wait gives a wrong
//     answer on every CPU machine;
//   - the CUDA table of hvd_compress._cuda (cpp/cuda/device_table.cc), registered with the runtime
//     when that module is loaded; _core never links the CUDA runtime.
//
// Scales ride in front of their bits in the wire blocks of hvdc/compressed_allreduce.h, at any
// byte alignment: the kernels read and write them through `block` pointers (the CUDA table moves
// them through aligned scratch itself).
#pragma once
#include <atomic>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <mutex>

#include "hvdc/dtype.h"
#include "hvdc/kernel_isa.h"
#include "hvdc/masks.h"
#include "hvdc/tensor.h"

namespace hvdc {

struct BirderMoments;  // hvdc/stochastic_kernels.h
struct UniformSource;
struct SparseSpec;  // hvdc/sparse_allreduce.h

class DeviceTable {
 public:
  virtual ~DeviceTable() = default;
  DeviceTable() = default;
  DeviceTable(const DeviceTable&) = delete;
  DeviceTable& operator=(const DeviceTable&) = delete;

  // "cpu", "staged", "cuda": for messages and --check-build.
  virtual const char* name() const = 0;
  // The kind of tensor whose memory it works on (the staged test device: CPU tensors).
  virtual Device device_type() const = 0;
  // True where device memory is host memory (the CPU): copies and waits are not needed.
  virtual bool host_memory() const = 0;

  // ---- memory ---------------------------------------------------------------------------------
  // Device scratch; freed in stream order (after the work enqueued before the release).
  virtual void* allocate(size_t bytes) = 0;
  virtual void release(void* p) = 0;
  // Host staging buffers (pinned on CUDA).
  virtual void* allocate_host(size_t bytes) = 0;
  virtual void release_host(void* p) = 0;

  // ---- copies and the stream ------------------------------------------------------------------
  // Enqueued on the stream; counted in host_bytes().
  void to_host(void* host, const void* device, size_t bytes) {
    host_bytes_ += bytes;
    copy_to_host(host, device, bytes);
  }
  void to_device(void* device, const void* host, size_t bytes) {
    host_bytes_ += bytes;
    copy_to_device(device, host, bytes);
  }
  // Until everything enqueued so far has run.
  virtual void wait() = 0;
  // Bytes copied between host and device since this table was made.
  uint64_t host_bytes() const { return host_bytes_; }

  // ---- kernels of the 1-bit allreduce (hvdc/onebit_kernels.h; formats and bits as there) ------
  // Phase 1's first pass: the bits of c = x + error into block + 4 and the chunk's scale
  // (onebit_scale of the sum of squares: non-finite iff some c is) into block[0, 4).
  virtual void onebit_compress_signs(const void* x, DType dtype, const float* error, int64_t n_real,
                                     int64_t n_padded, uint8_t* block) = 0;
  // The server step over `nranks` blocks `stride` bytes apart (rank order), its result block
  // (scale, bits) into `out_block`: onebit_server_reduce_compress.
  virtual void onebit_server_reduce_compress(const uint8_t* blocks, size_t stride, int nranks,
                                             float* error, int64_t n_real, int64_t n_padded,
                                             uint8_t* out_block) = 0;
  // onebit_compress_error_decompress with the worker scale in front of `worker_block` and the
  // result's scale and bits in `result_block`.
  virtual void onebit_compress_error_decompress(void* x, DType dtype, float* error, int64_t n_real,
                                                const uint8_t* worker_block,
                                                const uint8_t* result_block) = 0;
  // onebit_first_nonfinite, its answer on the host (waits for the stream).
  virtual int64_t onebit_first_nonfinite(const void* x, DType dtype, const float* error,
                                         int64_t n) = 0;

  // ---- kernels of the hierarchical 1-bit allreduce (hvdc/stochastic_kernels.h) ------------------
  // stochastic_quantize; `moments` (if not null) is read at the call, its m and b and u.injected
  // are device memory.
  virtual void stochastic_quantize(const float* x, float* error, const BirderMoments* moments,
                                   int64_t n_real, int64_t n_padded, const UniformSource& u,
                                   uint8_t* bits) = 0;
  // stochastic_server_quantize over `nranks` bit strings `stride` bytes apart (rank order).
  virtual void stochastic_server_quantize(const uint8_t* bits, size_t stride, int nranks,
                                          float* error, int64_t n_real, int64_t n_padded,
                                          const UniformSource& u, uint8_t* out_bits) = 0;
  virtual void sign_unpack(const uint8_t* bits, float* out, int64_t n) = 0;
  // Stage 1's node mean: out[i] = float32 sum over r of chunks[r * stride + i] in rank order,
  // divided once by nranks, for i < n.
  virtual void chunk_mean(const float* chunks, int64_t stride, int nranks, int64_t n,
                          float* out) = 0;
  // first_nonfinite_f32, its answer on the host (waits for the stream).
  virtual int64_t first_nonfinite_f32(const float* x, int64_t n) = 0;

  // ---- kernels of the sparse allreduce (hvdc/sparse_allreduce.h, hvdc/elementwise/sparse.h) ---
  // error = c, the compensated value of every element (sparse_compensate; velocity null: no
  // momentum correction, else updated in place).
  virtual void sparse_compensate(const void* x, DType dtype, float* error, float* velocity,
                                 float momentum, int64_t n) = 0;
  // The first element whose compensated value (as sparse_compensate would make it; error and
  // velocity may be null) is not finite, or -1; its answer on the host (waits for the stream).
  virtual int64_t sparse_first_nonfinite(const void* x, DType dtype, const float* error,
                                         const float* velocity, float momentum, int64_t n) = 0;
  // sparse_select of c into idx (sparse_total_k(numel, spec) of them) and vals[j] = c[idx[j]].
  virtual void sparse_select(const float* c, int64_t numel, const SparseSpec& spec, uint32_t* idx,
                             float* vals) = 0;
  // out = 0, then every one of `nranks` * k top-k pairs (8 bytes: uint32 index, float32 value)
  // added in, rank after rank.
  virtual void sparse_sum_pairs(const uint8_t* pairs, int nranks, int64_t k, float* out,
                                int64_t numel) = 0;
  // out = 0, then out[idx[j]] = vals[j].
  virtual void sparse_place(const uint32_t* idx, const float* vals, int64_t k, float* out,
                            int64_t numel) = 0;
  // buffer = dtype(out / divisor) (no division where divisor is 1); error and, if not null,
  // velocity = 0 at the k sent elements idx.
  virtual void sparse_finish(const float* out, float divisor, void* buffer, DType dtype,
                             int64_t numel, const uint32_t* idx, int64_t k, float* error,
                             float* velocity) = 0;

  // ---- kernels of Adasum (hvdc/adasum_kernels.h) -----------------------------------------------
  // dots[0..2] (device memory) = <left, right>, |left|^2, |right|^2 (the CUDA table sums in the
  // block order of block_sum.h: the last bits may differ from the CPU's).
  virtual void adasum_dot_norms(const void* left, const void* right, DType dtype, int64_t n,
                                double* dots) = 0;
  virtual void adasum_combine(const void* left, double left_coeff, const void* right,
                              double right_coeff, void* out, DType dtype, int64_t n) = 0;

  // ---- kernels of SLAMB's masked allreduce (hvdc/masks.h, hvdc/masked_allreduce.h) ------------
  // Elements [spec.first, spec.first + spec.length) of the mask of `spec` (valid: check_mask_spec)
  // into `mask` (spec.length bytes, 0/1), its `always` ranges selected, as random_mask. `ranks`: for
  // a cyclic spec, the host's cyclic_ranks(spec.numel, spec.seed) (a device keeps its own copy, made
  // once per (numel, seed)); the CPU kernels read their own cache and ignore it.
  virtual void mask_draw(const MaskSpec& spec, const uint32_t* ranks, uint8_t* mask) = 0;
  // mask_count, its answer on the host (waits for the stream).
  virtual int64_t mask_count(const uint8_t* mask, int64_t n) = 0;
  // mask_gather / mask_scatter (`count`: the mask's, from mask_count; `elem` 2, 4 or 8 bytes).
  virtual void mask_gather(const void* src, const uint8_t* mask, int64_t n, int64_t count,
                           size_t elem, void* dst) = 0;
  virtual void mask_scatter(const void* compact, const uint8_t* mask, int64_t n, int64_t count,
                            size_t elem, void* dst) = 0;
  // The first i in [0, n) whose x[i] (float16, bfloat16, float32, float64), plus error[i] where
  // `error` is given (float32 x only), is NaN or Inf, else -1; the answer on the host (waits).
  virtual int64_t first_nonfinite(const void* x, DType dtype, const float* error, int64_t n) = 0;

  // ---- kernels of the block-quantized allreduce (hvdc/block_quant_allreduce.h) ----------------
  // The CPU kernels of that header, same arguments: quantize with error feedback, the server's sum
  // of `nranks` received chunks (rank order, float32), decode.
  virtual void block_quant_compress(const float* x, float* error, int64_t count, int64_t valid,
                                    int bits, uint8_t* out) = 0;
  virtual void block_quant_reduce(const uint8_t* chunks, size_t stride, int nranks, int64_t count,
                                  int bits, bool average, float* out) = 0;
  virtual void block_quant_decompress(const uint8_t* in, int64_t count, int bits, float* x) = 0;

 protected:
  virtual void copy_to_host(void* host, const void* device, size_t bytes) = 0;
  virtual void copy_to_device(void* device, const void* host, size_t bytes) = 0;

 private:
  std::atomic<uint64_t> host_bytes_{0};
};

// The CPU's table, running the portable or vectorized kernels as `kernels` says.
DeviceTable& cpu_device(KernelChoice kernels);

// Host staging buffers kept for reuse by size, for the tables whose host buffers are costly to
// allocate (pinned memory): a collective asks for the same sizes at every step (one set per
// bucket), so from the second step on no buffer is allocated. Thread-safe; at most kKept buffers
// wait for reuse (the oldest size's go first).
class HostBufferPool {
 public:
  HostBufferPool(std::function<void*(size_t)> allocate, std::function<void(void*)> release)
      : allocate_(std::move(allocate)), release_(std::move(release)) {}
  ~HostBufferPool() {
    for (auto& kept : free_) release_(kept.second);
  }
  HostBufferPool(const HostBufferPool&) = delete;
  HostBufferPool& operator=(const HostBufferPool&) = delete;

  // A kept buffer of exactly `bytes`, else a new one.
  void* take(size_t bytes) {
    {
      const std::lock_guard<std::mutex> lock(mu_);
      auto it = free_.find(bytes);
      if (it != free_.end()) {
        void* p = it->second;
        free_.erase(it);
        return p;
      }
      ++allocations_;
    }
    void* p = allocate_(bytes);
    const std::lock_guard<std::mutex> lock(mu_);
    size_of_[p] = bytes;
    return p;
  }
  // `p` (from take) back for reuse; no copy may be pending on it.
  void give(void* p) {
    void* drop = nullptr;
    {
      const std::lock_guard<std::mutex> lock(mu_);
      free_.emplace(size_of_.at(p), p);
      if (free_.size() > kKept) {
        drop = free_.begin()->second;
        size_of_.erase(drop);
        free_.erase(free_.begin());
      }
    }
    if (drop) release_(drop);
  }
  // Buffers allocated so far (not reused).
  uint64_t allocations() const {
    const std::lock_guard<std::mutex> lock(mu_);
    return allocations_;
  }

 private:
  static constexpr size_t kKept = 64;
  const std::function<void*(size_t)> allocate_;
  const std::function<void(void*)> release_;
  mutable std::mutex mu_;
  std::multimap<size_t, void*> free_;  // by size
  std::map<void*, size_t> size_of_;    // every buffer taken and not released
  uint64_t allocations_ = 0;
};

// Memory of a device table owned for one scope: device scratch (released in stream order) or, with
// kHost, a host staging buffer. None for 0 bytes (what a collective asks for where stage_out needs
// none).
template <bool kHost>
class TableMemory {
 public:
  TableMemory(DeviceTable& dev, size_t bytes) : dev_(dev), p_(nullptr) {
    if (bytes) p_ = static_cast<uint8_t*>(kHost ? dev.allocate_host(bytes) : dev.allocate(bytes));
  }
  ~TableMemory() {
    if (!p_) return;
    if (kHost)
      dev_.release_host(p_);
    else
      dev_.release(p_);
  }
  TableMemory(const TableMemory&) = delete;
  TableMemory& operator=(const TableMemory&) = delete;
  uint8_t* get() const { return p_; }

 private:
  DeviceTable& dev_;
  uint8_t* p_;
};
using DeviceBuffer = TableMemory<false>;
using HostStaging = TableMemory<true>;

// Where the host reads `bytes` of device memory at `device`: the device memory itself on a
// host-memory device, else `host` once the copy enqueued here has run (the caller waits).
inline const uint8_t* stage_out(DeviceTable& dev, uint8_t* host, const uint8_t* device, size_t bytes) {
  if (dev.host_memory()) return device;
  dev.to_host(host, device, bytes);
  return host;
}

// The device memory holding what the host wrote at `host`: `host` itself on a host-memory device,
// else `device` once the copy enqueued here has run (stream order: later kernels see it).
inline const uint8_t* stage_in(DeviceTable& dev, uint8_t* device, const uint8_t* host, size_t bytes) {
  if (dev.host_memory()) return host;
  dev.to_device(device, host, bytes);
  return device;
}

// A device buffer's bytes on the host, for a collective whose whole input and output are the
// payload (dense allreduce, broadcast): copied out and waited for at construction (where `copy_in`),
// copied back and waited for by write_back(). On a host-memory device: the buffer itself, no copy.
class HostCopy {
 public:
  HostCopy(DeviceTable& dev, void* device, size_t bytes, bool copy_in = true)
      : dev_(dev), device_(static_cast<uint8_t*>(device)), bytes_(bytes),
        staging_(dev, dev.host_memory() ? 0 : bytes) {
    if (dev.host_memory() || !bytes || !copy_in) return;
    dev.to_host(staging_.get(), device_, bytes);
    dev.wait();
  }
  uint8_t* get() const { return dev_.host_memory() ? device_ : staging_.get(); }
  void write_back() {
    if (dev_.host_memory() || !bytes_) return;
    dev_.to_device(device_, staging_.get(), bytes_);
    dev_.wait();
  }

 private:
  DeviceTable& dev_;
  uint8_t* device_;
  size_t bytes_;
  HostStaging staging_;
};

}  // namespace hvdc
