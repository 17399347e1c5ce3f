// The masked allreduce of SLAMB (paper 000 Alg. 1 lines 6-8; spec shared/specs/slamb.md section 2
// step 4): the elements of a buffer that a mask selects are gathered into one dense buffer (in
// index order, the same on every rank since the mask is), averaged over the ranks, and scattered
// back in place; the others stay as they are. No index ever travels: every rank derives the same
// mask from (numel, ratio, seed, step, kind) (hvdc/masks.h).
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "hvdc/communicator.h"
#include "hvdc/device.h"
#include "hvdc/masks.h"
#include "hvdc/signature.h"
#include "hvdc/tensor.h"

namespace hvdc {

// In place on `t` (float16, bfloat16, float32 or float64) on `dev`'s memory: t[mask] = average over
// comm's ranks of t[mask]. `mask` (dev's memory) holds t.numel bytes (0/1) and must be the same on
// every rank. The selected elements are gathered by dev's kernel into one dense buffer, which alone
// crosses to the host and back (dense_allreduce over the table), and scattered back by its kernel;
// `scratch` is reused between calls for the dense buffer where dev's memory is the host's.
void masked_average(Communicator& comm, DeviceTable& dev, const TensorView& t, const uint8_t* mask,
                    std::vector<unsigned char>& scratch);

// The mask of `spec` (valid) into `mask` (dev's memory, mask_range_length(spec) bytes) by dev's kernel.
void masked_draw(DeviceTable& dev, const MaskSpec& spec, uint8_t* mask);

// The signature of a masked allreduce of `t` (spec.numel == t.numel): op is the mask kind; ratio,
// seed and step are hashed into the shape and shown after the dims ("[1000] k=0.1 seed=7 t=3");
// the always-selected ranges are the layout hash. Ranks whose masks would differ thus disagree.
CallSignature masked_signature(const TensorView& t, const MaskSpec& spec, const std::string& name,
                               Collective collective = kMaskedAllreduce);

// Index of the first NaN/Inf element of `t`, or -1 when every element is finite.
int64_t first_nonfinite(const TensorView& t);

}  // namespace hvdc
