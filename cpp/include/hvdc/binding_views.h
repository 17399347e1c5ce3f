// The one translation every binding file uses, defined in bindings.cc: a DLPack object to a core view
// (UsageError prefixed with `what` if the core cannot address it), and a call's byte counts to the
// {"bytes_sent", "bytes_received", "calls"} dict. Then the argument checks of the fused optimizer kernels'
// bindings (SLAMB, 1-bit LAMB, 1-bit Adam): float32 buffers of agreeing lengths, per-layer lists.
#pragma once
#include <nanobind/nanobind.h>

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "hvdc/comm_stats.h"
#include "hvdc/tensor.h"

namespace hvdc {

TensorView binding_view_of(nanobind::handle obj, const std::string& what);
nanobind::dict binding_stats(const CommStats& s);

// The float32 data of `obj`, which must hold *numel elements (*numel < 0: take its own, written back).
float* binding_float32(nanobind::handle obj, const std::string& what, int64_t* numel);

// Layer sizes that sum to `n`, with `per_layer` (the length of another per-layer list) as many entries.
void binding_check_layers(const std::vector<int64_t>& sizes, int64_t n, size_t per_layer, const char* fn);

// The float32 data of each parameter of a bucket, in the flat buffers' order (None: an empty layer, whose
// strides may not read as contiguous; its pointer is null), with their sizes in *sizes, checked as above.
std::vector<float*> binding_float32_layers(const std::vector<nanobind::handle>& params, int64_t n, size_t per_layer,
                                           const char* fn, std::vector<int64_t>* sizes);

// Calls f(i, at) for each non-empty layer i of `sizes`, `at` its first element in the flat buffers.
template <typename F>
void for_each_layer(const std::vector<int64_t>& sizes, F f) {
  int64_t at = 0;
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i]) f(i, at);
    at += sizes[i];
  }
}

}  // namespace hvdc
