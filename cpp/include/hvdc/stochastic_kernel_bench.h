// Benchmark hook of Birder's stochastic quantizer (hvdc/stochastic_kernels.h), kept out of the
// shipped extension hvd_compress._core: built into hvd_compress._kernel_bench (setup.py, bound in
// cpp/bench/kernel_bench_bindings.cc) for `python -m hvd_compress.bench` (hvd_compress/bench/kernels.py).
#pragma once
#include <cstdint>
#include <map>
#include <string>

namespace hvdc {

// Median seconds (thread CPU time, hvdc/kernel_timing.h) over `reps` runs (after one warm-up) of each kernel on `numel` float32 elements,
// drawing its uniforms from Philox as the collective does (no injected uniforms), in buffers
// allocated once:
//   "stochastic_quantize"          the worker pass: y = x + e, bits = Q(y), e = y - Q(y);
//   "stochastic_quantize_moments"  the worker pass with Birder's moments (m, b updated, y = m / (b +
//                                  eps) + e): what the collective runs in "grad" mode;
//   "stochastic_server"            the server pass on 2 ranks' bits (count, average, + e, Q);
//   "sign_unpack"                  bits to +/-1.0f;
// and, right after each in every repetition, "memcpy_<kernel>": memcpy of the float32 arrays that
// kernel streams element by element (as hvdc/onebit_kernel_bench.h counts them):
//   stochastic_quantize: numel * 8 (x + error); stochastic_quantize_moments: numel * 16 (x, m, b,
//   error); stochastic_server: numel * 4 (server error); sign_unpack: numel * 4 (the result).
// Also "numel" and "philox_fill" (the uniforms alone: philox_fill_uniform of numel floats).
std::map<std::string, double> stochastic_kernel_bench(int64_t numel, int reps);

}  // namespace hvdc
