// Random-k masks (hvdc/masks.h), the gather/scatter kernels and the masked average
// (hvdc/masked_allreduce.h) on n = 1..4 thread ranks: the cyclic masks select every element exactly
// once per int(1/k) steps with a fixed count, Bernoulli masks select about k and equal their
// definition (hvdc/masks.h) on every fill and compare this CPU runs, the always-selected
// ranges are set, gather/scatter equal a plain loop at every alignment and element size, the masked
// average changes exactly the selected elements, a range of a mask is the slice of the whole one,
// and ranks whose mask seed, step, ratio or range differs raise MismatchError on every rank.
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

#include "check.h"
#include "hvdc/errors.h"
#include "hvdc/masked_allreduce.h"
#include "hvdc/masks.h"
#include "hvdc/philox.h"
#include "hvdc/signature.h"
#include "thread_communicator.h"

namespace hvdc {
namespace {

constexpr double kHangS = 60;

MaskSpec spec(int64_t numel, double ratio, uint64_t seed, int64_t step, MaskKind kind) {
  MaskSpec s;
  s.numel = numel;
  s.ratio = ratio;
  s.seed = seed;
  s.step = step;
  s.kind = kind;
  return s;
}

void cyclic_covers_each_element_once(Failures& f) {
  for (int64_t numel : {1, 7, 64, 1000, 4099}) {
    for (double k : {1.0, 0.5, 0.25, 0.1, 0.03}) {
      f.ran();
      const int64_t nc = static_cast<int64_t>(1.0 / k), cs = (numel + nc - 1) / nc;
      std::vector<int> hits(static_cast<size_t>(numel), 0);
      std::vector<uint8_t> m(static_cast<size_t>(numel));
      const std::string what = "cyclic numel=" + std::to_string(numel) + " k=" + std::to_string(k);
      for (int64_t t = 5; t < 5 + nc; ++t) {
        random_mask(spec(numel, k, 42, t, MaskKind::kCyclic), m.data());
        const int64_t want = std::max<int64_t>(0, std::min(cs, numel - (t % nc) * cs));
        f.check(mask_count(m.data(), numel) == want,
                what + " t=" + std::to_string(t) + ": count " +
                    std::to_string(mask_count(m.data(), numel)) + " != " + std::to_string(want));
        for (int64_t i = 0; i < numel; ++i) hits[i] += m[i];
      }
      bool once = true;
      for (int h : hits) once &= h == 1;
      f.check(once, what + ": some element not selected exactly once in nc steps");
    }
  }
  // The permutation is one: every index exactly once.
  f.ran();
  const std::vector<int64_t> pi = cyclic_permutation(5000, 9);
  std::vector<int> seen(5000, 0);
  for (int64_t p : pi) ++seen[static_cast<size_t>(p)];
  bool perm = true;
  for (int s : seen) perm &= s == 1;
  f.check(perm, "cyclic_permutation(5000, 9) is not a permutation");
}

void bernoulli_rate_and_always(Failures& f) {
  f.ran();
  const int64_t numel = 200000;
  std::vector<uint8_t> m(numel), m2(numel);
  MaskSpec s = spec(numel, 0.1, 5, 3, MaskKind::kBernoulli);
  random_mask(s, m.data());
  const double rate = static_cast<double>(mask_count(m.data(), numel)) / numel;
  f.check(rate > 0.097 && rate < 0.103, "bernoulli k=0.1 rate " + std::to_string(rate));
  s.step = 4;
  random_mask(s, m2.data());
  f.check(std::memcmp(m.data(), m2.data(), numel) != 0, "bernoulli masks of steps 3 and 4 equal");
  s.always = {10, 100, 150000, 7};
  random_mask(s, m.data());
  bool set = true;
  for (int64_t i = 10; i < 110; ++i) set &= m[i] == 1;
  for (int64_t i = 150000; i < 150007; ++i) set &= m[i] == 1;
  f.check(set, "always-selected ranges not set");
  f.check(!check_mask_spec(spec(10, 0.0, 0, 0, MaskKind::kCyclic)).empty(), "ratio 0 accepted");
  f.check(!check_mask_spec(spec(10, 1.5, 0, 0, MaskKind::kCyclic)).empty(), "ratio 1.5 accepted");
  MaskSpec bad = spec(10, 0.5, 0, 0, MaskKind::kCyclic);
  bad.always = {8, 3};
  f.check(!check_mask_spec(bad).empty(), "range past the end accepted");
}

// The 16-bit half of element i in `key`'s sequence, written from the definition in hvdc/masks.h.
uint32_t defined_half(const PhiloxKey& key, uint64_t i) {
  const uint64_t word = i >> 1;
  const uint32_t w = philox_block(key, word >> 2).v[word & 3];
  return (i & 1) ? w >> 16 : w & 0xFFFFu;
}

// Every Bernoulli path this CPU runs (the portable compare on the portable and AVX2 fills, the
// AVX-512 fused one, and the auto choice through random_mask) equals the definition written
// plainly, element by element: at many starts and lengths (both sides of the 4096-element tiles,
// and past the 2^32 carry of the block counter), for k = 1, 0.5 (T & 0xFFFF == 0), tiny k, and
// thresholds whose high half equals a drawn hi, so that ties are taken both ways.
void bernoulli_paths_match_definition(Failures& f) {
  f.check(bernoulli_threshold(1.0) == (uint64_t{1} << 32), "T(1) != 2^32");
  f.check(bernoulli_threshold(0.5) == (uint64_t{1} << 31), "T(0.5) != 2^31");
  f.check(bernoulli_threshold(1e-7) == 430, "T(1e-7) = " + std::to_string(bernoulli_threshold(1e-7)));
  const uint64_t seed = 0x5eed5eed12345ull;
  const int64_t step = 7;
  PhiloxKey hi_key, lo_key;
  hi_key.seed = lo_key.seed = seed;
  hi_key.step = lo_key.step = static_cast<uint32_t>(step);
  hi_key.stream = kMaskBernoulliStream;
  lo_key.stream = kMaskBernoulliTieStream;
  constexpr int64_t kSpan = 13000;
  int ties_taken = 0, ties_refused = 0;
  for (const uint64_t base : {uint64_t{0}, (uint64_t{1} << 35) - 4100}) {
    std::vector<uint64_t> draw(kSpan);  // hi << 16 | lo, element base + x
    for (int64_t x = 0; x < kSpan; ++x) {
      const uint64_t i = base + static_cast<uint64_t>(x);
      draw[x] = uint64_t{defined_half(hi_key, i)} << 16 | defined_half(lo_key, i);
    }
    std::vector<double> ratios = {1.0, 0.5, 0.1, 1e-7, 0.7, 0.99999};
    // T = hi << 16 | 0x8000 or | 0x1200: at most 24 significant bits, so T / 2^32 is a float32
    // and the ratio gives exactly this T.
    for (int64_t x : {0, 1, 2, 3, 777, 4096, 9001})
      for (uint64_t tl : {0x8000u, 0x1200u})
        ratios.push_back(static_cast<double>((draw[x] >> 16) << 16 | tl) / 4294967296.0);
    for (const double ratio : ratios) {
      const uint64_t t = bernoulli_threshold(ratio);
      std::vector<uint8_t> want(kSpan);
      for (int64_t x = 0; x < kSpan; ++x) {
        want[x] = t >= (uint64_t{1} << 32) || draw[x] < t;
        if ((draw[x] >> 16) == (t >> 16) && (t & 0xFFFF) != 0) ++(want[x] ? ties_taken : ties_refused);
      }
      for (PhiloxIsa isa : {PhiloxIsa::kAuto, PhiloxIsa::kPortable, PhiloxIsa::kAvx2, PhiloxIsa::kAvx512}) {
        if (!philox_isa_supported(isa)) continue;
        for (int64_t start : {0, 1, 2, 3, 63, 64, 65, 4095, 4096, 4097, 4098, 8191}) {
          for (int64_t len : {0, 1, 2, 3, 63, 64, 65, 127, 129, 4096, 4097, 4800}) {
            f.ran();
            MaskSpec s = spec(static_cast<int64_t>(base) + kSpan, ratio, seed, step, MaskKind::kBernoulli);
            s.first = static_cast<int64_t>(base) + start;
            s.length = len;
            std::vector<uint8_t> got(static_cast<size_t>(len) + 1, 7);
            if (isa == PhiloxIsa::kAuto)
              random_mask(s, got.data());
            else
              bernoulli_mask(isa, s, got.data());
            int64_t bad = 0, first_bad = -1;
            for (int64_t x = 0; x < len; ++x) {
              if (got[x] == want[start + x]) continue;
              if (bad++ == 0) first_bad = start + x;
            }
            f.check(bad == 0 && got[len] == 7,
                    str("bernoulli ", philox_isa_name(isa), " k=", ratio, " range [", base, " + ", start, ", +",
                        len, "): ", bad, " element(s) differ from the definition, first at +", first_bad,
                        got[len] == 7 ? "" : " (and wrote past the range)"));
          }
        }
      }
    }
  }
  f.check(ties_taken > 0 && ties_refused > 0,
          str("the tie cases did not go both ways: ", ties_taken, " taken, ", ties_refused, " refused"));
  // The step keys Philox mod 2^32.
  f.ran();
  std::vector<uint8_t> a(5000), b(5000);
  random_mask(spec(5000, 0.3, seed, 3, MaskKind::kBernoulli), a.data());
  random_mask(spec(5000, 0.3, seed, (int64_t{1} << 32) + 3, MaskKind::kBernoulli), b.data());
  f.check(a == b, "bernoulli step 2^32 + 3 differs from step 3");
}

// A range [first, first + length) of a mask (SLAMB's buckets) holds exactly those elements of the
// whole mask, for both kinds, ranges at any alignment, and always-selected ranges that start
// before, end inside, or cover the drawn range; a range past the end is refused.
void ranges_are_slices_of_the_whole_mask(Failures& f) {
  const int64_t numel = 10007;
  for (MaskKind kind : {MaskKind::kCyclic, MaskKind::kBernoulli}) {
    for (int64_t t : {1, 2, 13}) {
      f.ran();
      MaskSpec whole = spec(numel, 0.25, 31, t, kind);
      whole.always = {0, 5, 990, 40, 4000, 3000};
      std::vector<uint8_t> all(numel);
      random_mask(whole, all.data());
      const int64_t cuts[] = {0, 3, 1000, 1001, 4096, 5000, 7001, 10000, numel};
      for (size_t c = 0; c + 1 < sizeof(cuts) / sizeof(cuts[0]); ++c) {
        MaskSpec part = whole;
        part.first = cuts[c];
        part.length = cuts[c + 1] - cuts[c];
        f.check(check_mask_spec(part).empty(), "valid range refused: " + check_mask_spec(part));
        std::vector<uint8_t> got(static_cast<size_t>(part.length) + 1, 7);
        random_mask(part, got.data());
        f.check(std::memcmp(got.data(), all.data() + part.first, part.length) == 0 &&
                    got[part.length] == 7,
                "kind " + std::to_string(static_cast<int>(kind)) + " t=" + std::to_string(t) +
                    ": range [" + std::to_string(cuts[c]) + ", " + std::to_string(cuts[c + 1]) +
                    ") differs from the whole mask's slice (or wrote past it)");
      }
    }
  }
  f.ran();
  MaskSpec past = spec(100, 0.5, 0, 0, MaskKind::kCyclic);
  past.first = 90;
  past.length = 11;
  f.check(!check_mask_spec(past).empty(), "mask range past the end accepted");
  past.first = 101;
  past.length = -1;
  f.check(!check_mask_spec(past).empty(), "mask range starting past the end accepted");
}

template <typename T>
void gather_scatter_case(Failures& f, int64_t n, double density, uint64_t seed) {
  f.ran();
  std::vector<uint8_t> mask(static_cast<size_t>(n));
  std::vector<T> src(static_cast<size_t>(n)), dst(static_cast<size_t>(n) + 1, T(0x5a)),
      back(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    // Runs of all-set and all-clear blocks as well as mixed ones.
    const bool block_all = (i / 64) % 5 == 1, block_none = (i / 64) % 5 == 2;
    mask[i] = block_all ? 1 : block_none ? 0 : ((i * 2654435761u + seed) % 1000) < density * 1000;
    src[i] = static_cast<T>(i * 3 + 1);
    back[i] = static_cast<T>(-1);
  }
  const int64_t set = mask_count(mask.data(), n);
  const int64_t count = mask_gather(src.data(), mask.data(), n, set, sizeof(T), dst.data());
  std::vector<T> want;
  for (int64_t i = 0; i < n; ++i)
    if (mask[i]) want.push_back(src[i]);
  const std::string what = "gather/scatter elem=" + std::to_string(sizeof(T)) +
                           " n=" + std::to_string(n) + " density=" + std::to_string(density);
  f.check(count == static_cast<int64_t>(want.size()), what + ": count");
  f.check(std::equal(want.begin(), want.end(), dst.begin()), what + ": gathered values");
  f.check(dst[count] == T(0x5a) || count == n, what + ": wrote past the count");
  mask_scatter(dst.data(), mask.data(), n, set, sizeof(T), back.data());
  bool ok = true;
  for (int64_t i = 0; i < n; ++i) ok &= back[i] == (mask[i] ? src[i] : static_cast<T>(-1));
  f.check(ok, what + ": scatter");
}

void gather_scatter(Failures& f) {
  for (int64_t n : {0, 1, 63, 64, 65, 1000, 4097})
    for (double d : {0.0, 0.1, 0.5, 1.0}) {
      gather_scatter_case<uint16_t>(f, n, d, 1);
      gather_scatter_case<uint32_t>(f, n, d, 2);
      gather_scatter_case<uint64_t>(f, n, d, 3);
    }
}

// Rank r's value of element i: distinct per rank, exact in float32 sums.
float value(int r, int64_t i) { return static_cast<float>((r + 1) * 8 + (i % 13)); }

void masked_average_on_ranks(Failures& f) {
  for (int n = 1; n <= 4; ++n) {
    for (MaskKind kind : {MaskKind::kCyclic, MaskKind::kBernoulli}) {
      f.ran();
      const int64_t numel = 1031;
      MaskSpec s = spec(numel, 0.1, 77, 12, kind);
      s.always = {0, 5};
      std::vector<uint8_t> mask(numel);
      random_mask(s, mask.data());
      const std::string what = "masked average n=" + std::to_string(n) +
                               (kind == MaskKind::kCyclic ? " cyclic" : " bernoulli");
      ThreadWorld world(n, kHangS);
      const std::vector<std::string> failed = world.run([&](Communicator& comm) {
        const int r = comm.rank();
        std::vector<float> x(numel);
        for (int64_t i = 0; i < numel; ++i) x[i] = value(r, i);
        TensorView t;
        t.data = x.data();
        t.numel = numel;
        t.dtype = DType::kFloat32;
        agree_on_signature(comm, masked_signature(t, s, "m"), kHangS, "masked");
        std::vector<unsigned char> scratch;
        masked_average(comm, cpu_device(KernelChoice::kAuto), t, mask.data(), scratch);
        bool ok = true;
        for (int64_t i = 0; i < numel; ++i) {
          double mean = 0;
          for (int q = 0; q < n; ++q) mean += value(q, i);
          mean /= n;
          const double want = mask[i] ? mean : value(r, i);
          ok &= std::fabs(x[i] - want) <= 1e-5 * std::fabs(want);
        }
        f.check(ok, what + " rank " + std::to_string(r) + ": values");
      });
      for (size_t r = 0; r < failed.size(); ++r)
        f.check(failed[r].empty(), what + " rank " + std::to_string(r) + " threw: " + failed[r]);
    }
  }
}

void mismatched_masks_raise_everywhere(Failures& f) {
  for (int field = 0; field < 4; ++field) {
    f.ran();
    const int n = 3;
    ThreadWorld world(n, kHangS);
    std::vector<std::string> errors(n);
    world.run([&](Communicator& comm) {
      const int r = comm.rank();
      MaskSpec s = spec(100, 0.1, 7, 3, MaskKind::kCyclic);
      if (r == 2 && field == 0) s.seed = 8;
      if (r == 2 && field == 1) s.step = 4;
      if (r == 2 && field == 2) s.ratio = 0.2;
      if (r == 2 && field == 3) {  // the same 100 elements, but another range of a larger mask
        s.numel = 110;
        s.first = 10;
      }
      std::vector<float> x(100, 1.0f);
      TensorView t;
      t.data = x.data();
      t.numel = 100;
      t.dtype = DType::kFloat32;
      try {
        agree_on_signature(comm, masked_signature(t, s, "m"), kHangS, "masked");
      } catch (const MismatchError& e) {
        errors[r] = e.what();
      }
    });
    const char* names[] = {"seed=8", "t=4", "k=0.2", "at=10/110"};
    for (int r = 0; r < n; ++r)
      f.check(errors[r].find(names[field]) != std::string::npos,
              std::string("mismatched ") + names[field] + ": rank " + std::to_string(r) +
                  " got '" + errors[r] + "'");
  }
}

void nonfinite_found(Failures& f) {
  f.ran();
  std::vector<float> x(100, 1.0f);
  TensorView t;
  t.data = x.data();
  t.numel = 100;
  f.check(first_nonfinite(t) == -1, "finite buffer flagged");
  x[37] = std::nanf("");
  f.check(first_nonfinite(t) == 37, "NaN at 37 not found");
  std::vector<uint16_t> h(10, 0x3c00);
  h[4] = 0x7c00;
  t.data = h.data();
  t.numel = 10;
  t.dtype = DType::kFloat16;
  f.check(first_nonfinite(t) == 4, "float16 Inf at 4 not found");
}

}  // namespace
}  // namespace hvdc

int main() {
  hvdc::Failures f;
  hvdc::cyclic_covers_each_element_once(f);
  hvdc::bernoulli_rate_and_always(f);
  hvdc::bernoulli_paths_match_definition(f);
  hvdc::ranges_are_slices_of_the_whole_mask(f);
  hvdc::gather_scatter(f);
  hvdc::masked_average_on_ranks(f);
  hvdc::mismatched_masks_raise_everywhere(f);
  hvdc::nonfinite_found(f);
  return f.finish("test_masks");
}
