// Hierarchical-1-bit-All-Reduce (paper 004, Section 4; specs/birder.md section 4): see
// hvdc/hierarchical_allreduce.h for the stages, the layout and the keying of the random draws.
#include "hvdc/hierarchical_allreduce.h"

#include <algorithm>
#include <cstring>
#include <memory>
#include <vector>

#include "hvdc/compressed_allreduce.h"
#include "hvdc/errors.h"

namespace hvdc {
namespace {

struct Shape {
  int m = 1, l = 0, n = 1, j = 0;  // node size, local index, nodes, node index
  int64_t d = 0, dpad = 0, c1 = 0, c2 = 0;
};

Shape shape_of(const HierarchicalGroups& g, int64_t d) {
  Shape s;
  if (g.node != nullptr) {
    s.m = g.node->size();
    s.l = g.node->rank();
  }
  s.n = g.cross->size();
  s.j = g.cross->rank();
  s.d = d;
  s.dpad = hierarchical_padded_numel(d, s.n * s.m);
  s.c1 = s.dpad / s.m;
  s.c2 = s.dpad / (static_cast<int64_t>(s.n) * s.m);
  return s;
}

int64_t clamp_len(int64_t v, int64_t hi) { return std::clamp<int64_t>(v, 0, hi); }

TensorView f32_view(float* data, int64_t numel, const DeviceTable& dev) {
  TensorView v;
  v.data = data;
  v.numel = numel;
  v.dtype = DType::kFloat32;
  v.device = dev.device_type();
  v.shape = {numel};
  return v;
}

std::string expect_f32(const char* what, const TensorView& t, int64_t numel, const std::string& why,
                       const DeviceTable& dev) {
  const std::string pre = std::string("hierarchical_compressed_allreduce: ") + what;
  if (t.dtype != DType::kFloat32) return pre + " must be float32, got " + dtype_name(t.dtype);
  if (t.device != dev.device_type())
    return pre + (dev.device_type() == Device::kCPU ? " must be on the CPU" : " must be on the CUDA device");
  if (t.numel != numel)
    return pre + " has " + std::to_string(t.numel) + " elements, expected " + std::to_string(numel) +
           " (" + why + ")";
  return "";
}

// Real elements of C_r (the padding of the last chunks is never stored in x, never sent).
int64_t chunk_real(const Shape& s, int r) { return clamp_len(s.d - r * s.c1, s.c1); }

// Stage 1 without staging copies: x[C_l] becomes the mean over the node of the C_l chunks,
// float32, summed in local-rank order and divided once (bit-identical to an alltoall followed by
// that sum). The peers' pieces arrive in slices of at most kSlice elements over sendrecv rounds
// (k = 1 .. m-1: to l + k, from l - k), so only (m - 1) slices of scratch are used, the received
// data is summed while it is still in cache, and x[C_l] can take the mean in place (stage 1 never
// sends a rank's own chunk).
constexpr int64_t kSlice = int64_t{1} << 20;  // 4 MiB of float32 per peer (64 MB: 8 rounds)

void node_mean(Communicator& node, const Shape& s, float* x) {
  const int64_t real = chunk_real(s, s.l);
  std::unique_ptr<float[]> scratch(new float[static_cast<size_t>(std::min(kSlice, s.c1)) * (s.m - 1)]);
  std::vector<const float*> in(static_cast<size_t>(s.m));
  float* own = x + s.l * s.c1;
  const float fm = static_cast<float>(s.m);
  for (int64_t at = 0; at < s.c1; at += kSlice) {
    const int64_t len = clamp_len(real - at, kSlice);  // of our chunk in this slice
    for (int k = 1; k < s.m; ++k) {
      const int dst = (s.l + k) % s.m, src = (s.l - k + s.m) % s.m;
      const int64_t sn = clamp_len(chunk_real(s, dst) - at, kSlice);
      float* recv = scratch.get() + static_cast<int64_t>(k - 1) * std::min(kSlice, s.c1);
      node.sendrecv(x + dst * s.c1 + at, sizeof(float) * sn, dst, recv, sizeof(float) * len, src);
      in[src] = recv;
    }
    if (len == 0) continue;
    in[s.l] = own + at;
    float* out = own + at;
    for (int64_t i = 0; i < len; ++i) {
      float acc = in[0][i];
      for (int r = 1; r < s.m; ++r) acc += in[r][i];
      out[i] = acc / fm;
    }
  }
}

// The staged forms of stages 1 and 5, for nodes of more than 2 ranks with a padded buffer: there a
// sendrecv round can pair an empty send with a non-empty receive on one side only, which the
// slicing rounds above cannot express. One alltoall of whole (zero-padded) chunks, then the sum.
void node_mean_staged(Communicator& node, const Shape& s, float* x) {
  std::vector<float> staged(static_cast<size_t>(s.dpad), 0.0f);
  std::memcpy(staged.data(), x, sizeof(float) * s.d);
  std::unique_ptr<float[]> recv(new float[static_cast<size_t>(s.dpad)]);
  node.alltoall(staged.data(), recv.get(), sizeof(float) * s.c1);
  const int64_t real = chunk_real(s, s.l);
  const float fm = static_cast<float>(s.m);
  float* out = x + s.l * s.c1;
  for (int64_t i = 0; i < real; ++i) {
    float acc = recv[i];
    for (int r = 1; r < s.m; ++r) acc += recv[r * s.c1 + i];
    out[i] = acc / fm;
  }
}

void node_allgather_staged(Communicator& node, const Shape& s, float* x) {
  std::vector<float> own(static_cast<size_t>(s.c1), 0.0f);
  std::memcpy(own.data(), x + s.l * s.c1, sizeof(float) * chunk_real(s, s.l));
  std::unique_ptr<float[]> all(new float[static_cast<size_t>(s.dpad)]);
  node.allgather(own.data(), all.get(), sizeof(float) * s.c1);
  std::memcpy(x, all.get(), sizeof(float) * s.d);
}

// Whether the sendrecv rounds pair up: every chunk is whole, or a node is a pair.
bool rounds_pair_up(const Shape& s) { return s.d == s.dpad || s.m == 2; }

// Stage 5 of the scaled payload in place: every rank's x[C_r] from rank r, real elements only.
void node_allgather(Communicator& node, const Shape& s, float* x) {
  for (int k = 1; k < s.m; ++k) {
    const int dst = (s.l + k) % s.m, src = (s.l - k + s.m) % s.m;
    node.sendrecv(x + s.l * s.c1, sizeof(float) * chunk_real(s, s.l), dst, x + src * s.c1,
                  sizeof(float) * chunk_real(s, src), src);
  }
}

// Stages 1 and 5 on a device whose memory the host reaches only through copies: the float32 chunks
// (the node stages' payload) cross to the host, the mean is the device's (chunk_mean: the sum of
// node_mean, in the same order).
void node_mean_device(Communicator& node, const Shape& s, DeviceTable& dev, float* x) {
  const size_t bytes = sizeof(float) * static_cast<size_t>(s.dpad);
  HostStaging send(dev, bytes), recv(dev, bytes);
  dev.to_host(send.get(), x, sizeof(float) * s.d);
  std::memset(send.get() + sizeof(float) * s.d, 0, bytes - sizeof(float) * s.d);  // the padding
  dev.wait();
  node.alltoall(send.get(), recv.get(), sizeof(float) * s.c1);
  DeviceBuffer chunks(dev, bytes);
  dev.to_device(chunks.get(), recv.get(), bytes);
  dev.chunk_mean(reinterpret_cast<const float*>(chunks.get()), s.c1, s.m, chunk_real(s, s.l),
                 x + s.l * s.c1);
  dev.wait();  // before `recv` goes back
}

void node_allgather_device(Communicator& node, const Shape& s, DeviceTable& dev, float* x) {
  const size_t own = sizeof(float) * static_cast<size_t>(s.c1);
  const size_t real = sizeof(float) * static_cast<size_t>(chunk_real(s, s.l));
  HostStaging mine(dev, own), all(dev, own * s.m);
  dev.to_host(mine.get(), x + s.l * s.c1, real);
  std::memset(mine.get() + real, 0, own - real);
  dev.wait();
  node.allgather(mine.get(), all.get(), own);
  dev.to_device(x, all.get(), sizeof(float) * s.d);
  dev.wait();
}

}  // namespace

int64_t hierarchical_padded_numel(int64_t numel, int world_size) {
  if (numel < 0 || world_size < 1)
    throw UsageError("hierarchical_padded_numel: numel " + std::to_string(numel) + ", world size " +
                     std::to_string(world_size));
  const int64_t unit = 8 * static_cast<int64_t>(world_size);
  return (numel + unit - 1) / unit * unit;
}

std::string hierarchical_check(const HierarchicalGroups& g, const HierarchicalCall& call) {
  DeviceTable& dev = call.device ? *call.device : cpu_device(call.kernels);
  const auto expect_f32 = [&dev](const char* what, const TensorView& t, int64_t numel,
                                 const std::string& why) {
    return hvdc::expect_f32(what, t, numel, why, dev);
  };
  const Shape s = shape_of(g, call.buffer.numel);
  const std::string c1 = "padded numel " + std::to_string(s.dpad) + " / " + std::to_string(s.m) +
                         " ranks per node";
  const std::string c2 = "padded numel " + std::to_string(s.dpad) + " / " +
                         std::to_string(s.n * s.m) + " ranks";
  for (const std::string& why :
       {expect_f32("tensor", call.buffer, s.d, "the tensor"),
        expect_f32("worker error", call.worker_error, s.c1, c1),
        expect_f32("server error", call.server_error, s.c2, c2)})
    if (!why.empty()) return why;
  if (call.payload != HierarchicalPayload::kSign && call.payload != HierarchicalPayload::kScaled)
    return "hierarchical_compressed_allreduce: unknown payload " +
           std::to_string(static_cast<int>(call.payload));
  if (call.payload == HierarchicalPayload::kSign) {
    if (call.has_moments)
      for (const std::string& why : {expect_f32("first moment m", call.m, s.c1, c1),
                                     expect_f32("moment b", call.b, s.c1, c1)})
        if (!why.empty()) return why;
    const bool injected = call.worker_uniforms.data != nullptr || call.server_uniforms.data != nullptr;
    if (injected)
      for (const std::string& why :
           {expect_f32("worker uniforms", call.worker_uniforms, s.dpad * s.n,
                       std::to_string(s.n) + " nodes x padded numel " + std::to_string(s.dpad)),
            expect_f32("server uniforms", call.server_uniforms, s.dpad, "the padded numel")})
        if (!why.empty()) return why;
  } else if (call.has_moments) {
    return "hierarchical_compressed_allreduce: moments go with the +/-1 (Birder) payload only";
  }
  const auto* x = static_cast<const float*>(call.buffer.data);
  const int64_t bad = dev.first_nonfinite_f32(x, s.d);
  if (bad < 0) return "";
  float host = 0.0f, value;
  std::memcpy(&value, stage_out(dev, reinterpret_cast<uint8_t*>(&host),
                                reinterpret_cast<const uint8_t*>(x + bad), sizeof(float)),
              sizeof value);
  dev.wait();
  return "hierarchical_compressed_allreduce: non-finite input: element " + std::to_string(bad) +
         " is " + std::to_string(value) + "; state unchanged";
}

void hierarchical_compressed_allreduce(const HierarchicalGroups& g, const HierarchicalCall& call) {
  const Shape s = shape_of(g, call.buffer.numel);
  if (s.d == 0) return;  // every rank agreed on d: nobody communicates
  DeviceTable& dev = call.device ? *call.device : cpu_device(call.kernels);
  const bool host = dev.host_memory();
  Communicator& cross = *g.cross;
  auto* x = static_cast<float*>(call.buffer.data);
  auto* werr = static_cast<float*>(call.worker_error.data);
  auto* serr = static_cast<float*>(call.server_error.data);
  const int64_t real1 = clamp_len(s.d - s.l * s.c1, s.c1);  // real elements of C_l

  // 1. Intra-node reduce-scatter, MEAN, float32 (spec 4.1, B6), into this rank's own chunk of x.
  float* a = x + s.l * s.c1;  // flat (m == 1): the rank's own buffer is its worker's vector
  if (s.m > 1) {
    if (!host)
      node_mean_device(*g.node, s, dev, x);
    else if (rounds_pair_up(s))
      node_mean(*g.node, s, x);
    else
      node_mean_staged(*g.node, s, x);
  }

  if (call.payload == HierarchicalPayload::kScaled) {
    // 2-4. The 1-bit compressed allreduce of paper 003 over the nodes, on the real part of C_l.
    const int64_t server = onebit_padded_numel(real1, s.n) / s.n;
    compressed_allreduce(cross, f32_view(a, real1, dev), f32_view(werr, real1, dev),
                         f32_view(serr, server, dev), call.kernels, call.pipeline, &dev);
    if (s.m > 1) {  // 5. intra-node allgather of the float32 chunks
      if (!host)
        node_allgather_device(*g.node, s, dev, x);
      else if (rounds_pair_up(s))
        node_allgather(*g.node, s, x);
      else
        node_allgather_staged(*g.node, s, x);
    }
    return;
  }

  // 2. Worker (spec 4.2 / Alg. 1 lines 8-9): y = a + e_w, or the ratio of the updated moments.
  const size_t piece = static_cast<size_t>(s.c2 / 8);
  const size_t wbytes = static_cast<size_t>(s.c1 / 8);
  BirderMoments mo;
  if (call.has_moments) {
    mo.m = static_cast<float*>(call.m.data);
    mo.b = static_cast<float*>(call.b.data);
    mo.beta = call.beta;
    mo.one_minus_beta = call.one_minus_beta;
    mo.eps = call.eps;
  }
  const bool injected = call.worker_uniforms.data != nullptr;
  UniformSource uw;
  uw.key = call.key;
  uw.key.stream = static_cast<uint32_t>(s.j);
  uw.offset = static_cast<uint64_t>(s.l * s.c1);
  if (injected)
    uw.injected = static_cast<const float*>(call.worker_uniforms.data) + s.j * s.dpad + s.l * s.c1;
  DeviceBuffer wbits(dev, wbytes);
  dev.stochastic_quantize(a, werr, call.has_moments ? &mo : nullptr, real1, s.c1, uw, wbits.get());
  HostStaging wbits_host(dev, host ? 0 : wbytes);
  const uint8_t* wsend = stage_out(dev, wbits_host.get(), wbits.get(), wbytes);
  dev.wait();

  // 3. Inter-node alltoall among the same-l ranks: piece j' of C_l goes to node j'.
  HostStaging recv_host(dev, piece * s.n);
  cross.alltoall(wsend, recv_host.get(), piece);
  DeviceBuffer recv_dev(dev, host ? 0 : piece * s.n);
  const uint8_t* recv = stage_in(dev, recv_dev.get(), recv_host.get(), piece * s.n);

  // 4. Server (spec 4.4 / Alg. 1 lines 11-12) of S_{l,j}, then the inter-node allgather of u[C_l].
  const int64_t start = s.l * s.c1 + s.j * s.c2;
  const int64_t real2 = clamp_len(s.d - start, s.c2);
  UniformSource us;
  us.key = call.key;
  us.key.stream = kServerStream;
  us.offset = static_cast<uint64_t>(start);
  if (injected) us.injected = static_cast<const float*>(call.server_uniforms.data) + start;
  DeviceBuffer sbits(dev, piece);
  dev.stochastic_server_quantize(recv, piece, s.n, serr, real2, s.c2, us, sbits.get());
  HostStaging sbits_host(dev, host ? 0 : piece);
  const uint8_t* ssend = stage_out(dev, sbits_host.get(), sbits.get(), piece);
  dev.wait();  // also the point after which recv_host (copied to the device above) may go
  HostStaging chunk(dev, wbytes);
  cross.allgather(ssend, chunk.get(), piece);

  // 5. Intra-node allgather of the chunks' bits; the first d decode into the buffer.
  const size_t all_bytes = static_cast<size_t>(s.dpad / 8);
  HostStaging all(dev, s.m > 1 ? all_bytes : 0);
  if (s.m > 1) g.node->allgather(chunk.get(), all.get(), wbytes);
  const uint8_t* bits_host = s.m > 1 ? all.get() : chunk.get();
  const size_t bits_bytes = s.m > 1 ? all_bytes : wbytes;
  DeviceBuffer bits_dev(dev, host ? 0 : bits_bytes);
  dev.sign_unpack(stage_in(dev, bits_dev.get(), bits_host, bits_bytes), x, s.d);
  dev.wait();  // before the host buffers go and the caller reads x
}

HierarchicalOneBitPlan::HierarchicalOneBitPlan(Communicator& world, Communicator& node)
    : node_(node) {
  // Every rank learns every node's size and lowest world rank (its leader's), so that all agree
  // on the node numbering and on whether the nodes are equal.
  int32_t leader = world.rank();
  node.broadcast(&leader, sizeof leader, 0);
  const int32_t mine[2] = {node.size(), leader};
  std::vector<int32_t> all(2 * static_cast<size_t>(world.size()));
  world.allgather(mine, all.data(), sizeof mine);
  std::vector<int32_t> leaders;
  int32_t smallest = node.size(), largest = node.size();
  for (int r = 0; r < world.size(); ++r) {
    smallest = std::min(smallest, all[2 * r]);
    largest = std::max(largest, all[2 * r]);
    leaders.push_back(all[2 * r + 1]);
  }
  std::sort(leaders.begin(), leaders.end());
  leaders.erase(std::unique(leaders.begin(), leaders.end()), leaders.end());
  const int index = static_cast<int>(std::lower_bound(leaders.begin(), leaders.end(), leader) -
                                     leaders.begin());
  if (smallest != largest)
    invalid_ = "hierarchical 1-bit allreduce needs nodes of equal size: a world of " +
               std::to_string(world.size()) + " ranks has nodes of " + std::to_string(smallest) +
               " and of " + std::to_string(largest) +
               " ranks (HVDC_LOCAL_SIZE must divide the world size)";
  cross_ = world.split(node.rank(), index);
}

CommStats HierarchicalOneBitPlan::take_stats() {
  const CommStats s = cross_->stats();
  cross_->stats() = CommStats{};
  return s;
}

}  // namespace hvdc
