// The assertion helper of the C++ tests (no test framework: nothing to install). A failed check
// prints what failed and goes on, so that one run names every failing case; main() returns
// non-zero when any check failed, which fails `make cpptest` and so `make test`.
#pragma once
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <mutex>
#include <sstream>
#include <string>
#include <vector>

#include "hvdc/errors.h"

namespace hvdc {

// Failed checks of one test program. Thread-safe: rank threads check their own results.
class Failures {
 public:
  // Records a failure when `ok` is false; `what` says which case, rank and size, and by how much.
  bool check(bool ok, const std::string& what) {
    if (ok) return true;
    std::lock_guard<std::mutex> lock(mu_);
    ++count_;
    // The first failures tell the story; thousands more would only bury them.
    if (count_ <= kPrinted) std::fprintf(stderr, "FAIL: %s\n", what.c_str());
    return false;
  }
  // Records that a case ran (for the summary line).
  void ran() {
    std::lock_guard<std::mutex> lock(mu_);
    ++cases_;
  }
  // Prints the summary of `program` and returns its exit status.
  int finish(const char* program) {
    std::lock_guard<std::mutex> lock(mu_);
    std::fprintf(count_ ? stderr : stdout, "%s: %d case(s), %d failed check(s)\n", program, cases_,
                 count_);
    return count_ == 0 ? 0 : 1;
  }

 private:
  static constexpr int kPrinted = 50;
  std::mutex mu_;
  int count_ = 0;
  int cases_ = 0;
};

// Concatenates the streamable arguments: check messages are built inline.
template <typename... Args>
std::string str(const Args&... args) {
  std::ostringstream out;
  out.precision(17);
  (out << ... << args);
  return out.str();
}

// Checks |got[i] - want[i]| <= tol(i) for every i, a NaN matching only a NaN (as the Python tests
// compare with the reference). One failure per array: where first, how many, the largest error.
template <typename Tol>
bool check_close(Failures& f, const std::string& what, const std::vector<double>& got,
                 const std::vector<double>& want, Tol tol) {
  if (!f.check(got.size() == want.size(),
               str(what, ": ", got.size(), " elements, want ", want.size())))
    return false;
  size_t bad = 0, first = 0;
  double worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const bool nan_ok = std::isnan(got[i]) == std::isnan(want[i]);
    const double err = std::isnan(want[i]) ? 0.0 : std::fabs(got[i] - want[i]);
    if (nan_ok && !(err > tol(i))) continue;  // err may be NaN (got NaN, want finite): bad
    if (bad++ == 0) first = i;
    if (!(err <= worst)) worst = err;
  }
  return f.check(bad == 0, str(what, ": ", bad, " element(s) of ", got.size(),
                               " differ from the reference, first at ", first, ": got ",
                               bad ? got[first] : 0.0, ", want ", bad ? want[first] : 0.0,
                               ", tolerance ", bad ? tol(first) : 0.0, " (max error ", worst, ")"));
}

// What a collective threw on one rank, by the core's exception classes (errors.h): the type and
// the text ("" for none), so that each rank's outcome can be checked after the threads join.
struct Outcome {
  std::string type, message;
};

inline Outcome attempt(const std::function<void()>& call) {
  try {
    call();
    return {"", ""};
  } catch (const MismatchError& e) {
    return {"MismatchError", e.what()};
  } catch (const UsageError& e) {
    return {"UsageError", e.what()};
  } catch (const CommTimeoutError& e) {
    return {"CommTimeoutError", e.what()};
  }
}

// Same bytes (the ranks of a collective must hold identical results).
inline bool same_bits(const std::vector<double>& a, const std::vector<double>& b) {
  return a.size() == b.size() &&
         (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(double)) == 0);
}

// Same bits (a fused kernel against the backend path's steps: NaN payloads and signed zeros included).
inline bool same_bits(float a, float b) { return std::memcmp(&a, &b, sizeof a) == 0; }

}  // namespace hvdc
