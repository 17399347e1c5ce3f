#include "hvdc/compressed_allreduce.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <vector>

#include "hvdc/errors.h"
#include "hvdc/onebit_kernels.h"

namespace hvdc {
namespace {

// Real (unpadded) elements of chunk j of C elements in a buffer of numel.
int64_t real_in_chunk(int64_t numel, int64_t chunk, int j) {
  return std::clamp<int64_t>(numel - j * chunk, 0, chunk);
}

// Block layout on the wire: the float32 scale first, then the bits.
void put_scale(uint8_t* block, float scale) { std::memcpy(block, &scale, sizeof(float)); }
float get_scale(const uint8_t* block) {
  float s;
  std::memcpy(&s, block, sizeof(float));
  return s;
}

std::string describe_value(float v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  // Short (%g), because the message must fit the signature's error field on its way to the peers.
  char out[32];
  std::snprintf(out, sizeof(out), "%.6g", static_cast<double>(v));
  return out;
}

}  // namespace

int64_t onebit_padded_numel(int64_t numel, int world_size) {
  if (numel < 0 || world_size < 1)
    throw UsageError("onebit_padded_numel: numel " + std::to_string(numel) + ", world size " +
                     std::to_string(world_size));
  const int64_t unit = 8 * static_cast<int64_t>(world_size);
  return (numel + unit - 1) / unit * unit;
}

std::string onebit_check_input(const TensorView& buffer, const TensorView& worker_error,
                               const TensorView& server_error, int world_size) {
  const std::string what = "compressed_allreduce: ";
  if (buffer.dtype != DType::kFloat32 && !is_half(buffer.dtype))
    return what + "tensor dtype " + dtype_name(buffer.dtype) +
           " is not supported; use float32, float16 or bfloat16";
  for (const TensorView* t : {&buffer, &worker_error, &server_error})
    if (t->device != Device::kCPU) return what + "tensors must be on the CPU";
  if (worker_error.dtype != DType::kFloat32)
    return what + "worker error must be float32, got " + dtype_name(worker_error.dtype);
  if (server_error.dtype != DType::kFloat32)
    return what + "server error must be float32, got " + dtype_name(server_error.dtype);
  if (worker_error.numel != buffer.numel)
    return what + "worker error has " + std::to_string(worker_error.numel) +
           " elements, expected " + std::to_string(buffer.numel) + " (the tensor's numel)";
  const int64_t server_numel = onebit_padded_numel(buffer.numel, world_size) / world_size;
  if (server_error.numel != server_numel)
    return what + "server error has " + std::to_string(server_error.numel) +
           " elements, expected " + std::to_string(server_numel) + " (padded numel " +
           std::to_string(server_numel * world_size) + " / " + std::to_string(world_size) +
           " ranks)";
  const auto* e = static_cast<const float*>(worker_error.data);
  const int64_t bad = onebit_first_nonfinite(buffer.data, buffer.dtype, e, buffer.numel);
  if (bad >= 0) {
    // The offending value, for the message (the kernel reports only where).
    const auto* half = static_cast<const uint16_t*>(buffer.data);
    const float x = buffer.dtype == DType::kFloat32 ? static_cast<const float*>(buffer.data)[bad]
                    : buffer.dtype == DType::kFloat16 ? half_to_float(half[bad])
                                                      : bf16_to_float(half[bad]);
    return what + "non-finite input: element " + std::to_string(bad) + " is " +
           (std::isfinite(x) ? describe_value(x) + " + worker error " + describe_value(e[bad]) +
                                   " = " + describe_value(x + e[bad])
                             : describe_value(x)) +
           "; state unchanged";
  }
  return "";
}

void compressed_allreduce(Communicator& comm, const TensorView& buffer,
                          const TensorView& worker_error, const TensorView& server_error) {
  const int n = comm.size();
  const int me = comm.rank();
  const std::string why = onebit_check_input(buffer, worker_error, server_error, n);
  if (!why.empty()) throw UsageError(why);
  const int64_t numel = buffer.numel;
  if (numel == 0) return;  // every rank agreed on numel: nobody communicates
  const int64_t chunk = onebit_padded_numel(numel, n) / n;  // C, a multiple of 8
  const size_t block = sizeof(float) + static_cast<size_t>(chunk / 8);
  const size_t esize = dtype_size(buffer.dtype);
  auto* x = static_cast<uint8_t*>(buffer.data);
  auto* werr = static_cast<float*>(worker_error.data);
  auto* serr = static_cast<float*>(server_error.data);

  // Phase 1 (003 Alg. 1 line 7): compress every chunk of the compensated buffer; block j for rank j.
  std::vector<uint8_t> send(block * n), recv(block * n);
  for (int j = 0; j < n; ++j) {
    const int64_t real = real_in_chunk(numel, chunk, j);
    uint8_t* out = send.data() + block * j;
    const float s = onebit_compress(x + j * chunk * esize, buffer.dtype, werr + j * chunk, real,
                                    chunk, out + sizeof(float));
    put_scale(out, s);
  }
  // Gather (line 8): rank j receives every rank's chunk j.
  comm.alltoall(send.data(), recv.data(), block);

  // Average (line 10): this rank serves chunk `me`; sum in rank order, then re-compress.
  const int64_t mine = real_in_chunk(numel, chunk, me);
  std::vector<float> acc(static_cast<size_t>(mine), 0.0f);
  for (int r = 0; r < n; ++r) {
    const uint8_t* in = recv.data() + block * r;
    onebit_accumulate(in + sizeof(float), get_scale(in), acc.data(), mine);
  }
  // `send` is free again: its first block carries this rank's server chunk.
  uint8_t* own = send.data();
  const float s = onebit_server_compress(acc.data(), n, serr, mine, chunk, own + sizeof(float));
  put_scale(own, s);

  // Scatter (line 11): every rank receives every server chunk.
  comm.allgather(own, recv.data(), block);

  // Result (line 13): identical bytes on every rank decompress to identical values.
  for (int j = 0; j < n; ++j) {
    const uint8_t* in = recv.data() + block * j;
    onebit_decompress(in + sizeof(float), get_scale(in), x + j * chunk * esize, buffer.dtype,
                      real_in_chunk(numel, chunk, j));
  }
}

}  // namespace hvdc
