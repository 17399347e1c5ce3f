// dense_allreduce (cpp/src/dense_allreduce.cc) with Horovod's Min, Max and Product and with the
// integer dtypes, and allgather_rows (cpp/src/allgather.cc), at n = 1..5 thread ranks: every rank
// gets exactly the element-wise reduction of the ranks' inputs (integer Average as Horovod's: the
// sum times 1/n in double, truncated toward zero), and the rows of every rank in rank order when
// ranks contribute different row counts (none included).
#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>
#include <limits>
#include <string>
#include <vector>

#include "check.h"
#include "hvdc/allgather.h"
#include "hvdc/dense_allreduce.h"
#include "thread_communicator.h"

namespace hvdc {
namespace {

constexpr double kHangS = 60;
constexpr int64_t kNumel = 37;

// Rank r's input element i: small signed values (so Product stays exact in every dtype), with
// 0 and negatives; unsigned dtypes take the absolute value.
double input(int r, int64_t i, bool is_unsigned) {
  const double v = static_cast<double>(((r + 2) * (i + 3) * 7) % 9) - 4.0;
  return is_unsigned ? std::fabs(v) : v;
}

template <typename T>
double expected(int n, int64_t i, ReduceOp op) {
  const bool uns = std::is_unsigned_v<T>;
  double acc = input(0, i, uns);
  for (int r = 1; r < n; ++r) {
    const double v = input(r, i, uns);
    switch (op) {
      case ReduceOp::kSum:
      case ReduceOp::kAverage: acc += v; break;
      case ReduceOp::kMin: acc = std::min(acc, v); break;
      case ReduceOp::kMax: acc = std::max(acc, v); break;
      case ReduceOp::kProduct: acc *= v; break;
      default: break;
    }
  }
  if (op == ReduceOp::kAverage) {
    if constexpr (std::is_integral_v<T>)
      return static_cast<double>(static_cast<T>((1.0 / n) * acc));  // Horovod: truncated
    else
      return acc / n;
  }
  return acc;
}

template <typename T>
void check_op(Failures& f, int n, DType dtype, ReduceOp op) {
  const std::string label = std::string(reduce_op_name(op)) + " " + dtype_name(dtype) +
                            " n=" + std::to_string(n);
  std::vector<std::vector<double>> got(static_cast<size_t>(n));
  ThreadWorld world(n, kHangS);
  const std::vector<std::string> failed = world.run([&](Communicator& comm) {
    std::vector<T> buf(kNumel);
    for (int64_t i = 0; i < kNumel; ++i)
      buf[i] = static_cast<T>(input(comm.rank(), i, std::is_unsigned_v<T>));
    TensorView t;
    t.data = buf.data();
    t.numel = kNumel;
    t.dtype = dtype;
    dense_allreduce(comm, t, op);
    got[comm.rank()].assign(buf.begin(), buf.end());
  });
  for (int r = 0; r < n; ++r) {
    f.check(failed[r].empty(), label + " rank " + std::to_string(r) + " threw: " + failed[r]);
    if (!failed[r].empty()) continue;
    std::vector<double> want(kNumel);
    for (int64_t i = 0; i < kNumel; ++i) want[i] = expected<T>(n, i, op);
    // Products of up to 5 values in [-4, 4] are exact in every dtype tested with them except
    // float32's average (1/n rounding): allow one float ulp there, nothing elsewhere.
    const double tol = std::is_integral_v<T> ? 0.0 : 1e-5;
    check_close(f, label + " rank " + std::to_string(r), got[r], want,
                [&](size_t i) { return tol * std::max(1.0, std::fabs(want[i])); });
  }
  f.ran();
}

template <typename T>
void check_all_ops(Failures& f, int n, DType dtype) {
  for (ReduceOp op : {ReduceOp::kAverage, ReduceOp::kSum, ReduceOp::kMin, ReduceOp::kMax,
                      ReduceOp::kProduct}) {
    // int8 and uint8 products of 5 ranks overflow: they wrap as in MPI, not checked here.
    if (op == ReduceOp::kProduct && dtype_size(dtype) == 1 && n > 3) continue;
    check_op<T>(f, n, dtype, op);
  }
}

// Rank r sends r rows (rank 0 none) of 3 int32 each, value 100 * r + row * 3 + col.
void check_allgather(Failures& f, int n) {
  const std::string label = "allgather_rows n=" + std::to_string(n);
  constexpr int kCols = 3;
  std::vector<std::vector<int32_t>> got(static_cast<size_t>(n));
  std::vector<std::vector<int64_t>> counts(static_cast<size_t>(n));
  ThreadWorld world(n, kHangS);
  const std::vector<std::string> failed = world.run([&](Communicator& comm) {
    const int r = comm.rank();
    std::vector<int32_t> mine(static_cast<size_t>(r) * kCols);
    for (size_t k = 0; k < mine.size(); ++k) mine[k] = 100 * r + static_cast<int32_t>(k);
    std::vector<unsigned char> out;
    allgather_rows(comm, mine.data(), r, kCols * sizeof(int32_t), out, counts[r]);
    got[r].resize(out.size() / sizeof(int32_t));
    if (!out.empty()) std::memcpy(got[r].data(), out.data(), out.size());
  });
  std::vector<int32_t> want;
  for (int r = 0; r < n; ++r)
    for (int k = 0; k < r * kCols; ++k) want.push_back(100 * r + k);
  for (int r = 0; r < n; ++r) {
    f.check(failed[r].empty(), label + " rank " + std::to_string(r) + " threw: " + failed[r]);
    f.check(got[r] == want, label + " rank " + std::to_string(r) + ": wrong rows (" +
                                std::to_string(got[r].size()) + " values, want " +
                                std::to_string(want.size()) + ")");
    for (int q = 0; q < n && failed[r].empty(); ++q)
      f.check(counts[r][q] == q, label + " rank " + std::to_string(r) + ": rank " +
                                     std::to_string(q) + " has " + std::to_string(counts[r][q]) +
                                     " rows");
  }
  f.ran();
}

}  // namespace
}  // namespace hvdc

int main() {
  using hvdc::DType;
  hvdc::Failures f;
  for (int n = 1; n <= 5; ++n) {
    hvdc::check_all_ops<float>(f, n, DType::kFloat32);
    hvdc::check_all_ops<double>(f, n, DType::kFloat64);
    hvdc::check_all_ops<uint8_t>(f, n, DType::kUInt8);
    hvdc::check_all_ops<int8_t>(f, n, DType::kInt8);
    hvdc::check_all_ops<int16_t>(f, n, DType::kInt16);
    hvdc::check_all_ops<int32_t>(f, n, DType::kInt32);
    hvdc::check_all_ops<int64_t>(f, n, DType::kInt64);
    hvdc::check_allgather(f, n);
  }
  return f.finish("test_reduce_ops");
}
