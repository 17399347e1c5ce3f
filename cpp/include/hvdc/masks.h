// Random-k masks that every rank derives from (seed, step) without communicating (SLAMB, paper 000
// Alg. 1 line 6; spec shared/specs/slamb.md section 3), and the compaction kernels that move the
// selected elements of a buffer into a dense one and back (the masked allreduce's gather/scatter).
//
// Two kinds, both drawn from the core's Philox (hvdc/philox.h), never from a framework generator:
//   - cyclic (the default, the reference code's v1): a permutation pi of range(numel) is drawn once
//     per (numel, seed): element i gets the Philox word w_i = word i of (seed, step 0, stream
//     kMaskPermutationStream), and pi sorts the elements by (w_i, i) (a stable sort by the words:
//     ties keep index order, so NumPy's argsort(w, kind="stable") is the same permutation). With
//     nc = int(1 / ratio) and chunk size cs = ceil(numel / nc) (torch.chunk's), step t selects
//     pi[c * cs, (c + 1) * cs) with c = t mod nc: every element exactly once in any nc consecutive
//     steps, a fixed count per step. Where numel is small torch.chunk returns fewer than nc chunks
//     (the reference code then fails); here those steps select nothing from the permutation.
//   - bernoulli (the paper's and v2's): each element independently with probability T / 2^32,
//     T = ceil(float32(ratio) * 2^32) (bernoulli_threshold; T >= 2^32 selects every element).
//     Element i draws a 32-bit number from two 16-bit halves: hi_i = half (i & 1) (half 0 the low
//     16 bits) of word i >> 1 of (seed, step mod 2^32, kMaskBernoulliStream), lo_i the same half of
//     the same word of kMaskBernoulliTieStream, and is selected iff (hi_i << 16 | lo_i) < T, i.e.
//     hi_i < T >> 16, or hi_i == T >> 16 and lo_i < (T & 0xFFFF). The tie stream is read only on a
//     tie (probability 2^-16), so a mask costs half a Philox word per element.
// `always` ranges (offset, length) are selected on every step whatever the draw (SLAMB step 2:
// 1-D and small tensors). Masks are bytes: 1 selected, 0 not (the layout of a bool tensor).
#pragma once
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "hvdc/elementwise/mask.h"
#include "hvdc/philox.h"

namespace hvdc {

enum class MaskKind : int32_t { kCyclic = 0, kBernoulli = 1 };

// The Philox streams of the masks (kMaskPermutationStream, kMaskBernoulliStream,
// kMaskBernoulliTieStream) and bernoulli_threshold are in hvdc/elementwise/mask.h.

struct MaskSpec {
  int64_t numel = 0;  // the mask's index space [0, numel) (SLAMB: D, all parameters)
  double ratio = 1.0;  // k in (0, 1]
  uint64_t seed = 0;
  int64_t step = 0;  // t >= 0; Bernoulli keys Philox with t mod 2^32
  MaskKind kind = MaskKind::kCyclic;
  std::vector<int64_t> always;  // (offset, length) pairs selected on every step, in [0, numel)
  // The part of the mask a call draws or uses: elements [first, first + length) (length < 0: up to
  // numel). Every element's bit is the one it has in the whole mask, so a buffer cut into ranges
  // (SLAMB's buckets) is masked exactly as the whole buffer is.
  int64_t first = 0;
  int64_t length = -1;
};

// The number of elements `spec` draws: its length, or numel - first when that is negative.
int64_t mask_range_length(const MaskSpec& spec);

// Why `spec` is invalid (ratio outside (0, 1], negative numel or step, an unknown kind, an `always`
// range or the drawn range outside [0, numel)), or empty when it is valid.
std::string check_mask_spec(const MaskSpec& spec);

// The mask of `spec`, elements [first, first + length) of it, into out[0, length) (validate with
// check_mask_spec first). The cyclic permutation of (numel, seed) is computed once and kept (one
// per process, the last one used), as a chunk number per element, so that later steps, and any
// range of them, are one streaming compare over the range only.
void random_mask(const MaskSpec& spec, uint8_t* out);

// The Bernoulli draw of `spec` (its kind and `always` ranges are not read), elements
// [first, first + length) into out[0, length), on `isa`'s Philox fill and compare (kAuto: the best
// this CPU has; every supported choice writes the same bytes, which tests check).
void bernoulli_mask(PhiloxIsa isa, const MaskSpec& spec, uint8_t* out);

// The permutation pi of a cyclic mask (for tests and the NumPy mirror): pi[j] = the element at
// position j.
std::vector<int64_t> cyclic_permutation(int64_t numel, uint64_t seed);

// The place of every element of [0, numel) in the permutation of (numel, seed) (the inverse of pi),
// the cache random_mask reads: what a device table copies once to draw cyclic masks itself.
std::shared_ptr<const std::vector<uint32_t>> cyclic_ranks(int64_t numel, uint64_t seed);

// Number of selected elements of mask[0, n).
int64_t mask_count(const uint8_t* mask, int64_t n);

// dst[0, count) = the elements of src[0, n) whose mask byte is set, in index order; returns count.
// `count` must be mask_count(mask, n) (every caller has it already: it sizes dst); `elem` is the
// element size in bytes (2, 4 or 8). `dst` must hold `count` elements.
int64_t mask_gather(const void* src, const uint8_t* mask, int64_t n, int64_t count, size_t elem,
                    void* dst);

// The inverse: the selected elements of dst[0, n) become compact[0, count) in index order; the
// others are left as they are. `count` as for mask_gather. Returns count.
int64_t mask_scatter(const void* compact, const uint8_t* mask, int64_t n, int64_t count, size_t elem,
                     void* dst);

// Sums of squares of the selected and of the unselected elements of x[0, n), and the selected count,
// in one pass (SLAMB's per-layer phi_max / phi_min norms, spec step 8, without building x[M] and
// x[~M]). Accumulated per block in float lanes, then in double.
struct MaskedSumSquares {
  double selected = 0.0;
  double unselected = 0.0;
  int64_t count = 0;
};
MaskedSumSquares mask_sum_squares(const float* x, const uint8_t* mask, int64_t n);

// SLAMB's freshness (spec step 6): c[i] = 1 where mask[i] is set, else beta3 * c[i]; one pass.
void mask_freshness(float* c, const uint8_t* mask, int64_t n, float beta3);

}  // namespace hvdc
