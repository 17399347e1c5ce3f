// Golden fixtures of the GPU kernel check, written by the CPU core where no GPU is (specs/gpu.md,
// "Testing without a GPU"): one line per output of every case of kernel_cases.h at each size,
//   <case> <n> <output> <bytes> <fnv1a64 hex>
// and "# <case> <n> <note>" lines for the sum-order notes. test_cuda_kernels --fixtures FILE
// compares the device's outputs against these digests.
// Usage: write_kernel_fixtures OUT [n,n,...]   (default sizes 1,7,8,4095,16777219)
#include <cinttypes>
#include <cstdio>
#include <sstream>

#include "kernel_cases.h"

int main(int argc, char** argv) {
  if (argc < 2) {
    std::fprintf(stderr, "usage: %s OUT [n,n,...]\n", argv[0]);
    return 2;
  }
  std::vector<int64_t> sizes = {1, 7, 8, 4095, (int64_t{1} << 24) + 3};
  if (argc > 2) {
    sizes.clear();
    std::stringstream in(argv[2]);
    for (std::string t; std::getline(in, t, ',');) sizes.push_back(std::stoll(t));
  }
  FILE* f = std::fopen(argv[1], "w");
  if (f == nullptr) {
    std::perror(argv[1]);
    return 1;
  }
  int lines = 0;
  for (const std::string& name : kcase::case_names()) {
    for (int64_t n : sizes) {
      const kcase::Result r = kcase::cpu_case(name, n);
      for (const auto& o : r.outputs) {
        std::fprintf(f, "%s %" PRId64 " %s %zu %016" PRIx64 "\n", name.c_str(), n, o.name.c_str(),
                     o.bytes.size(), kcase::digest(o.bytes));
        ++lines;
      }
      for (const auto& note : r.notes) std::fprintf(f, "# %s %" PRId64 " %s\n", name.c_str(), n, note.c_str());
    }
  }
  std::fclose(f);
  std::printf("wrote %d digests of %zu cases at %zu sizes to %s\n", lines, kcase::case_names().size(),
              sizes.size(), argv[1]);
  return 0;
}
