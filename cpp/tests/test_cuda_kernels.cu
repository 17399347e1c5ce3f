// The GPU kernel check (specs/gpu.md, "The GPU check"): every kernel of hvdc/cuda/kernels.h run on
// the device on the inputs of kernel_cases.h, its outputs compared byte for byte with the CPU
// core's (computed here, in the same process) and, given --fixtures, with the digests that the CPU
// core wrote on another machine (write_kernel_fixtures). With --bench, each kernel's time at 16M
// elements against a device-to-device copy of the bytes it moves.
//
// Output: one tab-separated "ROW" line per result, which tools/gpu_check_table.py renders:
//   ROW kernel <case> <n> PASS|FAIL <detail>
//   ROW speed <kernel> <n> <ms> <detail>
// Exit status: 0 when every comparison passed, 1 when one failed, 3 without a CUDA device.
// Usage: test_cuda_kernels [--fixtures FILE] [--sizes n,n,...] [--bench]
#include <cuda_runtime.h>

#include <algorithm>
#include <cinttypes>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <sstream>

#include "hvdc/cuda/kernels.h"
#include "kernel_cases.h"

namespace {

using hvdc::DType;
using kcase::Result;

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) throw std::runtime_error(std::string(what) + ": " + cudaGetErrorString(e));
}

// A device buffer (RAII).
struct Dev {
  void* p = nullptr;
  size_t bytes = 0;
  explicit Dev(size_t n) : bytes(n) { check(cudaMalloc(&p, n < 1 ? 1 : n), "cudaMalloc"); }
  template <typename T>
  explicit Dev(const std::vector<T>& v) : Dev(v.size() * sizeof(T)) {
    if (bytes) check(cudaMemcpy(p, v.data(), bytes, cudaMemcpyHostToDevice), "upload");
  }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
  ~Dev() { cudaFree(p); }
  template <typename T>
  T* as() const {
    return static_cast<T*>(p);
  }
  std::vector<uint8_t> get() const {
    std::vector<uint8_t> b(bytes);
    check(cudaDeviceSynchronize(), "kernel");
    if (bytes) check(cudaMemcpy(b.data(), p, bytes, cudaMemcpyDeviceToHost), "download");
    return b;
  }
};
template <typename T>
Dev scalar_dev(T v) {
  return Dev(std::vector<T>{v});
}

// The device's outputs of case `name` at n elements, in the order and names of kcase::cpu_case.
Result gpu_case(const std::string& name, int64_t n, cudaStream_t st) {
  Result r;
  const DType dt = kcase::dtype_of(name);
  const std::string base = kcase::base_of(name);
  const int64_t np = kcase::padded(n);
  auto out = [&](const char* what, const Dev& d) { r.outputs.push_back({what, d.get()}); };
  auto out_nan = [&](const char* what, const Dev& d) {
    r.outputs.push_back({what, kcase::nan_canonical_f32(d.get())});
  };
  if (base == "onebit_compress") {
    const kcase::OneBitInputs in = kcase::onebit_inputs(n, dt);
    Dev x(in.x), e(in.error), bits(np / 8), scale(4), sumsq(8);
    Dev ws(8 * hvdc::cuda::onebit_workspace_doubles(np));
    hvdc::cuda::onebit_compress(x.p, dt, e.as<float>(), n, np, bits.as<uint8_t>(), scale.as<float>(),
                                sumsq.as<double>(), ws.as<double>(), st);
    out("bits", bits), out("scale", scale), out("sumsq", sumsq), out("error", e);
  } else if (base == "onebit_decompress") {
    const kcase::OneBitInputs in = kcase::onebit_inputs(n, dt);
    Dev bits(in.rbits), scale = scalar_dev(in.rscale), y(n * kcase::elem_size(dt));
    hvdc::cuda::onebit_decompress(bits.as<uint8_t>(), scale.as<float>(), y.p, dt, n, st);
    out("out", y);
  } else if (base == "onebit_accumulate") {
    const kcase::OneBitInputs in = kcase::onebit_inputs(n, DType::kFloat32);
    Dev bits(in.rbits), scale = scalar_dev(in.rscale), acc(in.error);
    hvdc::cuda::onebit_accumulate(bits.as<uint8_t>(), scale.as<float>(), acc.as<float>(), n, st);
    out("acc", acc);
  } else if (base == "onebit_compress_error_decompress") {
    const kcase::OneBitInputs in = kcase::onebit_inputs(n, dt);
    Dev x(in.x), e(in.error), scale = scalar_dev(0.8125f), rbits(in.rbits), rscale = scalar_dev(in.rscale);
    hvdc::cuda::onebit_compress_error_decompress(x.p, dt, e.as<float>(), n, scale.as<float>(),
                                                 rbits.as<uint8_t>(), rscale.as<float>(), st);
    out("x", x), out("error", e);
  } else if (base == "onebit_server_reduce_compress" || base == "onebit_server_compress") {
    const kcase::ServerInputs in = kcase::server_inputs(n);
    Dev bits(in.bits), scales(in.scales), e(in.error), obits(np / 8), oscale(4);
    Dev ws(8 * hvdc::cuda::onebit_workspace_doubles(np));
    if (base == "onebit_server_reduce_compress") {
      hvdc::cuda::onebit_server_reduce_compress(bits.as<uint8_t>(), np / 8, scales.as<float>(),
                                                kcase::kRanks, e.as<float>(), n, np,
                                                obits.as<uint8_t>(), oscale.as<float>(),
                                                ws.as<double>(), st);
    } else {
      Dev acc(std::vector<float>(static_cast<size_t>(n), 0.0f));
      for (int k = 0; k < kcase::kRanks; ++k)
        hvdc::cuda::onebit_accumulate(bits.as<uint8_t>() + k * np / 8, scales.as<float>() + k,
                                      acc.as<float>(), n, st);
      hvdc::cuda::onebit_server_compress(acc.as<float>(), kcase::kRanks, e.as<float>(), n, np,
                                         obits.as<uint8_t>(), oscale.as<float>(), ws.as<double>(), st);
      check(cudaStreamSynchronize(st), "server compress");
    }
    out("bits", obits), out("scale", oscale), out("error", e);
  } else if (base == "stochastic_quantize") {
    const auto x = kcase::floats(kcase::kSeed + 14, n, -1.5f, 1.5f);
    Dev dx(x), e(kcase::floats(kcase::kSeed + 15, n, -0.5f, 0.5f));
    Dev m(kcase::floats(kcase::kSeed + 16, n, -0.2f, 0.2f)), b(kcase::floats(kcase::kSeed + 17, n, 0.0f, 0.3f));
    Dev bits(np / 8);
    hvdc::BirderMoments mom;
    mom.m = m.as<float>();
    mom.b = b.as<float>();
    hvdc::UniformSource u;
    u.key = kcase::philox_key();
    u.offset = kcase::kPhiloxOffset;
    const bool with = name == "stochastic_quantize/moments";
    hvdc::cuda::stochastic_quantize(dx.as<float>(), e.as<float>(), with ? &mom : nullptr, n, np, u,
                                    bits.as<uint8_t>(), st);
    out("bits", bits), out("error", e);
    if (with) out("m", m), out("b", b);
  } else if (base == "stochastic_server_quantize") {
    const kcase::ServerInputs in = kcase::server_inputs(n);
    Dev bits(in.bits), e(in.error), obits(np / 8);
    hvdc::UniformSource u;
    u.key = kcase::philox_key();
    u.offset = kcase::kPhiloxOffset;
    hvdc::cuda::stochastic_server_quantize(bits.as<uint8_t>(), np / 8, kcase::kRanks, e.as<float>(), n,
                                           np, u, obits.as<uint8_t>(), st);
    out("bits", obits), out("error", e);
  } else if (base == "sign_unpack") {
    Dev bits(kcase::random_bytes(kcase::kSeed + 18, np / 8)), y(4 * n);
    hvdc::cuda::sign_unpack(bits.as<uint8_t>(), y.as<float>(), n, st);
    out("out", y);
  } else if (base == "widen_to_float") {
    Dev h(kcase::random_bytes(kcase::kSeed + 19, 2 * n)), y(4 * n);
    hvdc::cuda::widen_to_float(h.p, dt, y.as<float>(), n, st);
    out("out", y);
  } else if (base == "narrow_from_float") {
    Dev f(kcase::floats(kcase::kSeed + 20, n, -70000.0f, 70000.0f)), y(2 * n);
    hvdc::cuda::narrow_from_float(f.as<float>(), kcase::kNarrowScale, y.p, dt, n, st);
    out("out", y);
  } else if (base == "onebit_local_momentum") {
    const kcase::UpdateInputs in = kcase::update_inputs(n);
    Dev g(in.g), m(in.m), x(in.x), work(4 * n);
    hvdc::cuda::onebit_local_momentum(g.as<float>(), m.as<float>(), x.as<float>(), n, 1.0f - kcase::kAdamB1,
                                      kcase::kAdamL2, kcase::kAdamB1, work.as<float>(), st);
    out("work", work);
  } else if (base == "onebit_adam_apply") {
    const kcase::UpdateInputs in = kcase::update_inputs(n);
    Dev work(in.work), denom(in.denom), m(in.m), x(in.x);
    hvdc::cuda::onebit_adam_apply(work.as<float>(), denom.as<float>(), n, kcase::kAdamDecay,
                                  kcase::kAdamValue, kcase::kAdamFloor, kcase::kAdamCap, m.as<float>(),
                                  x.as<float>(), st);
    out("m", m), out_nan("x", x);
  } else if (base == "onebit_lamb_moments") {
    const kcase::UpdateInputs in = kcase::update_inputs(n);
    Dev work(in.work), denom(in.denom), m(in.m), fresh(in.fresh), rmax(4);
    Dev ws(4 * hvdc::cuda::onebit_lamb_workspace_floats(n));
    hvdc::cuda::onebit_lamb_moments(work.as<float>(), denom.as<float>(), n, -kcase::kAdamB1,
                                    1.0f - kcase::kAdamB1, kcase::kLambB2, 1.0f - kcase::kLambB2,
                                    kcase::kLambSqrtBc2, kcase::kLambFloor, kcase::kLambEps, m.as<float>(),
                                    fresh.as<float>(), rmax.as<float>(), ws.as<float>(), st);
    out("m", m), out("fresh", fresh), out("ratio_max", rmax);
  } else if (base == "onebit_lamb_apply") {
    const kcase::UpdateInputs in = kcase::update_inputs(n);
    Dev m(in.m), denom(in.denom), x(in.x);
    hvdc::cuda::onebit_lamb_apply(m.as<float>(), denom.as<float>(), n, kcase::kLambBc1, kcase::kLambWd,
                                  kcase::kLambScale, x.as<float>(), st);
    out_nan("x", x);
  } else if (base == "adasum_dot_norms") {
    const kcase::AdasumInputs in = kcase::adasum_inputs(n, dt);
    Dev l(in.left), rt(in.right), dots(24), ws(8 * hvdc::cuda::adasum_workspace_doubles(n));
    hvdc::cuda::adasum_dot_norms(l.p, rt.p, dt, n, dots.as<double>(), ws.as<double>(), st);
    out("dots", dots);
  } else if (base == "adasum_combine") {
    const kcase::AdasumInputs in = kcase::adasum_inputs(n, dt);
    Dev l(in.left), rt(in.right), y(n * kcase::elem_size(dt));
    hvdc::cuda::adasum_combine(l.p, 0.75, rt.p, 1.0625, y.p, dt, n, st);
    out("out", y);
  } else if (base == "widen_to_double") {
    const kcase::AdasumInputs in = kcase::adasum_inputs(n, dt);
    Dev l(in.left), y(8 * n);
    hvdc::cuda::widen_to_double(l.p, dt, y.as<double>(), n, st);
    out("out", y);
  } else if (base == "narrow_from_double") {
    const auto f = kcase::floats(kcase::kSeed + 21, n, -4.0f, 4.0f);
    Dev src(std::vector<double>(f.begin(), f.end())), y(n * kcase::elem_size(dt));
    hvdc::cuda::narrow_from_double(src.as<double>(), 3.0, y.p, dt, n, st);
    out("out", y);
  } else if (base == "bernoulli_mask") {
    Dev mask(n);
    hvdc::cuda::bernoulli_mask_draw(kcase::kMaskSeed, kcase::kMaskStep, kcase::kMaskRatio, 5, n,
                                    mask.as<uint8_t>(), st);
    out("mask", mask);
  } else if (base == "cyclic_mask") {
    // The permutation's ranks are drawn on the host (masks.cc) and copied over; the chunk of the
    // step as masks.cc's cyclic_mask computes it.
    const int64_t numel = n + 5;
    const std::vector<int64_t> pi = hvdc::cyclic_permutation(numel, kcase::kMaskSeed);
    std::vector<uint32_t> ranks(static_cast<size_t>(numel));
    for (size_t j = 0; j < pi.size(); ++j) ranks[static_cast<size_t>(pi[j])] = static_cast<uint32_t>(j);
    const int64_t nc = std::max<int64_t>(1, static_cast<int64_t>(1.0 / kcase::kMaskRatio));
    const int64_t cs = (numel + nc - 1) / nc, lo = (kcase::kMaskStep % nc) * cs;
    const int64_t len = std::max<int64_t>(0, std::min(cs, numel - lo));
    Dev dranks(std::vector<uint32_t>(ranks.begin() + 5, ranks.end())), mask(n);
    hvdc::cuda::cyclic_mask_compare(dranks.as<uint32_t>(), static_cast<uint32_t>(lo),
                                    static_cast<uint32_t>(len), n, mask.as<uint8_t>(), st);
    out("mask", mask);
  } else if (base == "mask_gather" || base == "mask_scatter") {
    const std::vector<uint8_t> hmask = kcase::case_mask(n);
    const int64_t count = kcase::count_of(hmask);
    const int64_t es = static_cast<int64_t>(kcase::elem_size(dt));
    Dev mask(hmask), got(8), ws(8 * hvdc::cuda::mask_workspace_int64(n));
    if (base == "mask_gather") {
      Dev src(kcase::random_bytes(kcase::kSeed + 24, n * es)), dst(count * es);
      hvdc::cuda::mask_gather(src.p, mask.as<uint8_t>(), n, count, static_cast<size_t>(es), dst.p,
                              got.as<int64_t>(), ws.as<int64_t>(), st);
      out("dst", dst), out("count", got);
    } else {
      Dev compact(kcase::random_bytes(kcase::kSeed + 25, count * es));
      Dev dst(kcase::random_bytes(kcase::kSeed + 26, n * es));
      hvdc::cuda::mask_scatter(compact.p, mask.as<uint8_t>(), n, count, static_cast<size_t>(es), dst.p,
                               got.as<int64_t>(), ws.as<int64_t>(), st);
      out("dst", dst), out("used", got);
    }
  } else if (base == "slamb_momentum") {
    const kcase::SlambInputs in = kcase::slamb_inputs(n);
    Dev m(in.m), g(in.g), work(4 * n);
    hvdc::cuda::slamb_momentum(m.as<float>(), g.as<float>(), n, kcase::kSlambB1, work.as<float>(), st);
    out("work", work);
  } else if (base == "slamb_momentum_gather") {
    const kcase::SlambInputs in = kcase::slamb_inputs(n);
    const int64_t count = kcase::count_of(in.mask);
    Dev m(in.m), g(in.g), mask(in.mask), o(4 * count), got(8), ws(8 * hvdc::cuda::mask_workspace_int64(n));
    hvdc::cuda::slamb_momentum_gather(m.as<float>(), g.as<float>(), mask.as<uint8_t>(), n, kcase::kSlambB1,
                                      o.as<float>(), count, got.as<int64_t>(), ws.as<int64_t>(), st);
    out("out", o), out("count", got);
  } else if (base == "slamb_moments" || base == "slamb_local_moments") {
    const kcase::SlambInputs in = kcase::slamb_inputs(n);
    Dev work(in.work), g(in.g), mask(in.mask), m(in.m), v(in.v), sum(8);
    Dev ws(8 * hvdc::cuda::slamb_workspace_doubles(n));
    if (base == "slamb_moments")
      hvdc::cuda::slamb_moments(work.as<float>(), g.as<float>(), n, kcase::kSlambB2, m.as<float>(), v.as<float>(),
                                sum.as<double>(), ws.as<double>(), st);
    else
      hvdc::cuda::slamb_local_moments(g.as<float>(), mask.as<uint8_t>(), n, kcase::kSlambB1, kcase::kSlambB2,
                                      m.as<float>(), v.as<float>(), sum.as<double>(), ws.as<double>(), st);
    out("m", m), out("v", v), out("sum_v", sum);
  } else if (base == "slamb_apply") {
    const kcase::SlambInputs in = kcase::slamb_inputs(n);
    Dev u(in.u), c(in.c), x(in.x);
    hvdc::cuda::slamb_apply(u.as<float>(), c.as<float>(), n, kcase::kSlambDphi, kcase::kSlambPhiMin,
                            kcase::kSlambClipMin, kcase::kSlambClipMax, kcase::kSlambDeta, kcase::kSlambEtaMin,
                            x.as<float>(), st);
    out("x", x);
  } else if (base == "topk_select" || base == "randomk_select") {
    const bool top = base == "topk_select";
    const int64_t k = top ? kcase::topk_k(n) : kcase::randomk_k(n);
    Dev c(kcase::topk_input(n)), idx(4 * k), ws(hvdc::cuda::select_workspace_bytes(n));
    if (top)
      hvdc::cuda::topk_select(c.as<float>(), n, k, idx.as<uint32_t>(), ws.p, st);
    else
      hvdc::cuda::randomk_select(n, k, kcase::kMaskSeed, static_cast<uint32_t>(kcase::kMaskStep), idx.as<uint32_t>(),
                                 kcase::kPhiloxOffset, ws.p, st);
    out("idx", idx);
  } else {
    throw std::invalid_argument("unknown kernel case " + name);
  }
  check(cudaStreamSynchronize(st), name.c_str());
  return r;
}

// Fixture digests: key "<case> <n> <output>" -> "<bytes> <digest>".
std::map<std::string, std::string> read_fixtures(const std::string& path) {
  std::map<std::string, std::string> m;
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot read fixtures " + path);
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    std::istringstream s(line);
    std::string c, n, o, bytes, dig;
    s >> c >> n >> o >> bytes >> dig;
    m[c + " " + n + " " + o] = bytes + " " + dig;
  }
  return m;
}

std::string first_difference(const std::vector<uint8_t>& a, const std::vector<uint8_t>& b) {
  if (a.size() != b.size())
    return std::to_string(a.size()) + " bytes on the GPU, " + std::to_string(b.size()) + " on the CPU";
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i] != b[i]) {
      char buf[96];
      std::snprintf(buf, sizeof buf, "first difference at byte %zu: GPU %02x, CPU %02x", i, a[i], b[i]);
      return buf;
    }
  return "";
}

// Compares one case at one size; prints its ROW; returns whether it passed.
bool run_case(const std::string& name, int64_t n, const std::map<std::string, std::string>* fixtures,
              cudaStream_t st) {
  const Result cpu = kcase::cpu_case(name, n);
  Result gpu;
  std::string detail;
  bool ok = true;
  try {
    gpu = gpu_case(name, n, st);
  } catch (const std::exception& e) {
    std::printf("ROW\tkernel\t%s\t%" PRId64 "\tFAIL\t%s\n", name.c_str(), n, e.what());
    return false;
  }
  int fixture_checked = 0;
  for (size_t k = 0; k < cpu.outputs.size(); ++k) {
    const auto& c = cpu.outputs[k];
    const auto& g = gpu.outputs.at(k);
    const std::string diff = first_difference(g.bytes, c.bytes);
    if (!diff.empty()) {
      ok = false;
      detail += c.name + ": " + diff + "; ";
    }
    if (fixtures != nullptr) {
      char want[64];
      std::snprintf(want, sizeof want, "%zu %016" PRIx64, g.bytes.size(), kcase::digest(g.bytes));
      const auto it = fixtures->find(name + " " + std::to_string(n) + " " + c.name);
      if (it == fixtures->end()) {
        detail += c.name + ": no fixture; ";
      } else if (it->second != want) {
        ok = false;
        detail += c.name + ": differs from the CPU fixture; ";
      } else {
        ++fixture_checked;
      }
    }
  }
  std::string outs;
  for (const auto& o : cpu.outputs) outs += (outs.empty() ? "" : ",") + o.name;
  if (detail.empty()) detail = outs + " equal" + (fixtures ? " (and " + std::to_string(fixture_checked) + " fixtures)" : "");
  for (const auto& note : cpu.notes) detail += "; " + note;
  std::printf("ROW\tkernel\t%s\t%" PRId64 "\t%s\t%s\n", name.c_str(), n, ok ? "PASS" : "FAIL", detail.c_str());
  std::fflush(stdout);
  return ok;
}

// Median milliseconds of `reps` runs of fn on the stream (CUDA events), after two warm-up runs.
template <typename F>
float time_ms(cudaStream_t st, F fn, int reps = 20) {
  for (int i = 0; i < 2; ++i) fn();
  std::vector<float> t;
  cudaEvent_t a, b;
  check(cudaEventCreate(&a), "event");
  check(cudaEventCreate(&b), "event");
  for (int i = 0; i < reps; ++i) {
    cudaEventRecord(a, st);
    fn();
    cudaEventRecord(b, st);
    check(cudaEventSynchronize(b), "timing");
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    t.push_back(ms);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// Each kernel at n = 16M float32 against a device copy of the bytes it reads and writes.
void bench(cudaStream_t st) {
  const int64_t n = int64_t{1} << 24, np = n;
  Dev x(kcase::floats(1, n, -1, 1)), e(kcase::floats(2, n, -0.1f, 0.1f)), m(kcase::floats(3, n, -0.1f, 0.1f));
  Dev b(kcase::floats(4, n, 0.0f, 0.3f)), den(kcase::floats(5, n, 0.01f, 0.2f)), w(kcase::floats(6, n, -0.2f, 0.2f));
  Dev bits(np / 8), sc(4), ss(8), ws(8 * hvdc::cuda::onebit_workspace_doubles(np)), mask(n), dots(24);
  Dev ranks(4 * n), copy_src(24 * n), copy_dst(24 * n), lws(4 * hvdc::cuda::onebit_lamb_workspace_floats(n));
  Dev half(2 * n), aws(8 * hvdc::cuda::adasum_workspace_doubles(n));
  Dev mws(8 * hvdc::cuda::mask_workspace_int64(n)), cnt(8), sws(8 * hvdc::cuda::slamb_workspace_doubles(n)), sv(8);
  Dev sel_ws(hvdc::cuda::select_workspace_bytes(n));
  hvdc::UniformSource u;
  u.key = kcase::philox_key();
  hvdc::BirderMoments mom;
  mom.m = m.as<float>();
  mom.b = b.as<float>();
  struct K {
    const char* name;
    double bytes;  // read + written, as a device copy moves them
    std::function<void()> fn;
  };
  const double f = 4.0 * n;
  std::vector<K> ks = {
      {"onebit_compress f32 (2 passes)", 5 * f + n / 8.0, [&] {
         hvdc::cuda::onebit_compress(x.p, DType::kFloat32, e.as<float>(), n, np, bits.as<uint8_t>(),
                                     sc.as<float>(), ss.as<double>(), ws.as<double>(), st);
       }},
      {"stochastic_quantize (Philox)", 3 * f + n / 8.0, [&] {
         hvdc::cuda::stochastic_quantize(x.as<float>(), e.as<float>(), nullptr, n, np, u, bits.as<uint8_t>(), st);
       }},
      {"stochastic_quantize + moments", 7 * f + n / 8.0, [&] {
         hvdc::cuda::stochastic_quantize(x.as<float>(), e.as<float>(), &mom, n, np, u, bits.as<uint8_t>(), st);
       }},
      {"bernoulli_mask k=0.1", 1.0 * n, [&] {
         hvdc::cuda::bernoulli_mask_draw(7, 3, 0.1, 0, n, mask.as<uint8_t>(), st);
       }},
      {"cyclic_mask_compare", f + n, [&] {
         hvdc::cuda::cyclic_mask_compare(ranks.as<uint32_t>(), 0, static_cast<uint32_t>(n / 10), n,
                                         mask.as<uint8_t>(), st);
       }},
      {"onebit_local_momentum", 4 * f, [&] {
         hvdc::cuda::onebit_local_momentum(w.as<float>(), m.as<float>(), x.as<float>(), n, 0.1f, 0.001f, 0.9f,
                                           b.as<float>(), st);
       }},
      {"onebit_adam_apply", 5 * f, [&] {
         hvdc::cuda::onebit_adam_apply(w.as<float>(), den.as<float>(), n, 1.0f, -1e-3f, -INFINITY, 10.0f,
                                       m.as<float>(), x.as<float>(), st);
       }},
      {"onebit_lamb_moments", 6 * f, [&] {
         hvdc::cuda::onebit_lamb_moments(w.as<float>(), den.as<float>(), n, -0.9f, 0.1f, 0.999f, 0.001f, 0.3f,
                                         0.0f, 1e-6f, m.as<float>(), b.as<float>(), sc.as<float>(),
                                         lws.as<float>(), st);
       }},
      {"onebit_lamb_apply", 4 * f, [&] {
         hvdc::cuda::onebit_lamb_apply(m.as<float>(), den.as<float>(), n, 1.0f, 0.0f, -1e-9f, x.as<float>(), st);
       }},
      {"adasum_dot_norms f32", 2 * f, [&] {
         hvdc::cuda::adasum_dot_norms(x.p, w.p, DType::kFloat32, n, dots.as<double>(), aws.as<double>(), st);
       }},
      {"bernoulli_mask + mask_gather f32 k=0.1", 2.0 * n + 0.2 * f, [&] {
         hvdc::cuda::bernoulli_mask_draw(7, 3, 0.1, 0, n, mask.as<uint8_t>(), st);
         hvdc::cuda::mask_gather(x.p, mask.as<uint8_t>(), n, n, 4, copy_dst.p, cnt.as<int64_t>(),
                                 mws.as<int64_t>(), st);
       }},
      {"slamb_local_moments k=0.1", 5 * f + n, [&] {
         hvdc::cuda::slamb_local_moments(w.as<float>(), mask.as<uint8_t>(), n, 0.9f, 0.999f, m.as<float>(),
                                         b.as<float>(), sv.as<double>(), sws.as<double>(), st);
       }},
      {"slamb_apply", 4 * f, [&] {
         hvdc::cuda::slamb_apply(w.as<float>(), den.as<float>(), n, 0.8f, 0.1f, 0.2f, 0.7f, -1e-9f, 0.0f,
                                 x.as<float>(), st);
       }},
      {"topk_select k=0.01", 4.0 * f, [&] {
         hvdc::cuda::topk_select(x.as<float>(), n, n / 100, ranks.as<uint32_t>(), sel_ws.p, st);
       }},
      {"randomk_select k=0.01", 2.0 * n, [&] {
         hvdc::cuda::randomk_select(n, n / 100, 7, 3, ranks.as<uint32_t>(), 0, sel_ws.p, st);
       }},
      {"narrow_from_float bf16", f + 2.0 * n, [&] {
         hvdc::cuda::narrow_from_float(x.as<float>(), 1.0f, half.p, DType::kBFloat16, n, st);
       }},
  };
  for (const K& k : ks) {
    const float ms = time_ms(st, k.fn);
    const size_t half_bytes = static_cast<size_t>(k.bytes / 2);
    const float copy = time_ms(st, [&] {
      cudaMemcpyAsync(copy_dst.p, copy_src.p, half_bytes, cudaMemcpyDeviceToDevice, st);
    });
    std::printf("ROW\tspeed\t%s\t%" PRId64 "\t%.4f\t%.0f GB/s; device copy of the same bytes %.4f ms (%.2fx)\n",
                k.name, n, ms, k.bytes / (ms * 1e-3) / 1e9, copy, ms / copy);
    std::fflush(stdout);
  }
}

}  // namespace

int main(int argc, char** argv) {
  std::vector<int64_t> sizes = {1, 7, 8, 4095, (int64_t{1} << 24) + 3};
  std::string fixture_path;
  bool do_bench = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--fixtures" && i + 1 < argc) {
      fixture_path = argv[++i];
    } else if (a == "--sizes" && i + 1 < argc) {
      sizes.clear();
      std::stringstream in(argv[++i]);
      for (std::string t; std::getline(in, t, ',');) sizes.push_back(std::stoll(t));
    } else if (a == "--bench") {
      do_bench = true;
    } else {
      std::fprintf(stderr, "usage: %s [--fixtures FILE] [--sizes n,n,...] [--bench]\n", argv[0]);
      return 2;
    }
  }
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("ROW\tkernel\tall\t-\tSKIP\tno CUDA device\n");
    return 3;
  }
  cudaDeviceProp prop;
  check(cudaGetDeviceProperties(&prop, 0), "device properties");
  std::printf("ROW\tdevice\t%s\t-\tINFO\tsm_%d%d, %.0f GiB\n", prop.name, prop.major, prop.minor,
              prop.totalGlobalMem / 1073741824.0);
  cudaStream_t st;
  check(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking), "stream");
  std::map<std::string, std::string> fixtures;
  if (!fixture_path.empty()) fixtures = read_fixtures(fixture_path);
  int failed = 0, passed = 0;
  for (const std::string& name : kcase::case_names())
    for (int64_t n : sizes)
      (run_case(name, n, fixture_path.empty() ? nullptr : &fixtures, st) ? passed : failed) += 1;
  std::printf("%d passed, %d failed\n", passed, failed);
  if (do_bench) bench(st);
  cudaStreamDestroy(st);
  return failed ? 1 : 0;
}
