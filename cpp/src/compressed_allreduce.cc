#include "hvdc/compressed_allreduce.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <deque>
#include <functional>
#include <memory>
#include <utility>
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
                         const TensorView& server_error, int world_size, const DeviceTable& dev) {
  const std::string what = "compressed_allreduce: ";
  if (buffer.dtype != DType::kFloat32 && !is_half(buffer.dtype))
    return what + "tensor dtype " + dtype_name(buffer.dtype) +
           " is not supported; use float32, float16 or bfloat16";
  for (const TensorView* t : {&buffer, &worker_error, &server_error})
    if (t->device != dev.device_type() || t->device_id != buffer.device_id)
      return what + (dev.device_type() == Device::kCPU ? std::string("tensors must be on the CPU")
                                                       : "tensors must be on one CUDA device");
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

// The message for a non-finite compensated value at element `bad`; the two values it names are
// read through the device's copies.
std::string nonfinite_message(DeviceTable& dev, const TensorView& buffer, const float* e,
                              int64_t bad) {
  const size_t esize = dtype_size(buffer.dtype);
  uint8_t host[2 * sizeof(float)];
  const uint8_t* xv = stage_out(dev, host, static_cast<const uint8_t*>(buffer.data) + bad * esize, esize);
  const uint8_t* ev = stage_out(dev, host + sizeof(float), reinterpret_cast<const uint8_t*>(e + bad),
                                sizeof(float));
  dev.wait();
  uint16_t half;
  float x, err;
  std::memcpy(&err, ev, sizeof err);
  if (buffer.dtype == DType::kFloat32) {
    std::memcpy(&x, xv, sizeof x);
  } else {
    std::memcpy(&half, xv, sizeof half);
    x = buffer.dtype == DType::kFloat16 ? half_to_float(half) : bf16_to_float(half);
  }
  return "compressed_allreduce: non-finite input: element " + std::to_string(bad) + " is " +
         (std::isfinite(x) ? describe_value(x) + " + worker error " + describe_value(err) +
                                 " = " + describe_value(x + err)
                           : describe_value(x)) +
         "; state unchanged";
}

}  // namespace

std::string onebit_check_input(const TensorView& buffer, const TensorView& worker_error,
                               const TensorView& server_error, int world_size) {
  DeviceTable& dev = cpu_device(KernelChoice::kAuto);
  const std::string why = check_layout(buffer, worker_error, server_error, world_size, dev);
  if (!why.empty()) return why;
  const auto* e = static_cast<const float*>(worker_error.data);
  const int64_t bad = dev.onebit_first_nonfinite(buffer.data, buffer.dtype, e, buffer.numel);
  return bad >= 0 ? nonfinite_message(dev, buffer, e, bad) : "";
}

std::string onebit_prepare(const TensorView& buffer, const TensorView& worker_error,
                           const TensorView& server_error, int world_size, OneBitCall& call) {
  call.prepared = false;
  if (!call.device) call.device = &cpu_device(call.kernels);
  DeviceTable& dev = *call.device;
  const std::string why = check_layout(buffer, worker_error, server_error, world_size, dev);
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
  call.host_send.reset();
  call.send_host = nullptr;
  if (numel > 0) {
    // Phase 1, pass 1 (003 Alg. 1 line 7): the signs and scale of every compensated chunk; block
    // j for rank j. Reads only: a non-finite value shows as a non-finite scale.
    const size_t bytes = call.block * n;
    call.send.reset(new DeviceBuffer(dev, bytes));
    const size_t esize = dtype_size(buffer.dtype);
    const auto* x = static_cast<const uint8_t*>(buffer.data);
    const auto* werr = static_cast<const float*>(worker_error.data);
    uint8_t* send = call.send->get();
    for (int j = 0; j < n; ++j)
      dev.onebit_compress_signs(x + j * call.chunk * esize, buffer.dtype, werr + j * call.chunk,
                                real_in_chunk(numel, call.chunk, j), call.chunk,
                                send + call.block * j);
    // The blocks to the host: the gather's payload, and the scales for the finiteness check.
    call.host_send.reset(new HostStaging(dev, dev.host_memory() ? 0 : bytes));
    call.send_host = stage_out(dev, call.host_send->get(), send, bytes);
    dev.wait();
    for (int j = 0; j < n; ++j)
      if (!std::isfinite(get_scale(call.send_host + call.block * j))) {
        // where exactly: the first non-finite element overall
        call.send.reset();
        call.host_send.reset();
        call.send_host = nullptr;
        const int64_t bad = dev.onebit_first_nonfinite(buffer.data, buffer.dtype, werr, numel);
        return nonfinite_message(dev, buffer, werr, bad >= 0 ? bad : j * call.chunk);
      }
  }
  call.prepared = true;
  return "";
}

namespace {

// Work that fills the waits of the pipeline, run in the order it was queued (a later item may
// depend on an earlier one: the decompression of a range after its worker error update).
class Filler {
 public:
  void add(std::function<void()> work) { queue_.push_back(std::move(work)); }
  bool run_one() {
    if (queue_.empty()) return false;
    std::function<void()> work = std::move(queue_.front());
    queue_.pop_front();
    work();
    return true;
  }
  void drain() {
    while (run_one()) {
    }
  }
  // Until `req` completes: a piece of work between tests (each test also moves the transport on),
  // then, with nothing left to do, a plain wait.
  void await(CommRequest& req) {
    while (!req.test())
      if (!run_one()) return req.wait();
  }

 private:
  std::deque<std::function<void()>> queue_;
};

// The pipelined run of a prepared call (the header describes the schedule). Same kernels on the
// same ranges as the unpipelined run, hence the same bits; only their order against the
// transfers differs.
void pipelined(Communicator& comm, OneBitCall& call, int64_t piece) {
  const int n = comm.size();
  const int me = comm.rank();
  const int64_t numel = call.buffer.numel;
  const int64_t chunk = call.chunk;
  const size_t block = call.block;
  const DType dtype = call.buffer.dtype;
  const size_t esize = dtype_size(dtype);
  const KernelChoice kernels = call.kernels;
  auto* x = static_cast<uint8_t*>(call.buffer.data);
  auto* werr = static_cast<float*>(call.worker_error.data);
  auto* serr = static_cast<float*>(call.server_error.data);
  const uint8_t* send = call.send_host;  // host memory: the pipelined run is the CPU's
  // At most kMaxPieces pieces per chunk, so that the 2 * S + 1 tags of a call fit.
  constexpr int64_t kMaxPieces = (Communicator::kMaxTag - 1) / 2;
  const int64_t min_piece = (chunk + kMaxPieces - 1) / kMaxPieces;
  piece = std::max(piece, (min_piece + 31) / 32 * 32);
  const int S = static_cast<int>((chunk + piece - 1) / piece);
  const auto lo_of = [&](int s) { return s * piece; };
  const auto hi_of = [&](int s) { return std::min(chunk, (s + 1) * piece); };
  // Bytes of gather piece s in a block: piece 0 carries the scale in front of its bits.
  const auto gather_lo = [&](int s) { return s == 0 ? 0 : sizeof(float) + lo_of(s) / 8; };
  const auto gather_hi = [&](int s) { return sizeof(float) + hi_of(s) / 8; };
  const int scale_tag = 2 * S;  // tags: gather piece s = s, scatter piece s = S + s

  std::vector<float> wscales(static_cast<size_t>(n));
  for (int j = 0; j < n; ++j) wscales[j] = get_scale(send + block * j);
  // gathered: block r = rank r's [scale][bits] of this rank's chunk (this rank's own block is
  // read in place from `send`); result: block j = server j's [scale][bits], this rank's written
  // by its server step. Every byte read is written first, by a transfer or a kernel.
  std::unique_ptr<uint8_t[]> gathered(new uint8_t[block * n]);
  std::unique_ptr<uint8_t[]> result(new uint8_t[block * n]);
  uint8_t* own = result.get() + block * me;

  // Requests after the buffers: destroyed first. Receives are posted before any send, for the
  // whole call, so that every message finds its receive waiting (no unexpected-message copies).
  const auto at = [&](int s, int r) { return static_cast<size_t>(s) * n + r; };
  std::vector<Request> gather_in(at(S, 0)), scatter_in(at(S, 0)), scale_in(n), out;
  for (int s = 0; s < S; ++s)
    for (int r = 0; r < n; ++r)
      if (r != me) {
        scatter_in[at(s, r)] = comm.irecv(result.get() + block * r + sizeof(float) + lo_of(s) / 8,
                                          (hi_of(s) - lo_of(s)) / 8, r, S + s);
        gather_in[at(s, r)] = comm.irecv(gathered.get() + block * r + gather_lo(s),
                                         gather_hi(s) - gather_lo(s), r, s);
      }
  for (int r = 0; r < n; ++r)
    if (r != me) scale_in[r] = comm.irecv(result.get() + block * r, sizeof(float), r, scale_tag);
  // Gather (line 8), piece-major: every server receives its first pieces first.
  for (int s = 0; s < S; ++s)
    for (int j = 0; j < n; ++j)
      if (j != me)
        out.push_back(comm.isend(send + block * j + gather_lo(s), gather_hi(s) - gather_lo(s), j, s));

  // Phase 1's second pass (line 7, the worker error) needs nothing from the peers: it fills the
  // waits for the gathered pieces.
  Filler filler;
  for (int j = 0; j < n; ++j) {
    const int64_t real = real_in_chunk(numel, chunk, j);
    for (int64_t lo = 0; lo < real; lo += piece) {
      const int64_t len = std::min(piece, real - lo);
      const int64_t off = j * chunk + lo;
      const float wscale = wscales[j];
      filler.add([=] {
        onebit_compress_error(x + off * esize, dtype, werr + off, len, wscale, kernels);
      });
    }
  }

  // Average (line 10) piece by piece as the pieces arrive: pass 1 of the server step (signs and
  // the sum of squares carried across pieces), each piece's bits sent on at once (line 11).
  const int64_t mine = real_in_chunk(numel, chunk, me);
  std::vector<const uint8_t*> bits(static_cast<size_t>(n)), piece_bits(static_cast<size_t>(n));
  std::vector<float> scales(static_cast<size_t>(n));
  for (int r = 0; r < n; ++r)
    bits[r] = (r == me ? send + block * me : gathered.get() + block * r) + sizeof(float);
  OneBitSumSq acc;
  for (int s = 0; s < S; ++s) {
    for (int r = 0; r < n; ++r)
      if (r != me) filler.await(*gather_in[at(s, r)]);
    if (s == 0)
      for (int r = 0; r < n; ++r)
        scales[r] = get_scale(r == me ? send + block * me : gathered.get() + block * r);
    const int64_t lo = lo_of(s), hi = hi_of(s);
    for (int r = 0; r < n; ++r) piece_bits[r] = bits[r] + lo / 8;
    uint8_t* piece_out = own + sizeof(float) + lo / 8;
    onebit_server_reduce_signs(piece_bits.data(), scales.data(), n, serr + lo,
                               std::clamp<int64_t>(mine - lo, 0, hi - lo), hi - lo, piece_out,
                               acc, kernels);
    for (int j = 0; j < n; ++j)
      if (j != me) out.push_back(comm.isend(piece_out, (hi - lo) / 8, j, S + s));
  }
  const float sscale = onebit_scale(onebit_sumsq(acc, kernels), mine);
  put_scale(own, sscale);
  for (int j = 0; j < n; ++j)
    if (j != me) out.push_back(comm.isend(own, sizeof(float), j, scale_tag));

  // While the server chunks travel: the server error (pass 2), the rest of the worker error, and
  // this rank's own chunk of the result (line 13), queued after the worker error of its range.
  for (int64_t lo = 0; lo < mine; lo += piece) {
    const int64_t len = std::min(piece, mine - lo);
    filler.add([=] { onebit_server_error(serr + lo, len, sscale, kernels); });
  }
  for (int64_t lo = 0; lo < mine; lo += piece) {
    const int64_t len = std::min(piece, mine - lo);
    const int64_t off = me * chunk + lo;
    filler.add([=] {
      onebit_decompress(own + sizeof(float) + lo / 8, sscale, x + off * esize, dtype, len,
                        kernels);
    });
  }
  // The other chunks, each once its scale is in (it is sent after the last of its bits), piece
  // by piece as they are in; the queued work (worker error of every range first) is done by then.
  for (int k = 1; k < n; ++k) {
    const int j = (me + k) % n;
    filler.await(*scale_in[j]);
    filler.drain();
    const float rscale = get_scale(result.get() + block * j);
    const int64_t real = real_in_chunk(numel, chunk, j);
    for (int s = 0; s < S; ++s) {
      scatter_in[at(s, j)]->wait();
      const int64_t lo = lo_of(s);
      const int64_t len = std::clamp<int64_t>(real - lo, 0, hi_of(s) - lo);
      if (len > 0)
        onebit_decompress(result.get() + block * j + sizeof(float) + lo / 8, rscale,
                          x + (j * chunk + lo) * esize, dtype, len, kernels);
    }
  }
  filler.drain();
  for (Request& r : out) r->wait();
}

}  // namespace

void compressed_allreduce_prepared(Communicator& comm, OneBitCall& call) {
  const int n = comm.size();
  const int me = comm.rank();
  if (!call.prepared || call.world_size != n)
    throw UsageError("compressed_allreduce: call not prepared for a world of " +
                     std::to_string(n) + " ranks");
  call.prepared = false;  // one run per preparation
  const int64_t numel = call.buffer.numel;
  if (numel == 0) return;  // every rank agreed on numel: nobody communicates
  DeviceTable& dev = *call.device;
  const int64_t piece = call.pipeline.piece / 32 * 32;
  if (n > 1 && piece > 0 && numel >= call.pipeline.min_numel && dev.host_memory() &&
      dev.device_type() == Device::kCPU) {
    pipelined(comm, call, piece);
    call.send.reset();
    call.host_send.reset();
    return;
  }
  const int64_t chunk = call.chunk;
  const size_t block = call.block;
  const size_t bytes = block * n;
  const DType dtype = call.buffer.dtype;
  const size_t esize = dtype_size(dtype);
  auto* x = static_cast<uint8_t*>(call.buffer.data);
  auto* werr = static_cast<float*>(call.worker_error.data);
  auto* serr = static_cast<float*>(call.server_error.data);
  const uint8_t* send = call.send->get();  // device: every chunk's worker scale and bits
  const bool staged = !dev.host_memory();

  // Gather (line 8): rank j receives every rank's chunk j. No zero-filling: every byte of `recv`
  // is written by the collective before it is read.
  HostStaging host_recv(dev, bytes);
  comm.alltoall(call.send_host, host_recv.get(), block);
  DeviceBuffer dev_recv(dev, staged ? bytes : 0);
  const uint8_t* recv = stage_in(dev, dev_recv.get(), host_recv.get(), bytes);

  // Average (line 10): this rank serves chunk `me`; the sum over ranks in rank order, the average
  // and the re-compression in one kernel (no float32 sum buffer).
  DeviceBuffer dev_own(dev, block);
  dev.onebit_server_reduce_compress(recv, block, n, serr, real_in_chunk(numel, chunk, me), chunk,
                                    dev_own.get());
  HostStaging host_own(dev, staged ? block : 0);
  const uint8_t* own = stage_out(dev, host_own.get(), dev_own.get(), block);
  // Also the point after which host_recv (copied to the device above) may be written again.
  dev.wait();
  // Scatter (line 11): every rank receives every server chunk.
  comm.allgather(own, host_recv.get(), block);
  const uint8_t* result = stage_in(dev, dev_recv.get(), host_recv.get(), bytes);

  // Result (line 13): identical bytes on every rank decompress to identical values. Fused with
  // phase 1's second pass (the worker error of the chunk, line 7), which needs the buffer's input
  // values: one pass over the buffer and the worker error instead of two.
  for (int j = 0; j < n; ++j)
    dev.onebit_compress_error_decompress(x + j * chunk * esize, dtype, werr + j * chunk,
                                         real_in_chunk(numel, chunk, j), send + block * j,
                                         result + block * j);
  // Before host_recv goes (its copy to the device must have run) and the caller reads the tensors.
  dev.wait();
  call.send.reset();
  call.host_send.reset();
}

void compressed_allreduce(Communicator& comm, const TensorView& buffer,
                          const TensorView& worker_error, const TensorView& server_error,
                          KernelChoice kernels, OneBitPipeline pipeline, DeviceTable* device) {
  OneBitCall call;
  call.device = device;
  call.kernels = kernels;
  call.pipeline = pipeline;
  const std::string why = onebit_prepare(buffer, worker_error, server_error, comm.size(), call);
  if (!why.empty()) throw UsageError(why);
  compressed_allreduce_prepared(comm, call);
}

}  // namespace hvdc
