#include "hvdc/compressed_allreduce.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <memory>
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

namespace {

// The checks that read no data: dtypes, devices, error sizes.
std::string check_layout(const TensorView& buffer, const TensorView& worker_error,
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
  return "";
}

// The message for a non-finite compensated value at element `bad`.
std::string nonfinite_message(const TensorView& buffer, const float* e, int64_t bad) {
  // The offending value, for the message (the kernel reports only where).
  const auto* half = static_cast<const uint16_t*>(buffer.data);
  const float x = buffer.dtype == DType::kFloat32 ? static_cast<const float*>(buffer.data)[bad]
                  : buffer.dtype == DType::kFloat16 ? half_to_float(half[bad])
                                                    : bf16_to_float(half[bad]);
  return "compressed_allreduce: non-finite input: element " + std::to_string(bad) + " is " +
         (std::isfinite(x) ? describe_value(x) + " + worker error " + describe_value(e[bad]) +
                                 " = " + describe_value(x + e[bad])
                           : describe_value(x)) +
         "; state unchanged";
}

}  // namespace

std::string onebit_check_input(const TensorView& buffer, const TensorView& worker_error,
                               const TensorView& server_error, int world_size) {
  const std::string why = check_layout(buffer, worker_error, server_error, world_size);
  if (!why.empty()) return why;
  const auto* e = static_cast<const float*>(worker_error.data);
  const int64_t bad = onebit_first_nonfinite(buffer.data, buffer.dtype, e, buffer.numel);
  return bad >= 0 ? nonfinite_message(buffer, e, bad) : "";
}

std::string onebit_prepare(const TensorView& buffer, const TensorView& worker_error,
                           const TensorView& server_error, int world_size, OneBitCall& call) {
  call.prepared = false;
  const std::string why = check_layout(buffer, worker_error, server_error, world_size);
  if (!why.empty()) return why;
  const int n = world_size;
  const int64_t numel = buffer.numel;
  call.buffer = buffer;
  call.worker_error = worker_error;
  call.server_error = server_error;
  call.world_size = n;
  call.chunk = onebit_padded_numel(numel, n) / n;  // C, a multiple of 8
  call.block = sizeof(float) + static_cast<size_t>(call.chunk / 8);
  call.send.reset();
  if (numel > 0) {
    // Phase 1, pass 1 (003 Alg. 1 line 7): the signs and scale of every compensated chunk; block
    // j for rank j. Reads only: a non-finite value shows as a non-finite sum of squares.
    call.send.reset(new uint8_t[call.block * n]);
    const size_t esize = dtype_size(buffer.dtype);
    const auto* x = static_cast<const uint8_t*>(buffer.data);
    const auto* werr = static_cast<const float*>(worker_error.data);
    for (int j = 0; j < n; ++j) {
      const int64_t real = real_in_chunk(numel, call.chunk, j);
      uint8_t* out = call.send.get() + call.block * j;
      const double sumsq = onebit_compress_signs(x + j * call.chunk * esize, buffer.dtype,
                                                 werr + j * call.chunk, real, call.chunk,
                                                 out + sizeof(float), call.kernels);
      if (!std::isfinite(sumsq)) {  // where exactly: the first non-finite element overall
        call.send.reset();
        const int64_t bad =
            onebit_first_nonfinite(buffer.data, buffer.dtype, werr, numel, call.kernels);
        return nonfinite_message(buffer, werr, bad >= 0 ? bad : j * call.chunk);
      }
      put_scale(out, onebit_scale(sumsq, real));
    }
  }
  call.prepared = true;
  return "";
}

void compressed_allreduce_prepared(Communicator& comm, OneBitCall& call) {
  const int n = comm.size();
  const int me = comm.rank();
  if (!call.prepared || call.world_size != n)
    throw UsageError("compressed_allreduce: call not prepared for a world of " +
                     std::to_string(n) + " ranks");
  call.prepared = false;  // one run per preparation
  const int64_t numel = call.buffer.numel;
  if (numel == 0) return;  // every rank agreed on numel: nobody communicates
  const int64_t chunk = call.chunk;
  const size_t block = call.block;
  const DType dtype = call.buffer.dtype;
  const size_t esize = dtype_size(dtype);
  auto* x = static_cast<uint8_t*>(call.buffer.data);
  auto* werr = static_cast<float*>(call.worker_error.data);
  auto* serr = static_cast<float*>(call.server_error.data);
  uint8_t* send = call.send.get();

  // The worker scale of every chunk, for its error update at the end (the send blocks are reused).
  std::vector<float> wscales(static_cast<size_t>(n));
  for (int j = 0; j < n; ++j) wscales[j] = get_scale(send + block * j);

  // Gather (line 8): rank j receives every rank's chunk j. No zero-filling: every byte of `recv`
  // is written by the collective before it is read.
  std::unique_ptr<uint8_t[]> recv(new uint8_t[block * n]);
  comm.alltoall(send, recv.get(), block);

  // Average (line 10): this rank serves chunk `me`; the sum over ranks in rank order, the average
  // and the re-compression in one kernel (no float32 sum buffer).
  const int64_t mine = real_in_chunk(numel, chunk, me);
  std::vector<const uint8_t*> bits(static_cast<size_t>(n));
  std::vector<float> scales(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r) {
    bits[r] = recv.get() + block * r + sizeof(float);
    scales[r] = get_scale(recv.get() + block * r);
  }
  // `send` is free again: its first block carries this rank's server chunk.
  uint8_t* own = send;
  const float s = onebit_server_reduce_compress(bits.data(), scales.data(), n, serr, mine, chunk,
                                                own + sizeof(float), call.kernels);
  put_scale(own, s);
  // Scatter (line 11): every rank receives every server chunk.
  comm.allgather(own, recv.get(), block);

  // Result (line 13): identical bytes on every rank decompress to identical values. Fused with
  // phase 1's second pass (the worker error of the chunk, line 7), which needs the buffer's input
  // values: one pass over the buffer and the worker error instead of two.
  for (int j = 0; j < n; ++j) {
    const uint8_t* in = recv.get() + block * j;
    onebit_compress_error_decompress(x + j * chunk * esize, dtype, werr + j * chunk,
                                     real_in_chunk(numel, chunk, j), wscales[j],
                                     in + sizeof(float), get_scale(in), call.kernels);
  }
  call.send.reset();
}

void compressed_allreduce(Communicator& comm, const TensorView& buffer,
                          const TensorView& worker_error, const TensorView& server_error,
                          KernelChoice kernels) {
  OneBitCall call;
  call.kernels = kernels;
  const std::string why = onebit_prepare(buffer, worker_error, server_error, comm.size(), call);
  if (!why.empty()) throw UsageError(why);
  compressed_allreduce_prepared(comm, call);
}

}  // namespace hvdc
