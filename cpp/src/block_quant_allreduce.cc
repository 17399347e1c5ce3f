// hvdc/block_quant_allreduce.h: the CPU kernels over hvdc/elementwise/block_quant.h and the collective, written
// against the device table (hvdc/device.h).
#include "hvdc/block_quant_allreduce.h"
// No contraction: c = x + e and e = c - q * s round as the NumPy reference does (reference/block_quant.py).
#pragma GCC optimize("fp-contract=off")

#include <algorithm>
#include <cmath>
#include <cstring>

#include "hvdc/elementwise/block_quant.h"

namespace hvdc {

void block_quant_compress(const float* x, float* error, int64_t count, int64_t valid, int bits, uint8_t* out) {
  const int bytes = block_quant_block_bytes(bits);
  for (int64_t b = 0; b < count / kBlockQuantBlock; ++b) {
    const int64_t first = b * kBlockQuantBlock;
    const int64_t in_block = std::clamp<int64_t>(valid - first, 0, kBlockQuantBlock);
    block_quant_compress_block(x + (in_block ? first : 0), error != nullptr && in_block ? error + first : nullptr,
                               static_cast<int>(in_block), bits, out + b * bytes);
  }
}

void block_quant_decompress(const uint8_t* in, int64_t count, int bits, float* x) {
  for (int64_t i = 0; i < count; ++i) x[i] = block_quant_decode(in, i, bits);
}

void block_quant_reduce(const uint8_t* chunks, size_t stride, int nranks, int64_t count, int bits, bool average,
                        float* out) {
  for (int64_t i = 0; i < count; ++i)
    out[i] = block_quant_reduce_at(chunks, static_cast<int64_t>(stride), nranks, i, bits, average);
}

std::string block_quant_check_input(const TensorView& buffer, const TensorView& error, int bits, ReduceOp op,
                                    DeviceTable* device) {
  DeviceTable& dev = device ? *device : cpu_device(KernelChoice::kAuto);
  const std::string what = std::string("allreduce(compression=int") + std::to_string(bits) + "): ";
  if (bits != 4 && bits != 8) return "block-quantized allreduce: bits must be 4 or 8, got " + std::to_string(bits);
  if (op != ReduceOp::kAverage && op != ReduceOp::kSum) return what + "op must be Average or Sum";
  if (buffer.dtype != DType::kFloat32) return what + "the buffer must be float32";
  if (buffer.device != dev.device_type())
    return what + (dev.device_type() == Device::kCPU ? "the buffer must be on the CPU"
                                                     : "the buffer must be on the device of the table");
  if (error.data != nullptr && (error.dtype != DType::kFloat32 || error.numel != buffer.numel))
    return what + "the error buffer must be float32 with the buffer's " + std::to_string(buffer.numel) +
           " elements, got " + std::to_string(error.numel);
  if (error.data != nullptr && (error.device != buffer.device || error.device_id != buffer.device_id))
    return what + "the error buffer must be on the buffer's device";
  const int64_t bad = dev.first_nonfinite(buffer.data, DType::kFloat32, static_cast<const float*>(error.data),
                                          buffer.numel);
  if (bad >= 0) return what + "non-finite input at element " + std::to_string(bad);
  return "";
}

void block_quant_allreduce_prepared(Communicator& comm, DeviceTable& dev, const TensorView& buffer,
                                    const TensorView& error, int bits, ReduceOp op) {
  const int n = comm.size();
  const int64_t numel = buffer.numel;
  int64_t chunk = (numel + n - 1) / n;
  chunk = (chunk + kBlockQuantBlock - 1) / kBlockQuantBlock * kBlockQuantBlock;
  if (chunk == 0) return;
  const size_t chunk_bytes = static_cast<size_t>(chunk / kBlockQuantBlock * block_quant_block_bytes(bits));
  const size_t bytes = chunk_bytes * n;
  const bool staged = !dev.host_memory();
  float* x = static_cast<float*>(buffer.data);
  float* e = static_cast<float*>(error.data);
  // Compress (the error of every real element updated in the same pass); chunk j's blocks for rank j.
  DeviceBuffer send(dev, bytes);
  for (int j = 0; j < n; ++j) {
    const int64_t first = j * chunk;
    const int64_t valid = numel > first ? numel - first : 0;
    dev.block_quant_compress(x + (valid ? first : 0), e != nullptr && valid ? e + first : nullptr, chunk,
                             valid < chunk ? valid : chunk, bits, send.get() + j * chunk_bytes);
  }
  HostStaging host_send(dev, staged ? bytes : 0);
  const uint8_t* send_host = stage_out(dev, host_send.get(), send.get(), bytes);
  dev.wait();
  // Reduce-scatter: rank j receives every rank's chunk j; every byte of `host_recv` is written before read.
  HostStaging host_recv(dev, bytes);
  comm.alltoall(send_host, host_recv.get(), chunk_bytes);
  DeviceBuffer dev_recv(dev, staged ? bytes : 0);
  const uint8_t* recv = stage_in(dev, dev_recv.get(), host_recv.get(), bytes);
  // The server: the sum in rank order, the average, quantized once.
  DeviceBuffer sum(dev, static_cast<size_t>(chunk) * sizeof(float));
  auto* s = reinterpret_cast<float*>(sum.get());
  dev.block_quant_reduce(recv, chunk_bytes, n, chunk, bits, op == ReduceOp::kAverage, s);
  DeviceBuffer mine(dev, chunk_bytes);
  dev.block_quant_compress(s, nullptr, chunk, chunk, bits, mine.get());
  HostStaging host_mine(dev, staged ? chunk_bytes : 0);
  const uint8_t* mine_host = stage_out(dev, host_mine.get(), mine.get(), chunk_bytes);
  // Also the point after which host_recv (copied to the device above) may be written again.
  dev.wait();
  comm.allgather(mine_host, host_recv.get(), chunk_bytes);
  const uint8_t* result = stage_in(dev, dev_recv.get(), host_recv.get(), bytes);
  for (int j = 0; j < n && j * chunk < numel; ++j) {
    const int64_t count = numel - j * chunk < chunk ? numel - j * chunk : chunk;
    dev.block_quant_decompress(result + j * chunk_bytes, count, bits, x + j * chunk);
  }
  // Before host_recv goes (its copy to the device must have run) and the caller reads the buffer.
  dev.wait();
}

}  // namespace hvdc
