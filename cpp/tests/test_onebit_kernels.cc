// The 1-bit kernels' self-check (onebit_kernels_self_check, hvdc/onebit_kernel_bench.h: AVX2
// against portable code, byte for byte) under AddressSanitizer/UndefinedBehaviorSanitizer, with
// the lengths and seeds of tests/test_compressed_allreduce.py::
// test_simd_and_portable_kernels_write_identical_bytes: around the 32-element blocks and their
// tails, where an out-of-bounds load or store would hide in an optimized build. On a CPU without
// AVX2 the self-check has nothing to compare and passes. Also: the split kernels of the pipelined
// collective (server step in pieces; worker error and result as two kernels on sub-ranges) equal
// the fused ones bit for bit, with either implementation.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "check.h"
#include "hvdc/errors.h"
#include "hvdc/onebit_kernel_bench.h"
#include "hvdc/onebit_kernels.h"

namespace hvdc {
namespace {

uint32_t next(uint64_t& s) {
  s = s * 6364136223846793005ull + 1442695040888963407ull;
  return static_cast<uint32_t>(s >> 33);
}

// onebit_server_reduce_compress split into pieces (onebit_server_reduce_signs per piece, the sum
// finished once, onebit_server_error per piece), as the pipelined collective runs it, against the
// fused kernel: the same bits, scale and error, bit for bit, with the AVX2 and the portable code.
void server_pieces_match_fused(Failures& f) {
  for (KernelChoice kernels : {KernelChoice::kAuto, KernelChoice::kScalar})
    for (int nranks = 1; nranks <= 5; ++nranks)
      for (int64_t n_padded : {int64_t{8}, int64_t{64}, int64_t{1000}, int64_t{4104}})
        for (int64_t n_real : {n_padded, n_padded - 5, n_padded / 2 + 3, int64_t{0}})
          for (int64_t piece : {int64_t{32}, int64_t{96}, int64_t{1024}}) {
            if (n_real < 0) continue;
            const std::string what =
                str("server pieces: ", nranks, " ranks, ", n_real, "/", n_padded, " elements, piece ",
                    piece, kernels == KernelChoice::kScalar ? " (scalar)" : " (auto)");
            f.ran();
            uint64_t seed = static_cast<uint64_t>(nranks * 1000003 + n_padded * 31 + n_real);
            std::vector<std::vector<uint8_t>> bits(static_cast<size_t>(nranks));
            std::vector<const uint8_t*> ptr(static_cast<size_t>(nranks));
            std::vector<float> scales(static_cast<size_t>(nranks));
            for (int r = 0; r < nranks; ++r) {
              bits[r].resize(static_cast<size_t>(n_padded / 8));
              for (uint8_t& b : bits[r]) b = static_cast<uint8_t>(next(seed));
              ptr[r] = bits[r].data();
              scales[r] = static_cast<float>(next(seed) % 1000 + 1) * 1e-3f;
            }
            std::vector<float> err0(static_cast<size_t>(n_padded));
            for (float& e : err0)
              e = (static_cast<float>(next(seed) % 20001) - 10000.0f) * 1e-4f;
            std::vector<float> ferr = err0, perr = err0;
            std::vector<uint8_t> fbits(static_cast<size_t>(n_padded / 8), 0xAA),
                pbits(static_cast<size_t>(n_padded / 8), 0x55);
            const float fscale = onebit_server_reduce_compress(
                ptr.data(), scales.data(), nranks, ferr.data(), n_real, n_padded, fbits.data(),
                kernels);
            OneBitSumSq acc;
            std::vector<const uint8_t*> at(static_cast<size_t>(nranks));
            for (int64_t lo = 0; lo < n_padded; lo += piece) {
              const int64_t hi = std::min(n_padded, lo + piece);
              for (int r = 0; r < nranks; ++r) at[r] = ptr[r] + lo / 8;
              onebit_server_reduce_signs(at.data(), scales.data(), nranks, perr.data() + lo,
                                         std::clamp<int64_t>(n_real - lo, 0, hi - lo), hi - lo,
                                         pbits.data() + lo / 8, acc, kernels);
            }
            const float pscale = onebit_scale(onebit_sumsq(acc, kernels), n_real);
            for (int64_t lo = 0; lo < n_real; lo += piece)
              onebit_server_error(perr.data() + lo, std::min(piece, n_real - lo), pscale, kernels);
            f.check(std::memcmp(&pscale, &fscale, sizeof(float)) == 0,
                    str(what, ": scale ", pscale, ", fused ", fscale));
            f.check(pbits == fbits, what + ": bits differ from the fused kernel's");
            f.check(std::memcmp(perr.data(), ferr.data(), sizeof(float) * perr.size()) == 0,
                    what + ": error bits differ from the fused kernel's");
          }
  // A piece with real elements after a partial one would sum in another order: refused.
  f.ran();
  std::vector<uint8_t> b(8, 0xF0), out(8);
  const uint8_t* p = b.data();
  const float scale = 1.0f;
  std::vector<float> err(64, 0.5f);
  OneBitSumSq acc;
  onebit_server_reduce_signs(&p, &scale, 1, err.data(), 24, 32, out.data(), acc);
  bool refused = false;
  try {
    onebit_server_reduce_signs(&p, &scale, 1, err.data() + 32, 32, 32, out.data() + 4, acc);
  } catch (const UsageError&) {
    refused = true;
  }
  f.check(refused, "server pieces: a piece after a partial one was not refused");
}

// The worker error and the result as two kernels on arbitrary sub-ranges (the pipelined
// collective's split) against the fused onebit_compress_error_decompress over the whole chunk.
void worker_split_matches_fused(Failures& f) {
  for (KernelChoice kernels : {KernelChoice::kAuto, KernelChoice::kScalar})
    for (DType dtype : {DType::kFloat32, DType::kFloat16, DType::kBFloat16})
      for (int64_t n : {int64_t{1}, int64_t{100}, int64_t{4099}})
        for (int64_t piece : {int64_t{32}, int64_t{96}, int64_t{1024}}) {
          const std::string what = str("worker split: ", dtype_name(dtype), " n=", n, " piece ",
                                       piece, kernels == KernelChoice::kScalar ? " (scalar)" : "");
          f.ran();
          uint64_t seed = static_cast<uint64_t>(n * 17 + piece);
          const size_t es = dtype_size(dtype);
          std::vector<uint8_t> x0(static_cast<size_t>(n) * es), bits(static_cast<size_t>(n + 7) / 8);
          for (int64_t i = 0; i < n; ++i) {
            const float v = (static_cast<float>(next(seed) % 2001) - 1000.0f) * 1e-3f;
            if (dtype == DType::kFloat32) std::memcpy(x0.data() + 4 * i, &v, 4);
            else {
              const uint16_t h = dtype == DType::kFloat16 ? float_to_half(v) : float_to_bf16(v);
              std::memcpy(x0.data() + 2 * i, &h, 2);
            }
          }
          for (uint8_t& b : bits) b = static_cast<uint8_t>(next(seed));
          std::vector<float> e0(static_cast<size_t>(n));
          for (float& e : e0) e = (static_cast<float>(next(seed) % 2001) - 1000.0f) * 1e-4f;
          std::vector<uint8_t> xf = x0, xs = x0;
          std::vector<float> ef = e0, es_ = e0;
          onebit_compress_error_decompress(xf.data(), dtype, ef.data(), n, 0.37f, bits.data(),
                                           0.81f, kernels);
          for (int64_t lo = 0; lo < n; lo += piece)
            onebit_compress_error(xs.data() + lo * es, dtype, es_.data() + lo,
                                  std::min(piece, n - lo), 0.37f, kernels);
          for (int64_t lo = 0; lo < n; lo += piece)
            onebit_decompress(bits.data() + lo / 8, 0.81f, xs.data() + lo * es, dtype,
                              std::min(piece, n - lo), kernels);
          f.check(xs == xf, what + ": result bytes differ from the fused kernel's");
          f.check(std::memcmp(es_.data(), ef.data(), sizeof(float) * ef.size()) == 0,
                  what + ": error bits differ from the fused kernel's");
        }
}

}  // namespace
}  // namespace hvdc

int main() {
  hvdc::Failures f;
  hvdc::server_pieces_match_fused(f);
  hvdc::worker_split_matches_fused(f);
  for (hvdc::DType dtype : {hvdc::DType::kFloat32, hvdc::DType::kFloat16, hvdc::DType::kBFloat16})
    for (int64_t numel : {0, 1, 7, 8, 31, 32, 33, 63, 64, 100, 1000, 4099, (1 << 16) + 5})
      for (uint64_t seed = 0; seed < 3; ++seed) {
        const std::string why = hvdc::onebit_kernels_self_check(numel, dtype, seed);
        f.ran();
        f.check(why.empty(), hvdc::str(hvdc::dtype_name(dtype), " numel=", numel, " seed=", seed,
                                       " (", hvdc::onebit_kernel_isa(), "): ", why));
      }
  return f.finish("test_onebit_kernels");
}
