// Reader of the vectors that cpp/tests/make_fixtures.py computes with the NumPy reference
// (hvd_compress/reference) for the C++ tests. The file is a sequence of named float64 arrays:
//   magic "HVDCFIX1", then per array: uint32 name length, the name's bytes, uint64 count,
//   count little-endian float64 values.
// Names are paths, "<collective>/<case>/<what>", and each case's "meta" array says what it is, so
// that the case list lives in the generator only.
#pragma once
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "check.h"
#include "hvdc/dtype.h"

namespace hvdc {

// Fixture values (exactly representable in `dtype`: the generator rounds them) as a buffer of
// that dtype. The narrowing goes through float32, which is exact for such values.
inline std::vector<unsigned char> to_dtype(const std::vector<double>& v, DType dtype) {
  std::vector<unsigned char> out(v.size() * dtype_size(dtype));
  for (size_t i = 0; i < v.size(); ++i) {
    const float f = static_cast<float>(v[i]);
    if (dtype == DType::kFloat64) {
      std::memcpy(out.data() + 8 * i, &v[i], 8);
    } else if (dtype == DType::kFloat32) {
      std::memcpy(out.data() + 4 * i, &f, 4);
    } else {
      const uint16_t h = dtype == DType::kFloat16 ? float_to_half(f) : float_to_bf16(f);
      std::memcpy(out.data() + 2 * i, &h, 2);
    }
  }
  return out;
}

// A buffer of `n` elements of `dtype`, widened exactly to double for comparison.
inline std::vector<double> to_double(const void* data, DType dtype, int64_t n) {
  std::vector<double> out(static_cast<size_t>(n));
  const auto* p = static_cast<const unsigned char*>(data);
  for (size_t i = 0; i < out.size(); ++i) {
    if (dtype == DType::kFloat64) {
      std::memcpy(&out[i], p + 8 * i, 8);
    } else if (dtype == DType::kFloat32) {
      float f;
      std::memcpy(&f, p + 4 * i, 4);
      out[i] = f;
    } else {
      uint16_t h;
      std::memcpy(&h, p + 2 * i, 2);
      out[i] = dtype == DType::kFloat16 ? half_to_float(h) : bf16_to_float(h);
    }
  }
  return out;
}

class Fixtures {
 public:
  explicit Fixtures(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    char magic[8];
    if (!in.read(magic, 8) || std::memcmp(magic, "HVDCFIX1", 8) != 0)
      throw std::runtime_error(path + ": not a fixture file (run cpp/tests/make_fixtures.py)");
    uint32_t name_len = 0;
    while (in.read(reinterpret_cast<char*>(&name_len), sizeof(name_len))) {
      std::string name(name_len, '\0');
      uint64_t count = 0;
      in.read(name.data(), name_len);
      in.read(reinterpret_cast<char*>(&count), sizeof(count));
      std::vector<double> values(count);
      in.read(reinterpret_cast<char*>(values.data()), static_cast<std::streamsize>(count * 8));
      if (!in) throw std::runtime_error(path + ": truncated at " + name);
      arrays_[name] = std::move(values);
    }
  }

  const std::vector<double>& at(const std::string& name) const {
    const auto it = arrays_.find(name);
    if (it == arrays_.end()) throw std::runtime_error("fixture array " + name + " is missing");
    return it->second;
  }

  // The case names under `collective` ("adasum/<case>/meta" -> "<case>"), in file order's sort.
  std::vector<std::string> cases(const std::string& collective) const {
    std::vector<std::string> out;
    const std::string prefix = collective + "/", suffix = "/meta";
    for (const auto& [name, values] : arrays_)
      if (name.compare(0, prefix.size(), prefix) == 0 && name.size() > prefix.size() + suffix.size() &&
          name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0)
        out.push_back(name.substr(prefix.size(), name.size() - prefix.size() - suffix.size()));
    return out;
  }

 private:
  std::map<std::string, std::vector<double>> arrays_;
};

// The main() of a fixture-driven test: `program FIXTURES` runs run_case(failures, fixtures, name)
// for every case of `collective` (at least `min_cases` of them: a file that lost its cases must not
// pass as an empty success), then `also` (checks that need no fixture), and returns the exit
// status.
inline int run_fixture_cases(
    int argc, char** argv, const char* program, const std::string& collective, size_t min_cases,
    const std::function<void(Failures&, const Fixtures&, const std::string&)>& run_case,
    const std::function<void(Failures&)>& also = nullptr) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: %s FIXTURES (written by cpp/tests/make_fixtures.py)\n", argv[0]);
    return 2;
  }
  Failures f;
  std::unique_ptr<Fixtures> loaded;
  try {
    loaded = std::make_unique<Fixtures>(argv[1]);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "%s: %s\n", program, e.what());  // a message, not std::terminate
    return 2;
  }
  const Fixtures& fx = *loaded;
  const std::vector<std::string> cases = fx.cases(collective);
  f.check(cases.size() >= min_cases, str("only ", cases.size(), " ", collective, " cases in ", argv[1]));
  for (const std::string& name : cases) run_case(f, fx, name);
  if (also) also(f);
  return f.finish(program);
}

}  // namespace hvdc
