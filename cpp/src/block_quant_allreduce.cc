// hvdc/block_quant_allreduce.h: the CPU kernels over hvdc/elementwise/block_quant.h and the collective.
#include "hvdc/block_quant_allreduce.h"
// No contraction: c = x + e and e = c - q * s round as the NumPy reference does (reference/block_quant.py).
#pragma GCC optimize("fp-contract=off")

#include <cmath>
#include <cstring>
#include <vector>

#include "hvdc/elementwise/block_quant.h"

namespace hvdc {

void block_quant_compress(const float* x, float* error, int64_t count, int64_t valid, int bits, uint8_t* out) {
  const int bytes = block_quant_block_bytes(bits);
  float c[kBlockQuantBlock];
  for (int64_t b = 0; b < count / kBlockQuantBlock; ++b) {
    const int64_t first = b * kBlockQuantBlock;
    float amax = 0.0f;
    for (int i = 0; i < kBlockQuantBlock; ++i) {
      const int64_t k = first + i;
      c[i] = k < valid ? (error != nullptr ? x[k] + error[k] : x[k]) : 0.0f;
      const float a = std::fabs(c[i]);
      amax = a > amax ? a : amax;
    }
    const float s = block_quant_scale(amax, bits);
    uint8_t* block = out + b * bytes;
    std::memcpy(block, &s, 4);
    uint8_t* codes = block + 4;
    std::memset(codes, 0, static_cast<size_t>(bytes - 4));
    for (int i = 0; i < kBlockQuantBlock; ++i) {
      const int q = block_quant_code(c[i], s, bits);
      block_quant_put(codes, i, q, bits);
      const int64_t k = first + i;
      if (error != nullptr && k < valid) error[k] = c[i] - block_quant_value(q, s);
    }
  }
}

void block_quant_decompress(const uint8_t* in, int64_t count, int bits, float* x) {
  const int bytes = block_quant_block_bytes(bits);
  for (int64_t b = 0; b < (count + kBlockQuantBlock - 1) / kBlockQuantBlock; ++b) {
    const uint8_t* block = in + b * bytes;
    float s;
    std::memcpy(&s, block, 4);
    for (int i = 0; i < kBlockQuantBlock && b * kBlockQuantBlock + i < count; ++i)
      x[b * kBlockQuantBlock + i] = block_quant_value(block_quant_get(block + 4, i, bits), s);
  }
}

std::string block_quant_check_input(const TensorView& buffer, const TensorView& error, int bits, ReduceOp op) {
  const std::string what = std::string("allreduce(compression=int") + std::to_string(bits) + "): ";
  if (bits != 4 && bits != 8) return "block-quantized allreduce: bits must be 4 or 8, got " + std::to_string(bits);
  if (op != ReduceOp::kAverage && op != ReduceOp::kSum) return what + "op must be Average or Sum";
  if (buffer.dtype != DType::kFloat32) return what + "the buffer must be float32";
  if (buffer.device != Device::kCPU) return what + "the buffer must be on the CPU";
  if (error.data != nullptr && (error.dtype != DType::kFloat32 || error.numel != buffer.numel))
    return what + "the error buffer must be float32 with the buffer's " + std::to_string(buffer.numel) +
           " elements, got " + std::to_string(error.numel);
  const float* x = static_cast<const float*>(buffer.data);
  const float* e = static_cast<const float*>(error.data);
  for (int64_t i = 0; i < buffer.numel; ++i) {
    const float c = e != nullptr ? x[i] + e[i] : x[i];
    if (!std::isfinite(c)) return what + "non-finite input at element " + std::to_string(i);
  }
  return "";
}

void block_quant_allreduce_prepared(Communicator& comm, const TensorView& buffer, const TensorView& error,
                                    int bits, ReduceOp op) {
  const int n = comm.size();
  const int64_t numel = buffer.numel;
  int64_t chunk = (numel + n - 1) / n;
  chunk = (chunk + kBlockQuantBlock - 1) / kBlockQuantBlock * kBlockQuantBlock;
  if (chunk == 0) return;
  const size_t chunk_bytes = static_cast<size_t>(chunk / kBlockQuantBlock * block_quant_block_bytes(bits));
  float* x = static_cast<float*>(buffer.data);
  float* e = static_cast<float*>(error.data);
  std::vector<uint8_t> send(chunk_bytes * n), recv(chunk_bytes * n);
  for (int j = 0; j < n; ++j) {
    const int64_t first = j * chunk;
    const int64_t valid = numel > first ? numel - first : 0;
    block_quant_compress(x + (valid ? first : 0), e != nullptr && valid ? e + first : nullptr, chunk,
                         valid < chunk ? valid : chunk, bits, send.data() + j * chunk_bytes);
  }
  comm.alltoall(send.data(), recv.data(), chunk_bytes);
  std::vector<float> sum(static_cast<size_t>(chunk), 0.0f), part(static_cast<size_t>(chunk));
  for (int r = 0; r < n; ++r) {
    block_quant_decompress(recv.data() + r * chunk_bytes, chunk, bits, part.data());
    for (int64_t i = 0; i < chunk; ++i) sum[i] += part[i];
  }
  if (op == ReduceOp::kAverage && n > 1)
    for (float& v : sum) v /= static_cast<float>(n);
  std::vector<uint8_t> mine(chunk_bytes);
  block_quant_compress(sum.data(), nullptr, chunk, chunk, bits, mine.data());
  comm.allgather(mine.data(), recv.data(), chunk_bytes);
  std::vector<float> out(static_cast<size_t>(chunk));
  for (int j = 0; j < n && j * chunk < numel; ++j) {
    const int64_t count = numel - j * chunk < chunk ? numel - j * chunk : chunk;
    block_quant_decompress(recv.data() + j * chunk_bytes, count, bits, x + j * chunk);
  }
}

}  // namespace hvdc
