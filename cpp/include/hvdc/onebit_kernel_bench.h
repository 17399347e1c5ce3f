// Test and benchmark hooks of the 1-bit kernels (hvdc/onebit_kernels.h), kept out of the shipped
// extension hvd_compress._core: they are built into hvd_compress._kernel_bench (setup.py, bound in
// cpp/bench/kernel_bench_bindings.cc) for `python -m hvd_compress.bench` (hvd_compress/bench/kernels.py)
// and tests/test_compressed_allreduce.py, and into the C++ tests (cpp/tests, under sanitizers).
#pragma once
#include <cstdint>
#include <map>
#include <string>

#include "hvdc/dtype.h"

namespace hvdc {

// Median seconds over `reps` runs (after one warm-up run) of each kernel on one chunk of `numel`
// elements of `dtype` (float32, float16 or bfloat16), in buffers allocated once:
//   "compress"         onebit_compress (worker step, both passes);
//   "compress_signs"   onebit_compress_signs (its first pass, which the collective runs first);
//   "accumulate"       onebit_accumulate of one received chunk into a float32 sum;
//   "server_compress"  onebit_server_compress from that float32 sum, nranks = 2;
//   "server_fused"     onebit_server_reduce_compress of 2 received chunks (what the collective
//                      runs instead of accumulate + server_compress);
//   "decompress"       onebit_decompress into the dtype;
//   "error_decompress" onebit_compress_error_decompress (what the collective runs last);
// and, right after each kernel in every repetition, of "memcpy_<kernel>": memcpy between two
// distinct buffers of the bytes that kernel streams element by element:
//   compress, compress_signs, error_decompress: numel * (dtype size + 4) (buffer + worker error);
//   accumulate: numel * 4 (the float32 sum); server_compress: numel * 8 (sum + server error);
//   server_fused: numel * 4 (server error); decompress: numel * dtype size (the result).
// memcpy_K / K is the kernel's throughput relative to memcpy over the same bytes. Also "numel".
std::map<std::string, double> onebit_kernel_bench(int64_t numel, DType dtype, int reps);

// Runs every kernel of hvdc/onebit_kernels.h with KernelChoice::kScalar and kAuto (where this CPU
// has AVX2) on `numel` pseudo-random elements of `dtype` drawn from `seed` (with zeros of both
// signs, tiny and huge values) and compares the outputs byte for byte. "" if identical (or no AVX2
// here), else what differed where. Defined in cpp/bench/onebit_self_check.cc.
std::string onebit_kernels_self_check(int64_t numel, DType dtype, uint64_t seed);

}  // namespace hvdc
