#include "hvdc/masked_allreduce.h"

#include <cstdio>
#include <cstring>
#include <memory>

#include "hvdc/dense_allreduce.h"
#include "hvdc/masks.h"

namespace hvdc {

void masked_draw(DeviceTable& dev, const MaskSpec& spec, uint8_t* mask) {
  std::shared_ptr<const std::vector<uint32_t>> ranks;
  if (spec.kind == MaskKind::kCyclic && !dev.host_memory()) ranks = cyclic_ranks(spec.numel, spec.seed);
  dev.mask_draw(spec, ranks ? ranks->data() : nullptr, mask);
}

void masked_average(Communicator& comm, DeviceTable& dev, const TensorView& t, const uint8_t* mask,
                    std::vector<unsigned char>& scratch) {
  const size_t elem = dtype_size(t.dtype);
  const int64_t count = dev.mask_count(mask, t.numel);
  const size_t bytes = static_cast<size_t>(count) * elem;
  // The dense buffer: on the device (only it crosses to the host, in dense_allreduce's staging), or the
  // reused scratch where the device's memory is the host's.
  DeviceBuffer on_device(dev, dev.host_memory() ? 0 : bytes);
  if (dev.host_memory() && scratch.size() < bytes) scratch.resize(bytes);
  void* compact = dev.host_memory() ? static_cast<void*>(scratch.data()) : on_device.get();
  dev.mask_gather(t.data, mask, t.numel, count, elem, compact);
  TensorView dense = t;
  dense.data = compact;
  dense.numel = count;
  dense.shape = {count};
  // Even an empty selection joins the exchange shape-wise (dense_allreduce returns at once on 0
  // elements on every rank alike, since the mask, hence the count, is the same on every rank).
  dense_allreduce(comm, dev, dense, ReduceOp::kAverage);
  dev.mask_scatter(compact, mask, t.numel, count, elem, t.data);
  dev.wait();  // before the caller reads t
}

CallSignature masked_signature(const TensorView& t, const MaskSpec& spec, const std::string& name,
                               Collective collective) {
  CallSignature sig = signature_of(collective, t, static_cast<int>(spec.kind), name);
  // The mask's arguments: hashed into the shape (compared) and written after the dims (shown), so a
  // rank with another ratio, seed or step is named in the MismatchError.
  char ratio[32];
  std::snprintf(ratio, sizeof(ratio), "%g", spec.ratio);
  // A range of a larger mask (a bucket) also shows and hashes where it lies in the index space.
  const bool range = spec.first != 0 || spec.numel != t.numel;
  const std::string text = std::string(sig.shape) + " k=" + ratio + " seed=" +
                           std::to_string(spec.seed) + " t=" + std::to_string(spec.step) +
                           (range ? " at=" + std::to_string(spec.first) + "/" + std::to_string(spec.numel)
                                  : std::string());
  std::snprintf(sig.shape, sizeof(sig.shape), "%s", text.c_str());
  sig.shape_hash = fnv1a(&spec.ratio, sizeof(spec.ratio), sig.shape_hash);
  sig.shape_hash = fnv1a(&spec.seed, sizeof(spec.seed), sig.shape_hash);
  sig.shape_hash = fnv1a(&spec.step, sizeof(spec.step), sig.shape_hash);
  if (range) {
    sig.shape_hash = fnv1a(&spec.first, sizeof(spec.first), sig.shape_hash);
    sig.shape_hash = fnv1a(&spec.numel, sizeof(spec.numel), sig.shape_hash);
  }
  sig.layout_hash = fnv1a(spec.always.data(), spec.always.size() * sizeof(int64_t));
  return sig;
}

int64_t first_nonfinite(const TensorView& t) {
  return cpu_device(KernelChoice::kAuto).first_nonfinite(t.data, t.dtype, nullptr, t.numel);
}

}  // namespace hvdc
